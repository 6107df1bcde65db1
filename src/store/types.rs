//! The store's domain types: what operations return, never raw rows.

use std::fmt;
use std::time::Duration;

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
    /// When the enqueue that this run answers arrived.
    pub enqueued_at: DateTime<Utc>,
    /// When the run started, on the database clock.
    pub started_at: DateTime<Utc>,
}

/// What processing a key returned.
///
/// An error's text may be anything (a command's stderr, a library's message): it
/// is stored as [`clean_text`](super::clean_text) makes it — NUL replaced, cut
/// past [`MAX_TEXT_BYTES`](super::MAX_TEXT_BYTES) — so no text can make an
/// outcome unstorable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Converged: the failure count is reset and the item is gone (or pending again
    /// if it was enqueued while running).
    Done,
    /// Converged for now, look again later: the failure count is reset and the item
    /// is pending at now + the delay (earlier if a dirty re-run asked for earlier).
    RequeueAfter(Duration),
    /// Failed, worth retrying: the failure count grows and the item is pending
    /// after the process's backoff. Errors the handler did not classify belong here.
    Transient(String),
    /// Failed, retrying will not help: the item is parked with its error until an
    /// enqueue revives it (at once, if it was enqueued while running).
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
        }
    }
}

impl fmt::Display for ItemState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One durable item: the row for a (process, key) that is pending, running or
/// parked.
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
    /// When the enqueue it answers arrived.
    pub enqueued_at: DateTime<Utc>,
    /// Consecutive failed attempts.
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
}

/// What happened to a key, as recorded in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// It was enqueued.
    Enqueued,
    /// A run started (by claim or lock).
    Started,
    /// A run ended with done or requeue-after.
    Finished,
    /// A run failed (see `transient`).
    Failed,
    /// It was parked after a permanent error.
    Parked,
    /// Its lease was released without an outcome (shutdown, cancellation).
    Canceled,
    /// Its session expired and the lease was reclaimed.
    Expired,
    /// An operator made it pending at once (backoff or park cut short).
    Retried,
    /// An operator deleted it.
    Deleted,
}

impl EventKind {
    /// The event's name as stored and printed.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enqueued => "enqueued",
            Self::Started => "started",
            Self::Finished => "finished",
            Self::Failed => "failed",
            Self::Parked => "parked",
            Self::Canceled => "canceled",
            Self::Expired => "expired",
            Self::Retried => "retried",
            Self::Deleted => "deleted",
        }
    }

    /// Parses a stored event name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Enqueued,
            Self::Started,
            Self::Finished,
            Self::Failed,
            Self::Parked,
            Self::Canceled,
            Self::Expired,
            Self::Retried,
            Self::Deleted,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One history event. History is append-only; only a retention prune deletes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEvent {
    /// Increasing id: the order events were written in.
    pub id: i64,
    /// When, on the database clock.
    pub at: DateTime<Utc>,
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// What happened.
    pub event: EventKind,
    /// The session involved, if any.
    pub session: Option<SessionId>,
    /// The attempt number, for run events.
    pub attempt: Option<u32>,
    /// The error, for `failed` and `parked`.
    pub error: Option<String>,
    /// For `failed`: whether the failure was transient (retried) or permanent.
    pub transient: Option<bool>,
}

/// An item with its most recent history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemDetail {
    /// The item.
    pub item: Item,
    /// Its newest events, newest first.
    pub history: Vec<HistoryEvent>,
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
    /// Runs that ended with done or requeue-after (`finished` events).
    pub finished: u64,
    /// Runs that failed, transiently or permanently (`failed` events).
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
