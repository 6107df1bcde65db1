//! The model store: DESIGN.md's rules 1–6 and 10 as plain Rust over ordered
//! maps, one process, on the simulated clock (the "database clock"). Every
//! call is atomic (the whole model sits behind one lock), so it is the
//! executable form of what an engine's transactions promise. The simulation
//! runs the real controller over it; the differential test
//! (`tests/differential/`) runs the same operations on it and on each engine
//! and compares what they answer.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use drover::backoff::Backoff;
use drover::store::{
    ClaimGate, Claimed, FencingToken, Lease, Outcome, ReclaimReport, Retention, RunOutcome,
    Session, SessionId, StoreError,
};
use tokio::sync::Notify;

use crate::log::{Log, What};

pub(crate) const PROCESS: &str = "sim";

/// The reason an operator's park gives (the item's last error).
pub(crate) const PARK_REASON: &str = "parked by the operator";

/// A completion's result in the log when an earlier try recorded it: the
/// store answers `Ok` and changes nothing.
pub(crate) const RECORDED: &str = "recorded already";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Pending,
    Running,
    Parked,
    Idle,
}

/// Enqueues that arrived while the item ran.
#[derive(Debug, Clone, Copy)]
struct Dirty {
    since: Duration,
    ready_at: Duration,
    priority: i32,
}

#[derive(Debug, Clone)]
struct Held {
    session: i64,
    token: i64,
    dirty: Option<Dirty>,
}

#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub state: State,
    pub priority: i32,
    ready_at: Duration,
    /// When it last became pending from idle or parked (retention's fallback
    /// when no run of it has ended).
    pub(crate) enqueued_at: Duration,
    /// When its last run ended (with any outcome, or handed back): what
    /// retention judges an idle key's age by.
    pub(crate) last_ended_at: Option<Duration>,
    /// Set while a failure's backoff holds the item back.
    backoff_until: Option<Duration>,
    pub failures: u32,
    /// The last failure's error, or an operator's reason for parking.
    pub last_error: Option<String>,
    /// When the item was made (a delete forgets it): the engines' row id,
    /// which orders keys ready at the same time (FIFO among equals).
    seq: u64,
    held: Option<Held>,
}

#[allow(dead_code)] // what the differential test reads; the simulation does not
impl Item {
    /// Whether it was enqueued while running.
    pub(crate) fn dirty(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.dirty.is_some())
    }

    /// The running lease's session and fencing token.
    pub(crate) fn lease(&self) -> Option<(i64, i64)> {
        self.held.as_ref().map(|h| (h.session, h.token))
    }

    /// Whether a pending item is ready to be claimed at `now`.
    pub(crate) fn ready_by(&self, now: Duration) -> bool {
        self.state == State::Pending && self.ready_at <= now
    }

    /// Whether a pending item is still inside a failure's backoff at `now`
    /// (the engines show it as `backoff`).
    pub(crate) fn backing_off(&self, now: Duration) -> bool {
        self.state == State::Pending && self.backoff_until.is_some_and(|b| b > now)
    }
}

/// One history row: a run's end or an operator's action (DESIGN.md's
/// "history"); pause and resume have the key `""`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub key: String,
    pub outcome: RunOutcome,
    /// The run's fencing token; `None` for an operator's action.
    pub token: Option<i64>,
    /// When it was written (the run ended, the operator acted), on the
    /// database clock: what retention judges its age by.
    pub at: Duration,
}

#[derive(Debug, Clone)]
struct Sess {
    ttl: Duration,
    deadline: Duration,
}

/// The model's state.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) log: Log,
    pub items: BTreeMap<String, Item>,
    sessions: BTreeMap<i64, Sess>,
    next_session: i64,
    next_token: i64,
    /// The session each token was handed to: a retry is answered as
    /// written only under the session its run was recorded for.
    holders: BTreeMap<i64, i64>,
    next_seq: u64,
    pub paused: bool,
    pub concurrency: Option<u32>,
    /// The rate limit: runs per second and burst.
    rate: Option<(f64, u32)>,
    /// The rate bucket's tokens, as of when (`None`: full).
    bucket: Option<(f64, Duration)>,
    backoff: Backoff,
    pub wake: Arc<Notify>,
    /// The history, oldest first.
    pub history: Vec<Row>,
    /// How much faster the database clock runs than the log's (the workers').
    drift: f64,
    /// How long runs and idle keys are kept ([`retention`](crate::retention)).
    pub retention: Retention,
}

/// Simulated time as the database's timestamps.
pub(crate) fn stamp(at: Duration) -> DateTime<Utc> {
    let epoch = DateTime::<Utc>::from_timestamp(1_780_000_000, 0).expect("in range");
    epoch + chrono::Duration::from_std(at).expect("in range")
}

impl Model {
    pub(crate) fn new(log: Log, backoff: Backoff) -> Self {
        Self {
            log,
            items: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
            next_token: 1,
            holders: BTreeMap::new(),
            next_seq: 0,
            paused: false,
            concurrency: None,
            rate: None,
            bucket: None,
            backoff,
            wake: Arc::new(Notify::new()),
            history: Vec::new(),
            drift: 0.0,
            retention: Retention::default(),
        }
    }

    /// Makes the database clock run `drift` faster than the workers' (0.01:
    /// 1 % fast; negative: slow).
    pub(crate) fn set_drift(&mut self, drift: f64) {
        self.drift = drift;
    }

    /// The model's clock: the database clock.
    pub(crate) fn now(&self) -> Duration {
        let true_time = self.log.now();
        if self.drift == 0.0 {
            true_time
        } else {
            true_time.mul_f64(1.0 + self.drift)
        }
    }

    fn live(&self, session: i64) -> Result<&Sess, StoreError> {
        match self.sessions.get(&session) {
            Some(s) if s.deadline > self.now() => Ok(s),
            _ => Err(StoreError::SessionExpired {
                session: SessionId(session),
            }),
        }
    }

    pub(crate) fn session_start(&mut self, worker: u32, ttl: Duration) -> Session {
        let id = self.next_session;
        self.next_session += 1;
        let deadline = self.now() + ttl;
        self.sessions.insert(id, Sess { ttl, deadline });
        self.log.push(What::SessionStart {
            worker,
            session: id,
            deadline,
        });
        Session {
            id: SessionId(id),
            component: "sim".into(),
            ttl,
            deadline: stamp(deadline),
        }
    }

    /// Rule 6: renewed to now + ttl unless the deadline has passed (decided
    /// here, atomically with any reclaim).
    pub(crate) fn session_heartbeat(&mut self, session: i64) -> Result<DateTime<Utc>, StoreError> {
        let now = self.now();
        let result = self.live(session).map(|s| s.ttl);
        let (answer, word) = match result {
            Ok(ttl) => {
                let deadline = now + ttl;
                self.sessions.get_mut(&session).expect("live").deadline = deadline;
                (Ok(stamp(deadline)), "renewed")
            }
            Err(e) => (Err(e), "expired"),
        };
        self.log.push(What::Heartbeat {
            session,
            result: word,
        });
        answer
    }

    /// Ends a session, its leases pending again at once (no failure counted).
    pub(crate) fn session_close(&mut self, session: i64) -> u64 {
        self.sessions.remove(&session);
        let mut released = 0;
        let at = self.now();
        for (key, item) in &mut self.items {
            if let Some(held) = item.held.as_ref().filter(|h| h.session == session) {
                self.history.push(Row {
                    key: key.clone(),
                    outcome: RunOutcome::Canceled,
                    token: Some(held.token),
                    at,
                });
                let now = self.log.now();
                requeue(item, now);
                item.last_ended_at = Some(at);
                released += 1;
            }
        }
        self.log.push(What::SessionClose { session, released });
        if released > 0 {
            self.wake.notify_waiters();
        }
        released
    }

    /// Rule 6: every session past its deadline is deleted and its leases are
    /// pending again (an `expired` run each).
    pub(crate) fn session_reclaim(&mut self) -> ReclaimReport {
        let now = self.now();
        let expired: Vec<i64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        let mut report = ReclaimReport::default();
        for session in expired {
            self.sessions.remove(&session);
            let mut keys = Vec::new();
            for (key, item) in &mut self.items {
                if let Some(held) = item.held.as_ref().filter(|h| h.session == session) {
                    keys.push((key.clone(), held.token));
                    self.history.push(Row {
                        key: key.clone(),
                        outcome: RunOutcome::Expired,
                        token: Some(held.token),
                        at: now,
                    });
                    requeue(item, now);
                    item.last_ended_at = Some(now);
                }
            }
            report.sessions += 1;
            report.leases += keys.len() as u64;
            self.log.push(What::Reclaim { session, keys });
        }
        if report.leases > 0 {
            self.wake.notify_waiters();
        }
        report
    }

    /// Rule 2: coalesced into a pending item (earliest ready time wins, never
    /// before its backoff), a dirty mark on a running one, pending otherwise.
    pub(crate) fn enqueue(&mut self, key: &str, after: Duration, priority: i32) {
        self.enqueue_with(key, after, priority, false);
    }

    /// [`enqueue`](Self::enqueue), which with `bypass_backoff` may cut a
    /// pending item's backoff short (clearing it).
    pub(crate) fn enqueue_with(
        &mut self,
        key: &str,
        after: Duration,
        priority: i32,
        bypass_backoff: bool,
    ) {
        let now = self.now();
        let ready = now + after;
        let seq = self.next_seq;
        self.next_seq += 1;
        let item = self.items.entry(key.to_owned()).or_insert(Item {
            state: State::Idle,
            priority,
            ready_at: ready,
            enqueued_at: now,
            last_ended_at: None,
            backoff_until: None,
            failures: 0,
            last_error: None,
            seq,
            held: None,
        });
        let word = match item.state {
            State::Pending => {
                let floor = match item.backoff_until {
                    Some(until) if !bypass_backoff => until.max(ready),
                    _ => ready,
                };
                if bypass_backoff {
                    item.backoff_until = None;
                }
                item.ready_at = item.ready_at.min(floor);
                item.priority = item.priority.max(priority);
                "coalesced"
            }
            State::Running => {
                let held = item.held.as_mut().expect("running items are held");
                held.dirty = Some(match held.dirty {
                    Some(d) => Dirty {
                        since: d.since,
                        ready_at: d.ready_at.min(ready),
                        priority: d.priority.max(priority),
                    },
                    None => Dirty {
                        since: now,
                        ready_at: ready,
                        priority,
                    },
                });
                "dirty"
            }
            State::Parked | State::Idle => {
                item.state = State::Pending;
                item.ready_at = ready;
                item.priority = priority;
                item.enqueued_at = now;
                "pending"
            }
        };
        self.log.push(What::Enqueue {
            key: key.to_owned(),
            after,
            state: word,
        });
        self.wake.notify_waiters();
    }

    fn running(&self) -> u32 {
        self.items
            .values()
            .filter(|i| i.state == State::Running)
            .count() as u32
    }

    /// Rules 1, 7 and 10: the ready keys by priority, ready time, FIFO, up to
    /// `max` and the concurrency limit's free slots; nothing while paused.
    pub(crate) fn lease_claim(
        &mut self,
        worker: u32,
        session: i64,
        max: u32,
    ) -> Result<Claimed, StoreError> {
        self.live(session)?;
        let now = self.now();
        let mut gate = ClaimGate::default();
        if self.paused {
            gate.paused = true;
            return Ok(Claimed {
                leases: vec![],
                gate,
            });
        }
        let mut room = max;
        if let Some(limit) = self.concurrency {
            let free = limit.saturating_sub(self.running());
            if free < room {
                room = free;
                gate.concurrency_limited = true;
            }
        }
        let tokens = self.tokens(now);
        let mut by_tokens = false;
        if let Some(tokens) = tokens {
            let whole = whole(tokens);
            if whole < room {
                room = whole;
                by_tokens = true;
            }
        }
        let mut ready: Vec<(&String, &Item)> = self
            .items
            .iter()
            .filter(|(_, i)| i.state == State::Pending && i.ready_at <= now)
            .collect();
        ready.sort_by_key(|(_, i)| (-i.priority, i.ready_at, i.seq));
        let keys: Vec<String> = ready
            .into_iter()
            .take(room as usize)
            .map(|(k, _)| k.clone())
            .collect();
        let leases = keys
            .into_iter()
            .map(|key| self.take(worker, session, key, now))
            .collect::<Vec<_>>();
        if let (Some(tokens), Some((per_s, _))) = (tokens, self.rate) {
            let taken = leases.len() as u32;
            let left = tokens - f64::from(taken);
            if taken > 0 {
                self.bucket = Some((left, now));
            }
            if by_tokens && taken == room {
                let wait = ((1.0 - left).max(0.0) / per_s).min(3600.0);
                gate.next_token_in =
                    Some(Duration::from_secs_f64(wait).max(Duration::from_millis(1)));
            }
        }
        Ok(Claimed { leases, gate })
    }

    /// The rate bucket's tokens at `now` (`None`: no rate limit).
    fn tokens(&self, now: Duration) -> Option<f64> {
        self.rate.map(|(per_s, burst)| match self.bucket {
            None => f64::from(burst),
            Some((tokens, at)) => {
                let elapsed = (now - at).as_millis() as f64 / 1000.0;
                (tokens + elapsed * per_s).min(f64::from(burst))
            }
        })
    }

    /// Hands `key`'s item (pending or idle) to `session` under a new
    /// fencing token.
    fn take(&mut self, worker: u32, session: i64, key: String, now: Duration) -> Lease {
        let token = self.next_token;
        self.next_token += 1;
        self.holders.insert(token, session);
        let item = self.items.get_mut(&key).expect("taken items exist");
        item.state = State::Running;
        item.backoff_until = None;
        item.held = Some(Held {
            session,
            token,
            dirty: None,
        });
        let lease = Lease {
            session: SessionId(session),
            process: PROCESS.into(),
            key: key.clone(),
            token: FencingToken(token),
            attempt: item.failures + 1,
            priority: item.priority,
            enqueued_at: stamp(item.enqueued_at),
            started_at: stamp(now),
            trace_links: None,
        };
        self.log.push(What::Claim {
            worker,
            session,
            key,
            token,
        });
        lease
    }

    /// Leases one key the caller chose (the query-driven loops' way in):
    /// refused like a claim when the process is paused, at its concurrency
    /// limit or out of rate tokens (the fleet controls are asked first);
    /// then refused when the key is running, parked, or not ready (its
    /// backoff or delay); otherwise taken, a new key made (priority 0) and
    /// an idle one taken like a new one (pending since now).
    #[allow(dead_code)] // the differential test's, not the simulation's
    pub(crate) fn lease_lock(
        &mut self,
        worker: u32,
        session: i64,
        key: &str,
    ) -> Result<Lease, StoreError> {
        self.live(session)?;
        let now = self.now();
        let held = |why| {
            Err(StoreError::Held {
                process: PROCESS.into(),
                why,
            })
        };
        if self.paused {
            return held("paused");
        }
        if self
            .concurrency
            .is_some_and(|limit| self.running() >= limit)
        {
            return held("at its concurrency limit");
        }
        let tokens = self.tokens(now);
        if tokens.is_some_and(|t| whole(t) == 0) {
            return held("out of rate-limit tokens");
        }
        let (process, k) = (PROCESS.to_owned(), key.to_owned());
        match self.items.get(key) {
            Some(i) if i.state == State::Running => {
                return Err(StoreError::AlreadyLeased { process, key: k });
            }
            Some(i) if i.state == State::Parked => {
                return Err(StoreError::Parked { process, key: k });
            }
            Some(i) if i.state == State::Pending && (i.ready_at > now || i.backing_off(now)) => {
                let until = i.backoff_until.unwrap_or(i.ready_at).max(i.ready_at);
                return Err(StoreError::InBackoff {
                    process,
                    key: k,
                    until: stamp(until),
                });
            }
            _ => {}
        }
        let seq = self.next_seq;
        let item = self.items.entry(k.clone()).or_insert_with(|| Item {
            state: State::Idle,
            priority: 0,
            ready_at: now,
            enqueued_at: now,
            last_ended_at: None,
            backoff_until: None,
            failures: 0,
            last_error: None,
            seq,
            held: None,
        });
        if item.seq == seq {
            self.next_seq += 1;
        }
        if item.state == State::Idle {
            item.enqueued_at = now;
        }
        let lease = self.take(worker, session, k, now);
        if let Some(tokens) = tokens {
            self.bucket = Some((tokens - 1.0, now));
        }
        Ok(lease)
    }

    /// Rule 1's fencing: the lease must be the item's current one, under a
    /// live session; a refusal changes nothing.
    fn check(&self, lease: &Lease) -> Result<(), StoreError> {
        self.live(lease.session.0)?;
        let current = self
            .items
            .get(&lease.key)
            .and_then(|i| i.held.as_ref())
            .is_some_and(|h| h.token == lease.token.0 && h.session == lease.session.0);
        if current {
            Ok(())
        } else {
            Err(StoreError::LeaseLost {
                process: PROCESS.into(),
                key: lease.key.clone(),
                token: lease.token,
            })
        }
    }

    /// A batch of completions, each as [`complete`](Self::complete) alone
    /// (one completion is a batch of one), except that a lease whose token
    /// the batch settled at another position stays refused (a repeat within
    /// one batch is the caller's mistake, not a retry).
    pub(crate) fn lease_complete_batch<'a>(
        &mut self,
        batch: impl IntoIterator<Item = (&'a Lease, &'a Outcome)>,
    ) -> Vec<Result<(), StoreError>> {
        let mut settled = HashSet::new();
        batch
            .into_iter()
            .map(|(lease, outcome)| {
                let retry = !settled.contains(&lease.token.0);
                let (result, settles) = self.complete(lease, outcome, retry);
                if settles {
                    settled.insert(lease.token.0);
                }
                result
            })
            .collect()
    }

    /// Rules 4 and 5, with rule 2's dirty re-run; when `retry`, a refused
    /// completion whose outcome is recorded under its token and session
    /// already (an earlier try's, its answer lost) is answered `Ok` and
    /// changes nothing.
    fn complete(
        &mut self,
        lease: &Lease,
        outcome: &Outcome,
        retry: bool,
    ) -> (Result<(), StoreError>, bool) {
        let checked = self.check(lease);
        let recorded = checked.is_err()
            && retry
            && self.holders.get(&lease.token.0) == Some(&lease.session.0)
            && self.history.iter().any(|row| {
                row.key == lease.key
                    && row.token == Some(lease.token.0)
                    && row.outcome == RunOutcome::of(outcome)
            });
        let word = match &checked {
            Ok(()) => {
                let now = self.now();
                let backoff = self.backoff;
                let item = self.items.get_mut(&lease.key).expect("checked");
                settle(item, now, outcome, &backoff);
                item.last_ended_at = Some(now);
                self.history.push(Row {
                    key: lease.key.clone(),
                    outcome: RunOutcome::of(outcome),
                    token: Some(lease.token.0),
                    at: now,
                });
                match item.state {
                    State::Pending => "pending",
                    State::Parked => "parked",
                    State::Idle => "idle",
                    State::Running => unreachable!("settled"),
                }
            }
            Err(_) if recorded => RECORDED,
            Err(StoreError::SessionExpired { .. }) => "refused: session expired",
            Err(_) => "refused: lease lost",
        };
        self.log.push(What::Complete {
            session: lease.session.0,
            key: lease.key.clone(),
            token: lease.token.0,
            outcome: outcome.name(),
            result: word,
        });
        if recorded {
            return (Ok(()), false);
        }
        let settles = checked.is_ok();
        if settles {
            self.wake.notify_waiters();
        }
        (checked, settles)
    }

    pub(crate) fn lease_release(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let checked = self.check(lease);
        if checked.is_ok() {
            let now = self.now();
            let item = self.items.get_mut(&lease.key).expect("checked");
            requeue(item, now);
            item.last_ended_at = Some(now);
            self.history.push(Row {
                key: lease.key.clone(),
                outcome: RunOutcome::Canceled,
                token: Some(lease.token.0),
                at: now,
            });
            self.wake.notify_waiters();
        }
        self.log.push(What::Release {
            key: lease.key.clone(),
            token: lease.token.0,
            result: if checked.is_ok() {
                "pending"
            } else {
                "refused"
            },
        });
        checked
    }

    /// Pauses or resumes the process; a change is a history row (key `""`).
    pub(crate) fn set_paused(&mut self, paused: bool) {
        if self.paused != paused {
            let at = self.now();
            self.history.push(Row {
                key: String::new(),
                outcome: if paused {
                    RunOutcome::Paused
                } else {
                    RunOutcome::Resumed
                },
                token: None,
                at,
            });
        }
        self.paused = paused;
        self.log
            .push(if paused { What::Pause } else { What::Resume });
        if !paused {
            self.wake.notify_waiters();
        }
    }

    /// Sets or removes the rate limit (runs per second, burst); the bucket
    /// starts full again.
    #[allow(dead_code)] // the differential test's, not the simulation's
    pub(crate) fn set_rate(&mut self, rate: Option<(f64, u32)>) {
        self.rate = rate;
        self.bucket = None;
        self.wake.notify_waiters();
    }

    pub(crate) fn set_limit(&mut self, limit: Option<u32>) {
        self.concurrency = limit;
        self.log.push(What::Limit(limit));
        self.wake.notify_waiters();
    }

    /// An operator's retry, park or delete: refused on a running item. A
    /// retry makes the item pending now (a pending one keeps an earlier ready
    /// time), its backoff cut short and its failures kept; a park stops it
    /// with [`PARK_REASON`]; each is a history row. What happened, in words.
    pub(crate) fn admin(&mut self, action: &'static str, key: &str) -> &'static str {
        let now = self.now();
        let result = match self.items.get_mut(key) {
            None => "no such key",
            Some(item) if item.state == State::Running => "refused: running",
            Some(item) => {
                let outcome = match action {
                    "retry" => {
                        if item.state != State::Pending {
                            item.enqueued_at = now;
                        }
                        item.ready_at = if item.state == State::Pending {
                            item.ready_at.min(now)
                        } else {
                            now
                        };
                        item.state = State::Pending;
                        item.backoff_until = None;
                        RunOutcome::Retried
                    }
                    "park" => {
                        item.state = State::Parked;
                        item.backoff_until = None;
                        item.last_error = Some(PARK_REASON.to_owned());
                        RunOutcome::Parked
                    }
                    _ => {
                        self.items.remove(key);
                        RunOutcome::Deleted
                    }
                };
                self.history.push(Row {
                    key: key.to_owned(),
                    outcome,
                    token: None,
                    at: now,
                });
                "done"
            }
        };
        self.log.push(What::Admin {
            action,
            key: key.to_owned(),
            result,
        });
        self.wake.notify_waiters();
        result
    }

    /// Whether every key has converged: nothing pending, nothing running.
    pub(crate) fn converged(&self) -> bool {
        self.items
            .values()
            .all(|i| matches!(i.state, State::Idle | State::Parked))
    }
}

/// The whole tokens of a rate bucket: they start runs (a hair under one
/// counts).
fn whole(tokens: f64) -> u32 {
    (tokens + 1e-9).floor().max(0.0) as u32
}

/// A lease handed back without an outcome: pending at once, a dirty mark
/// folded in, the failure count kept.
fn requeue(item: &mut Item, now: Duration) {
    let held = item.held.take().expect("running items are held");
    item.state = State::Pending;
    item.ready_at = now;
    if let Some(d) = held.dirty {
        item.priority = item.priority.max(d.priority);
    }
}

fn settle(item: &mut Item, now: Duration, outcome: &Outcome, backoff: &Backoff) {
    let held = item.held.take().expect("checked");
    let dirty = held.dirty;
    item.last_error = match outcome {
        Outcome::Transient(e) | Outcome::Permanent(e) => Some(e.clone()),
        Outcome::Done | Outcome::RequeueAfter(_) => None,
    };
    // Where a dirty re-run takes the item: the earliest ready time and the
    // highest priority asked for.
    let pending = |item: &mut Item, ready_at: Duration| {
        item.state = State::Pending;
        item.ready_at = match dirty {
            Some(d) => ready_at.min(d.ready_at),
            None => ready_at,
        };
        if let Some(d) = dirty {
            item.priority = item.priority.max(d.priority);
            item.enqueued_at = d.since;
        }
    };
    match outcome {
        Outcome::Done => {
            item.failures = 0;
            match dirty {
                Some(d) => pending(item, d.ready_at),
                None => item.state = State::Idle,
            }
        }
        Outcome::RequeueAfter(delay) => {
            item.failures = 0;
            pending(item, now + *delay);
            if dirty.is_none() {
                // The handler's own enqueue: pending since now.
                item.enqueued_at = now;
            }
        }
        Outcome::Transient(_) => {
            item.failures += 1;
            let until = now + backoff.delay(item.failures);
            pending(item, until);
            item.ready_at = until;
            item.backoff_until = Some(until);
        }
        Outcome::Permanent(_) => {
            item.failures += 1;
            match dirty {
                Some(d) => pending(item, d.ready_at),
                None => item.state = State::Parked,
            }
        }
    }
}
