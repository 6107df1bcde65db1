//! Waiting claims (long-polls) share one wake-up per process per server, and
//! are capped (DESIGN.md rule 13).
//!
//! A claim that finds nothing waits in its process's [`Line`]. One task per
//! process with waiters (the line's dispatcher) listens for the process's
//! wake-ups (an enqueue, a retry, a dirty completion, a resume: the store's
//! signal, fed on PostgreSQL by `NOTIFY` from every node) and, every poll
//! interval, for work that became ready on its own (a backoff or a delay that
//! ran out); each time, it gives the turn to one waiter, which claims. A
//! waiter that got a full batch passes the turn on at once, since more may be
//! ready; one that got less ends the chain. So a thousand idle long-polls on
//! a process cost one claim per poll interval, not a thousand, and an enqueue
//! of one key wakes one waiter, not all of them.
//!
//! A claim the process's rate limit held back waits in the line too: it
//! tells the line when the next token comes ([`Place::token_in`]), and the
//! dispatcher gives one turn then. So a rate-limited process's waiting
//! claims cost one claim per token, not one each per token (200 of them on a
//! process limited to 2 runs a second sent 400 claims a second, each
//! claiming on its own timer).
//!
//! Over [`MAX_PER_SESSION`] waiting claims of one session, over half the
//! server's `max_waiting_claims` for one token (when the server has more than
//! one worker token), or over `max_waiting_claims`, a claim that would wait is answered
//! at once with 429 `too_many_waiting_claims`. The token's share keeps one
//! token, however many sessions it starts, from filling the server's cap and
//! turning every other token's waiting claims away.
//!
//! Waiting listens for wake-ups (on PostgreSQL, one of the store's 1,024
//! `LISTEN` channels per process) freely for processes the database holds,
//! but for at most [`MAX_UNKNOWN_HEARD`] names it does not hold at once: a
//! worker may wait for a process nothing was enqueued to yet, and such a
//! name cannot be told from a made-up one, so without the bound a caller's
//! long-polls on a thousand made-up names held every channel while they
//! waited, and a real process's new waiter heard other nodes only at its
//! poll. Past the bound a claim on an unknown name waits by the poll alone
//! (its [`Ear`] is `None`); its line starts listening once a claim comes
//! for it that may.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use crate::store::{SessionId, Store};

/// The most claims of one session that may wait at once on a server. A
/// worker claims from one loop per process it works on; the rest is room for
/// a claim whose answer is still on its way.
pub(crate) const MAX_PER_SESSION: usize = 16;

/// The most process names the database does not hold that waiting claims
/// on one server listen for at once. Real processes a worker waits for
/// before anything is enqueued to them fit (and those past it are heard at
/// their poll); the store's 1,024 channels stay for the processes that
/// exist.
pub(crate) const MAX_UNKNOWN_HEARD: usize = 64;

/// The claims of one process waiting on this server.
#[derive(Debug, Default)]
struct Line {
    /// Given to one waiter at a time.
    turn: Notify,
    /// How many wait in it; changed under [`Waiting`]'s lock.
    waiters: AtomicUsize,
    /// Fired when the last waiter leaves, so the dispatcher ends at once
    /// and lets go of the process's signal (and, on PostgreSQL, of the
    /// store's `LISTEN` channel for it), not a poll interval later.
    emptied: Notify,
    /// When the process's rate limit gives its next token, as the last
    /// claim it held back heard: the dispatcher gives a turn then, if that
    /// comes before its poll.
    token_at: Mutex<Option<Instant>>,
    /// Fired when `token_at` comes sooner, so the dispatcher wakes then.
    token_sooner: Notify,
    /// Whether the dispatcher listens for the process's wake-ups.
    listening: std::sync::atomic::AtomicBool,
    /// Leave to listen, brought by a claim that may to a line that did not
    /// (see [`Ear`]); fired through `listen_now`.
    ear: Mutex<Option<Ear>>,
    listen_now: Notify,
}

/// Leave to listen for a process's wake-ups (hold the store's signal, and on
/// PostgreSQL a `LISTEN` channel): always for a process the database holds,
/// and for one of at most [`MAX_UNKNOWN_HEARD`] unknown names at once
/// otherwise. Every claim and line listening for an unknown name holds one;
/// the name's slot is free once the last is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Ear {
    /// The unknown name's room, held for as long as the ear (`None` for a
    /// process the database holds).
    _room: Option<Arc<UnknownSlot>>,
}

/// One unknown name's room among the [`MAX_UNKNOWN_HEARD`].
#[derive(Debug)]
struct UnknownSlot {
    waiting: Weak<Waiting>,
    process: String,
}

impl Drop for UnknownSlot {
    fn drop(&mut self) {
        if let Some(waiting) = self.waiting.upgrade() {
            let mut counts = waiting.lock();
            // Only this slot's entry: a claim may have made the name a new
            // one since this one's last holder let go.
            if counts
                .unknown
                .get(&self.process)
                .is_some_and(|slot| std::ptr::eq(slot.as_ptr(), self))
            {
                counts.unknown.remove(&self.process);
            }
        }
    }
}

/// Every line of this server, and the counts its caps are kept by.
#[derive(Debug)]
pub(crate) struct Waiting {
    counts: Mutex<Counts>,
    max_total: usize,
    /// The most one token's claims may take (`None`: no share, one caller).
    max_per_owner: Option<usize>,
}

#[derive(Debug, Default)]
struct Counts {
    lines: HashMap<String, Arc<Line>>,
    sessions: HashMap<SessionId, usize>,
    /// By the fingerprint of the token whose session waits.
    owners: HashMap<String, usize>,
    total: usize,
    /// The unknown names listened for, at most [`MAX_UNKNOWN_HEARD`].
    unknown: HashMap<String, Weak<UnknownSlot>>,
}

impl Waiting {
    /// No claim waits yet; at most `max_total` will at once, and at most
    /// half of them one token's when `shared` (the server has more than one
    /// worker token).
    pub(crate) fn new(max_total: usize, shared: bool) -> Self {
        Self {
            counts: Mutex::default(),
            max_total,
            max_per_owner: shared.then(|| max_total.div_ceil(2)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leave for a claim on `process` to listen for its wake-ups: always if
    /// the database holds it (`held`); for an unknown name while fewer than
    /// [`MAX_UNKNOWN_HEARD`] others are listened for (claims on one name
    /// share its slot); `None` otherwise, and the claim waits by its poll.
    pub(crate) fn ear(self: &Arc<Self>, process: &str, held: bool) -> Option<Ear> {
        if held {
            return Some(Ear { _room: None });
        }
        let mut counts = self.lock();
        if let Some(slot) = counts.unknown.get(process).and_then(Weak::upgrade) {
            return Some(Ear { _room: Some(slot) });
        }
        counts.unknown.retain(|_, slot| slot.strong_count() > 0);
        if counts.unknown.len() >= MAX_UNKNOWN_HEARD {
            return None;
        }
        let slot = Arc::new(UnknownSlot {
            waiting: Arc::downgrade(self),
            process: process.to_owned(),
        });
        counts
            .unknown
            .insert(process.to_owned(), Arc::downgrade(&slot));
        Some(Ear { _room: Some(slot) })
    }

    /// Puts a claim of `session`, started by the token `owner` (its
    /// fingerprint; `None` on an open server), in `process`'s line, starting
    /// the line's dispatcher (listening already when this returns, if the
    /// claim has an `ear`) if it has none; 429 over a cap. The claim waits
    /// until its [`Place`] drops.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enter(
        self: &Arc<Self>,
        store: &Store,
        process: &str,
        session: SessionId,
        owner: Option<&str>,
        ear: Option<&Ear>,
        poll: Duration,
        shutdown: &CancellationToken,
    ) -> Result<Place, ApiError> {
        let mut counts = self.lock();
        if counts.total >= self.max_total {
            return Err(ApiError::TooManyWaiting(format!(
                "this server already holds {} waiting claims, its limit",
                self.max_total
            )));
        }
        let of_session = counts.sessions.get(&session).copied().unwrap_or(0);
        if of_session >= MAX_PER_SESSION {
            return Err(ApiError::TooManyWaiting(format!(
                "session {session} already has {MAX_PER_SESSION} claims waiting, its limit"
            )));
        }
        let owner = owner.filter(|_| self.max_per_owner.is_some());
        if let (Some(owner), Some(max)) = (owner, self.max_per_owner) {
            if counts.owners.get(owner).copied().unwrap_or(0) >= max {
                return Err(ApiError::TooManyWaiting(format!(
                    "this token's sessions already have {max} claims waiting, its share of \
                     the server's {}",
                    self.max_total
                )));
            }
            *counts.owners.entry(owner.to_owned()).or_default() += 1;
        }
        counts.sessions.insert(session, of_session + 1);
        counts.total += 1;
        let line = match counts.lines.get(process) {
            Some(line) => {
                if let Some(ear) = ear.filter(|_| !line.listening.load(Ordering::Relaxed)) {
                    // Never replaced here: dropping an ear may free its
                    // name's room, which takes this lock.
                    line.ear().get_or_insert_with(|| ear.clone());
                    line.listen_now.notify_one();
                }
                Arc::clone(line)
            }
            None => {
                let line = Arc::new(Line::default());
                counts.lines.insert(process.to_owned(), Arc::clone(&line));
                self.dispatch(store, process, &line, ear.cloned(), poll, shutdown);
                line
            }
        };
        line.waiters.fetch_add(1, Ordering::Relaxed);
        Ok(Place {
            waiting: Arc::clone(self),
            line,
            session,
            owner: owner.map(str::to_owned),
        })
    }

    /// Starts `line`'s dispatcher, listening for `process`'s wake-ups (with
    /// an `ear`) before this returns, so none sent after a waiter entered is
    /// missed.
    fn dispatch(
        self: &Arc<Self>,
        store: &Store,
        process: &str,
        line: &Arc<Line>,
        ear: Option<Ear>,
        poll: Duration,
        shutdown: &CancellationToken,
    ) {
        let mut heard = ear.map(|ear| Heard::new(store, process, &line.listening, ear));
        let (waiting, line, process) = (Arc::clone(self), Arc::clone(line), process.to_owned());
        let (shutdown, store) = (shutdown.clone(), store.clone());
        tokio::spawn(async move {
            let mut next_poll = Instant::now() + poll;
            loop {
                let token_at = *line.token_at();
                let until = token_at.map_or(next_poll, |at| at.min(next_poll));
                tokio::select! {
                    () = Heard::woke(heard.as_mut()) => {}
                    () = tokio::time::sleep_until(until) => {}
                    () = shutdown.cancelled() => return,
                    // Sleeps again, until the sooner token.
                    () = line.token_sooner.notified() => continue,
                    // A claim that may listen came to a line that did not.
                    () = line.listen_now.notified() => {
                        // Taken out first: its drop may take `Waiting`'s
                        // lock, which is taken before a line's.
                        let ear = line.ear().take();
                        if let Some(ear) = ear {
                            heard.get_or_insert_with(|| {
                                Heard::new(&store, &process, &line.listening, ear)
                            });
                        }
                        continue;
                    }
                    () = line.emptied.notified() => {
                        let mut counts = waiting.lock();
                        if line.waiters.load(Ordering::Relaxed) == 0 {
                            counts.lines.remove(&process);
                            return;
                        }
                        // A waiter came in since: nothing to claim for.
                        continue;
                    }
                }
                // A token due by now is what this turn claims.
                {
                    let mut token_at = line.token_at();
                    if token_at.is_some_and(|at| at <= Instant::now()) {
                        *token_at = None;
                    }
                }
                next_poll = Instant::now() + poll;
                // Listening again before the turn is given: a wake-up sent
                // while the waiter claims is not missed.
                if let Some(heard) = heard.as_mut() {
                    heard.again();
                }
                {
                    let mut counts = waiting.lock();
                    if line.waiters.load(Ordering::Relaxed) == 0 {
                        counts.lines.remove(&process);
                        return;
                    }
                }
                line.turn.notify_one();
            }
        });
    }
}

impl Line {
    fn token_at(&self) -> MutexGuard<'_, Option<Instant>> {
        self.token_at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ear(&self) -> MutexGuard<'_, Option<Ear>> {
        self.ear.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A dispatcher's hearing of its process's wake-ups: the store's signal,
/// held with the leave to hold it.
struct Heard {
    signal: Arc<Notify>,
    woke: std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>,
    _ear: Ear,
}

impl Heard {
    fn new(
        store: &Store,
        process: &str,
        listening: &std::sync::atomic::AtomicBool,
        ear: Ear,
    ) -> Self {
        let signal = store.subscribe(process);
        let mut woke = Box::pin(Arc::clone(&signal).notified_owned());
        woke.as_mut().enable();
        listening.store(true, Ordering::Relaxed);
        Self {
            signal,
            woke,
            _ear: ear,
        }
    }

    /// Waits for a wake-up, forever if not listening.
    async fn woke(heard: Option<&mut Self>) {
        match heard {
            Some(heard) => heard.woke.as_mut().await,
            None => std::future::pending().await,
        }
    }

    /// Listens for the next wake-up.
    fn again(&mut self) {
        self.woke = Box::pin(Arc::clone(&self.signal).notified_owned());
        self.woke.as_mut().enable();
    }
}

/// A claim's place in its process's line; leaving it (dropping) frees it.
#[derive(Debug)]
pub(crate) struct Place {
    waiting: Arc<Waiting>,
    line: Arc<Line>,
    session: SessionId,
    /// The token counted for this claim, if its share is kept.
    owner: Option<String>,
}

impl Place {
    /// Waits for this claim's turn to claim again.
    pub(crate) async fn turn(&self) {
        self.line.turn.notified().await;
    }

    /// Tells the line that the process's rate limit gives its next token
    /// in `next`: a waiter gets a turn then (one claim for the line, not
    /// one for each of its waiters).
    pub(crate) fn token_in(&self, next: Duration) {
        let at = Instant::now() + next;
        let mut token_at = self.line.token_at();
        if token_at.is_none_or(|known| at < known) {
            *token_at = Some(at);
            drop(token_at);
            self.line.token_sooner.notify_one();
        }
    }

    /// Gives the turn to the next waiter at once (this claim took a full
    /// batch, so more may be ready).
    pub(crate) fn pass_on(&self) {
        self.line.turn.notify_one();
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.waiting.lock();
        if self.line.waiters.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.line.emptied.notify_one();
        }
        counts.total -= 1;
        match counts.sessions.get(&self.session).copied() {
            Some(n) if n > 1 => {
                counts.sessions.insert(self.session, n - 1);
            }
            _ => {
                counts.sessions.remove(&self.session);
            }
        }
        if let Some(owner) = &self.owner {
            match counts.owners.get_mut(owner) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    counts.owners.remove(owner);
                }
            }
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::store::wakeup;

    /// A line whose last waiter left lets go of its process's signal at
    /// once, not at its next poll (an hour here): on PostgreSQL the signal
    /// holds one of the store's 1,024 `LISTEN` channels.
    #[tokio::test]
    async fn a_line_lets_go_of_its_signal_when_its_last_waiter_leaves() {
        let store = Store::connect("sqlite::memory:").await.expect("store");
        let waiting = Arc::new(Waiting::new(8, false));
        let process = "a-line-that-empties";
        let shutdown = CancellationToken::new();
        let hour = Duration::from_secs(3600);
        let ear = waiting.ear(process, true);
        let first = waiting
            .enter(
                &store,
                process,
                SessionId(1),
                None,
                ear.as_ref(),
                hour,
                &shutdown,
            )
            .expect("room");
        let second = waiting
            .enter(
                &store,
                process,
                SessionId(2),
                None,
                ear.as_ref(),
                hour,
                &shutdown,
            )
            .expect("room");
        drop(first);
        tokio::task::yield_now().await;
        assert!(wakeup::waited_on(process), "one waiter is left");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), async {
            while wakeup::waited_on(process) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the signal let go within 5 s, not at the hour's poll");
        assert!(waiting.lock().lines.is_empty());
        store.close().await;
    }

    /// Waits until `process`'s signal is held (`true`) or let go.
    async fn until_heard(process: &str, heard: bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while wakeup::waited_on(process) != heard {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{process} heard: {heard} within 5 s"));
    }

    /// Claims on names the database does not hold listen for at most
    /// `MAX_UNKNOWN_HEARD` of them at once (on PostgreSQL each would hold one
    /// of the store's 1,024 channels while it waits); past that they wait by
    /// the poll, and a process the database holds is always listened for. A
    /// name's room is free once its last claim leaves, and a line that did
    /// not listen starts when a claim comes that may.
    #[tokio::test]
    async fn unknown_names_are_listened_for_up_to_a_bound_and_held_processes_always() {
        let store = Store::connect("sqlite::memory:").await.expect("store");
        let waiting = Arc::new(Waiting::new(1_000, false));
        let shutdown = CancellationToken::new();
        let hour = Duration::from_secs(3600);
        let enter = |process: &str, ear: Option<&Ear>, session: i64| {
            waiting
                .enter(
                    &store,
                    process,
                    SessionId(session),
                    None,
                    ear,
                    hour,
                    &shutdown,
                )
                .expect("room")
        };
        let mut places = Vec::new();
        let mut ears = Vec::new();
        for i in 0..MAX_UNKNOWN_HEARD {
            let process = format!("unknown-bound-{i}");
            let ear = waiting.ear(&process, false);
            assert!(ear.is_some(), "room for unknown name {i}");
            places.push(enter(
                &process,
                ear.as_ref(),
                1 + i64::try_from(i).expect("small"),
            ));
            ears.push(ear);
        }
        for i in 0..MAX_UNKNOWN_HEARD {
            until_heard(&format!("unknown-bound-{i}"), true).await;
        }
        // A second claim on a name listened for shares its room.
        assert!(waiting.ear("unknown-bound-0", false).is_some());
        let past = "unknown-bound-past";
        assert!(
            waiting.ear(past, false).is_none(),
            "no room past {MAX_UNKNOWN_HEARD} unknown names"
        );
        let deaf = enter(past, None, 500);
        tokio::task::yield_now().await;
        assert!(
            !wakeup::waited_on(past),
            "a claim past the bound holds no signal"
        );
        assert!(
            waiting.ear("held-process", true).is_some(),
            "a process the database holds is always listened for"
        );
        // The first name's claim and ear leave: its room is free, and a
        // claim that may listen brings it to the line that did not.
        drop(places.remove(0));
        drop(ears.remove(0));
        until_heard("unknown-bound-0", false).await;
        let ear = waiting.ear(past, false);
        assert!(ear.is_some(), "the room let go is taken");
        let second = enter(past, ear.as_ref(), 501);
        until_heard(past, true).await;
        drop((deaf, second, ear));
        until_heard(past, false).await;
        store.close().await;
    }
}
