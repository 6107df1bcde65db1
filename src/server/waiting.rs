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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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

    /// Puts a claim of `session`, started by the token `owner` (its
    /// fingerprint; `None` on an open server), in `process`'s line, starting
    /// the line's dispatcher (listening already when this returns) if it has
    /// none; 429 over a cap. The claim waits until its [`Place`] drops.
    pub(crate) fn enter(
        self: &Arc<Self>,
        store: &Store,
        process: &str,
        session: SessionId,
        owner: Option<&str>,
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
            Some(line) => Arc::clone(line),
            None => {
                let line = Arc::new(Line::default());
                counts.lines.insert(process.to_owned(), Arc::clone(&line));
                self.dispatch(store, process, &line, poll, shutdown);
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

    /// Starts `line`'s dispatcher, listening for `process`'s wake-ups before
    /// this returns, so none sent after a waiter entered is missed.
    fn dispatch(
        self: &Arc<Self>,
        store: &Store,
        process: &str,
        line: &Arc<Line>,
        poll: Duration,
        shutdown: &CancellationToken,
    ) {
        let signal = store.subscribe(process);
        let mut woke = Box::pin(Arc::clone(&signal).notified_owned());
        woke.as_mut().enable();
        let (waiting, line, process) = (Arc::clone(self), Arc::clone(line), process.to_owned());
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut next_poll = Instant::now() + poll;
            loop {
                let token_at = *line.token_at();
                let until = token_at.map_or(next_poll, |at| at.min(next_poll));
                tokio::select! {
                    () = &mut woke => {}
                    () = tokio::time::sleep_until(until) => {}
                    () = shutdown.cancelled() => return,
                    // Sleeps again, until the sooner token.
                    () = line.token_sooner.notified() => continue,
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
                woke = Box::pin(Arc::clone(&signal).notified_owned());
                woke.as_mut().enable();
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
        let first = waiting
            .enter(&store, process, SessionId(1), None, hour, &shutdown)
            .expect("room");
        let second = waiting
            .enter(&store, process, SessionId(2), None, hour, &shutdown)
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
}
