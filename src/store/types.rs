//! The store's domain types: what operations return, never raw rows (a
//! process's settings, [`ProcessSettings`](super::ProcessSettings), are in
//! `settings.rs`, beside their change).

use std::fmt;
use std::time::Duration;

use super::trace::{TraceId, TraceLinks};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// A session's id. Ids are never reused, so a dead session's id never names a new
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SessionId(pub i64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A lease's fencing token: strictly increasing across every lease the database
/// ever hands out, so an older holder's token never matches a newer lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct FencingToken(pub i64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A live worker's registration, kept alive by heartbeats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Session {
    /// The session's id.
    pub id: SessionId,
    /// The component that started it ("persistence-agent", "drover work").
    pub component: String,
    /// How long the session lives without a heartbeat.
    pub ttl: Duration,
    /// When it expires unless renewed, on the database clock.
    pub deadline: DateTime<Utc>,
}

/// A running item's ownership by one session: proof that the holder, and nobody
/// else, may work on `(process, key)` until it completes, releases or loses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The session holding the lease.
    pub session: SessionId,
    /// The process the key belongs to.
    pub process: String,
    /// The key.
    pub key: String,
    /// The fencing token every completion is checked against.
    pub token: FencingToken,
    /// Which consecutive attempt this is: 1, or failures so far + 1.
    pub attempt: u32,
    /// The item's priority.
    pub priority: i32,
    /// When the enqueue that this run answers arrived (a requeue-after is
    /// one, made when the run that asked for it ended).
    pub enqueued_at: DateTime<Utc>,
    /// When the run started, on the database clock.
    pub started_at: DateTime<Utc>,
    /// The trace contexts of the enqueues this run absorbed (DESIGN.md rule
    /// 14), read by the claim itself when it asked for them
    /// ([`LeaseClaim::trace_links`](super::LeaseClaim::trace_links)): the
    /// run's span links to each. `None` when the claim did not ask (tracing
    /// off: nothing more was read) or the lease came another way
    /// (`lease_lock`); `None` or empty when no enqueue carried a context.
    #[serde(skip)]
    pub trace_links: Option<TraceLinks>,
}

/// What processing a key returned.
///
/// An error's text may be anything (a command's stderr, a library's message): it
/// is stored as [`clean_text`](super::clean_text) makes it — NUL replaced, cut
/// past [`MAX_TEXT_BYTES`](super::MAX_TEXT_BYTES) — so no text can make an
/// outcome unstorable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Converged: the failure count is reset and the item is idle, a known key
    /// with no pending work (or pending again if it was enqueued while running).
    Done,
    /// Converged for now, look again later: the failure count is reset and the item
    /// is pending at now + the delay (earlier if a dirty re-run asked for earlier).
    RequeueAfter(Duration),
    /// Failed, worth retrying: the failure count grows and the item is pending
    /// after the process's backoff. Errors the handler did not classify belong here.
    Transient(String),
    /// Failed, retrying will not help: the failure count grows and the item is
    /// parked with its error until an enqueue revives it (at once, if it was
    /// enqueued while running).
    Permanent(String),
}

impl Outcome {
    /// The outcome's name as metrics, the API and the history spell it:
    /// `done`, `requeue_after`, `transient` or `permanent`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::RequeueAfter(_) => "requeue_after",
            Self::Transient(_) => "transient",
            Self::Permanent(_) => "permanent",
        }
    }
}

/// An item's state as seen from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Waiting to run (now, or at its requested later time).
    Pending,
    /// Waiting to run again after a failure; its backoff has not ended yet.
    Backoff,
    /// Held by a lease.
    Running,
    /// Stopped after a permanent error until the next enqueue.
    Parked,
    /// Converged: a known key with no pending work, its last outcome kept. The
    /// next enqueue makes it pending; only a delete forgets it.
    Idle,
}

impl ItemState {
    /// The state's name as the CLI and the JSON output spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Backoff => "backoff",
            Self::Running => "running",
            Self::Parked => "parked",
            Self::Idle => "idle",
        }
    }

    /// Parses a state's name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Backoff,
            Self::Running,
            Self::Parked,
            Self::Idle,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

impl fmt::Display for ItemState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One durable item: the record of a known (process, key), pending, running,
/// parked or idle. A running item's current run is read from its lease fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// Its state.
    pub state: ItemState,
    /// Its priority (higher runs first).
    pub priority: i32,
    /// When a pending item may start; for others the last such time.
    pub ready_at: DateTime<Utc>,
    /// When the key became pending for its current (or next, or last) run:
    /// the enqueue that run answers (a requeue-after is one).
    pub enqueued_at: DateTime<Utc>,
    /// Consecutive failed attempts, transient or permanent; reset by a run that
    /// converges (done or requeue-after).
    pub failures: u32,
    /// The end of the current backoff, if any.
    pub backoff_until: Option<DateTime<Utc>>,
    /// The last failure's error.
    pub last_error: Option<String>,
    /// Whether it was enqueued while running (one more run follows).
    pub dirty: bool,
    /// The lease's session, while running.
    pub lease_session: Option<SessionId>,
    /// The lease's fencing token, while running.
    pub lease_token: Option<FencingToken>,
    /// When the current run started, while running.
    pub started_at: Option<DateTime<Utc>>,
    /// When the key was first enqueued (`None` if only ever locked by a
    /// query-driven loop).
    pub first_enqueued_at: Option<DateTime<Utc>>,
    /// When the key was last enqueued.
    pub last_enqueued_at: Option<DateTime<Utc>>,
    /// How many enqueues the key has had (coalesced ones included).
    pub enqueue_count: u64,
    /// How its last run ended (operator actions are not runs: see the history).
    pub last_outcome: Option<RunOutcome>,
    /// When its last run ended.
    pub last_ended_at: Option<DateTime<Utc>>,
}

/// How a run ended, or which operator action a history row records.
///
/// A run is one attempt at a key under one lease; it gets exactly one history
/// row, written when it ends. Operator actions (retry, park, delete) are rows
/// too, with the role that did them in [`Run::actor`]; so are pause and resume,
/// which act on the whole process: their rows have the key `""`, which no
/// real key can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// Converged: the item is idle (or pending again if enqueued while running).
    Done,
    /// Converged for now, look again later ([`Outcome::RequeueAfter`]).
    Requeued,
    /// Failed transiently: pending again after the process's backoff.
    Retry,
    /// Failed permanently: parked with its error (pending again at once if an
    /// enqueue arrived during the run). As an operator's action: parked by hand.
    Parked,
    /// Given back without an outcome (shutdown, cancellation): pending again.
    Canceled,
    /// Its session expired and the lease was reclaimed: pending again.
    Expired,
    /// An operator's "retry now" (backoff or park cut short).
    Retried,
    /// An operator forgot the key: its item was deleted (its runs stay until
    /// retention removes them).
    Deleted,
    /// An operator paused the whole process (a row with key `""`).
    Paused,
    /// An operator resumed the whole process (a row with key `""`).
    Resumed,
}

impl RunOutcome {
    /// Every outcome, in the order the documentation lists them.
    pub const ALL: [Self; 10] = [
        Self::Done,
        Self::Requeued,
        Self::Retry,
        Self::Parked,
        Self::Canceled,
        Self::Expired,
        Self::Retried,
        Self::Deleted,
        Self::Paused,
        Self::Resumed,
    ];

    /// The outcome's name as stored, printed and sent over the API.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Requeued => "requeued",
            Self::Retry => "retry",
            Self::Parked => "parked",
            Self::Canceled => "canceled",
            Self::Expired => "expired",
            Self::Retried => "retried",
            Self::Deleted => "deleted",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
        }
    }

    /// Parses a stored outcome name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The row a run with this outcome of the handler gets.
    #[must_use]
    pub fn of(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Done => Self::Done,
            Outcome::RequeueAfter(_) => Self::Requeued,
            Outcome::Transient(_) => Self::Retry,
            Outcome::Permanent(_) => Self::Parked,
        }
    }
}

impl fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One history row: a run that ended, or an operator's action. History is
/// append-only; only retention deletes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    /// Increasing id: the order rows were written in, and the page cursor.
    pub id: i64,
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// How the run ended, or which action an operator took.
    pub outcome: RunOutcome,
    /// Which consecutive attempt the run was (1 + the failed attempts before
    /// it); `None` for an operator's action.
    pub attempt: Option<u32>,
    /// The session that held the lease; `None` for an operator's action.
    pub session: Option<SessionId>,
    /// The lease's fencing token; `None` for an operator's action.
    pub token: Option<FencingToken>,
    /// When the key became pending for this run (the enqueue it answered).
    pub pending_since: Option<DateTime<Utc>>,
    /// When the run started, on the database clock.
    pub started_at: Option<DateTime<Utc>>,
    /// When the run ended (or the action was taken), on the database clock.
    pub ended_at: DateTime<Utc>,
    /// The error of a failed run, or an operator's reason for parking.
    pub error: Option<String>,
    /// The role that took an operator's action (`admin`, `cli`); `None` for a run.
    pub actor: Option<String>,
    /// The trace id of the run's span, when its worker traced it (see
    /// [`LeaseComplete::trace_id`](super::LeaseComplete::trace_id)).
    pub trace_id: Option<TraceId>,
}

impl Run {
    /// Whether this row is a run that failed (transiently or permanently),
    /// as opposed to a converged, given-back or reclaimed run or an action.
    #[must_use]
    pub fn failed(&self) -> bool {
        self.actor.is_none() && matches!(self.outcome, RunOutcome::Retry | RunOutcome::Parked)
    }

    /// How long the key waited between becoming pending and this run's start.
    #[must_use]
    pub fn queue_wait(&self) -> Option<Duration> {
        span(self.pending_since?, self.started_at?)
    }

    /// How long the run took, from its start to its end.
    #[must_use]
    pub fn duration(&self) -> Option<Duration> {
        span(self.started_at?, self.ended_at)
    }
}

/// `to − from`, `None` if negative.
fn span(from: DateTime<Utc>, to: DateTime<Utc>) -> Option<Duration> {
    (to - from).to_std().ok()
}

/// An item with its newest runs: "what happened to key X".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemDetail {
    /// The item.
    pub item: Item,
    /// Its newest runs and actions, newest first.
    pub runs: Vec<Run>,
}

/// What one resync batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResyncReport {
    /// Idle keys made pending.
    pub resynced: u64,
    /// Whether there is nothing more to do now: the pass ended with this
    /// batch, no pass is due, the process does not resync, or another node
    /// holds the walk.
    pub done: bool,
}

/// Where a retention pass over one process stands: how far each of its two
/// walks (the runs' keys, for the per-key cap; the items, for idle keys to
/// forget) has come. Pass the cursor a [`PruneReport`] returns to the next
/// prune to go on from there; [`PruneCursor::default`] starts a pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneCursor {
    /// The walk over the runs' keys (per-key cap) is past this key (the
    /// engine's cursor: the key on PostgreSQL, its bytes in hex on SQLite;
    /// pass it back as it came).
    pub runs_key: Option<String>,
    /// The walk over the runs' keys reached the end in this pass.
    pub runs_finished: bool,
    /// The walk over the items (idle keys to forget) is past this key (a
    /// cursor, as [`runs_key`](Self::runs_key)).
    pub items_key: Option<String>,
    /// The walk over the items reached the end in this pass (or there is
    /// nothing to forget).
    pub items_finished: bool,
}

/// What one retention batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Runs deleted (too old, or beyond the per-key cap).
    pub runs: u64,
    /// Idle keys forgotten.
    pub items: u64,
    /// Where to go on from (a fresh cursor once a pass is done).
    pub cursor: PruneCursor,
    /// Whether a pass over the process is complete: no run left older than
    /// the period, and both walks reached the end.
    pub done: bool,
}

/// A live (or expired, not yet reclaimed) session as the workers page shows
/// it, with the leases it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session's id.
    pub id: SessionId,
    /// The component that started it.
    pub component: String,
    /// Its worker's host, pid and version, as the worker reported them.
    pub identity: super::WorkerIdentity,
    /// Its time to live without a heartbeat.
    pub ttl: Duration,
    /// When it started, on the database clock.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat (its start until the first).
    pub heartbeat_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub deadline: DateTime<Utc>,
    /// Whether the deadline has passed: its leases are reclaimed by the next
    /// reclaim pass of any node, and its heartbeats are refused.
    pub expired: bool,
    /// How many leases it holds.
    pub lease_count: u64,
    /// The first of them (by fencing token, oldest first), up to the asked
    /// number.
    pub leases: Vec<HeldLease>,
}

/// A lease as the workers page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// When its run started.
    pub started_at: Option<DateTime<Utc>>,
    /// Its fencing token.
    pub token: FencingToken,
}

/// A process's recent history as the charts draw it: runs per minute by
/// outcome and the sampled queue depth, over one window ending now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// The window's start (runs are bucketed by whole minutes from it).
    pub start: DateTime<Utc>,
    /// The window's end: now, on the database clock.
    pub end: DateTime<Utc>,
    /// Runs that ended in each minute, by outcome; minutes with none are
    /// left out. Operator actions are not runs and are not counted.
    pub runs: Vec<RunBucket>,
    /// The depth samples in the window, oldest first.
    pub depth: Vec<DepthPoint>,
}

/// Runs with one outcome that ended within one minute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunBucket {
    /// The minute's start.
    pub at: DateTime<Utc>,
    /// How they ended.
    pub outcome: RunOutcome,
    /// How many.
    pub count: u64,
}

/// One sample of a process's queue depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthPoint {
    /// When it was taken.
    pub at: DateTime<Utc>,
    /// Ready keys.
    pub pending: u64,
    /// Keys backing off.
    pub backoff: u64,
    /// Running keys.
    pub running: u64,
    /// Parked keys.
    pub parked: u64,
}

/// One page of a list read in key order: the processes of
/// [`process_counts`](super::StoreEngine::process_counts) and
/// [`history_activity`](super::StoreEngine::history_activity) (by name), the
/// sessions of [`session_list`](super::StoreEngine::session_list) (by id).
/// Every list is read a page at a time (DESIGN.md rule 13): a caller that
/// needs all of it follows `next`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T, A = String> {
    /// The rows, in key order.
    pub items: Vec<T>,
    /// The last row's key, to pass as the next read's `after`, when more rows
    /// follow; `None` on the last page (a full last page included: the read
    /// looks one row ahead, so it never sends a caller to an empty page).
    pub next: Option<A>,
}

/// One page of [`item_triage`](super::StoreEngine::item_triage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriagePage {
    /// The items, in attention order.
    pub items: Vec<Item>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<super::TriageCursor>,
}

/// Item counts for one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessCounts {
    /// The process.
    pub process: String,
    /// Items waiting to run (now or at a requested later time).
    pub pending: u64,
    /// Items waiting for their backoff to end.
    pub backoff: u64,
    /// Items held by a lease.
    pub running: u64,
    /// Items parked after a permanent error.
    pub parked: u64,
    /// Known, converged keys (idle until their next enqueue).
    pub idle: u64,
    /// How long the longest-waiting ready item has been ready (None when nothing
    /// is ready): the number to alert on when workers fall behind.
    pub oldest_pending_age: Option<Duration>,
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct EnqueueReport {
    /// Keys now pending (new, coalesced into a pending entry, or revived).
    pub pending: u64,
    /// Keys running, now marked dirty: each runs exactly once more afterwards.
    pub dirty: u64,
}

/// What a reclaim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ReclaimReport {
    /// Expired sessions deleted.
    pub sessions: u64,
    /// Leases turned back into pending items.
    pub leases: u64,
}

/// How many runs of one process ended recently: the dashboard's throughput and
/// failure rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessActivity {
    /// The process.
    pub process: String,
    /// Runs that ended with done or requeue-after.
    pub finished: u64,
    /// Runs that failed, transiently or permanently.
    pub failed: u64,
}

/// A snapshot of a store's connection pool ([`Store::pool_stats`](super::Store::pool_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Connections open, idle or in use.
    pub size: u32,
    /// Connections open and idle.
    pub idle: u32,
    /// The most connections the pool opens.
    pub max: u32,
}

/// The failing keys (parked or backing off) of one process whose last errors
/// differ only by the key or by numbers: "30 keys failed for this reason".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorGroup {
    /// The normalised error ([`error_signature`](super::error_signature)):
    /// pass it to an [`ItemFilter`](super::ItemFilter) to act on the group.
    pub signature: String,
    /// One of the group's errors as stored.
    pub sample: String,
    /// How many keys have it.
    pub count: u64,
    /// The states those keys are in: `parked`, `backoff` or both.
    pub states: Vec<ItemState>,
}
