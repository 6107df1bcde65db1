//! The HTTP API's wire format: the JSON shapes [`server`](crate::server) answers
//! with and [`client`](crate::client) sends, defined once for both. They are
//! separate from the store's domain types so the format is stable and documented
//! (every type here appears in `/openapi.json`). Durations are whole
//! milliseconds (`*_ms`); times are RFC 3339 in UTC.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::store::{
    ErrorGroup, Item, ItemDetail, ItemState, Lease, Outcome, Run, RunOutcome, Session,
};

/// The longest session TTL the API accepts: one day.
pub const MAX_TTL_MS: u64 = 86_400_000;
/// The most leases one claim answers with; a claim may ask for more (a worker's
/// parallelism), and claims again for the rest.
pub const MAX_CLAIM: u32 = 1000;
/// The most completions one batch request carries.
pub const MAX_COMPLETE_BATCH: usize = 4096;
/// The most items or events one page holds.
pub const MAX_PAGE: u32 = 1000;

/// Milliseconds as a duration.
#[cfg(feature = "server")] // read by the server only
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `MAX_DELAY` in milliseconds, for validation messages.
#[cfg(feature = "server")] // read by the server only
pub(crate) fn max_delay_ms() -> u64 {
    millis(crate::backoff::MAX_DELAY)
}

/// The JSON body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code: `bad_request`, `unauthorized`,
    /// `forbidden`, `cross_origin` (a browser's request for another site's
    /// page), `not_found`, `method_not_allowed`, `lease_lost`,
    /// `session_expired`, `item_running`, `payload_too_large`, `invalid_key`,
    /// `invalid_process`, `unavailable`, `commit_unknown` (a 503 after which
    /// the request may have been applied), `internal`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    /// The request field at fault (`keys[2]`, `ttl_ms`, `limit`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Body of `POST /v1/processes/{process}/items`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// The keys (each 1–1024 bytes of UTF-8 without NUL); duplicates count once.
    #[schema(max_items = 100000)]
    pub keys: Vec<String>,
    /// Do not run before now + this many milliseconds (default 0, at most 180 days).
    #[serde(default)]
    #[schema(maximum = 15552000000_u64)]
    pub after_ms: u64,
    /// Higher runs first (default 0); resyncs use negative priorities.
    #[serde(default)]
    pub priority: i32,
    /// Let this enqueue cut a running backoff short (default false).
    #[serde(default)]
    pub bypass_backoff: bool,
}

/// What an enqueue did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EnqueueResponse {
    /// Keys now pending (new, coalesced or revived).
    pub pending: u64,
    /// Keys that were running, now marked to run once more afterwards.
    pub dirty: u64,
}

/// One process's counts and recent activity.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessSummary {
    /// The process.
    pub process: String,
    /// Items waiting to run.
    pub pending: u64,
    /// Items waiting for their backoff to end.
    pub backoff: u64,
    /// Items held by a lease.
    pub running: u64,
    /// Items parked after a permanent error.
    pub parked: u64,
    /// Known, converged keys (0 from servers older than this field).
    #[serde(default)]
    pub idle: u64,
    /// How long the longest-waiting ready item has been ready; null when none is.
    pub oldest_pending_age_ms: Option<u64>,
    /// Runs finished (done or requeue-after) in the last five minutes.
    pub recent_finished: u64,
    /// Runs failed in the last five minutes.
    pub recent_failed: u64,
}

impl ProcessSummary {
    /// Joins counts with the recent activity.
    #[cfg(feature = "server")] // read by the server only
    pub(crate) fn new(c: crate::store::ProcessCounts, finished: u64, failed: u64) -> Self {
        Self {
            oldest_pending_age_ms: c.oldest_pending_age.map(millis),
            process: c.process,
            pending: c.pending,
            backoff: c.backoff,
            running: c.running,
            parked: c.parked,
            idle: c.idle,
            recent_finished: finished,
            recent_failed: failed,
        }
    }
}

/// Response of `GET /v1/processes`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    /// Every known process, by name.
    pub processes: Vec<ProcessSummary>,
}

/// An item's state.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    /// Waiting to run.
    Pending,
    /// Waiting for its backoff to end.
    Backoff,
    /// Held by a lease.
    Running,
    /// Stopped after a permanent error until the next enqueue.
    Parked,
    /// Converged: known, with no pending work, until the next enqueue.
    Idle,
}

impl From<ItemState> for StateName {
    fn from(s: ItemState) -> Self {
        match s {
            ItemState::Pending => Self::Pending,
            ItemState::Backoff => Self::Backoff,
            ItemState::Running => Self::Running,
            ItemState::Parked => Self::Parked,
            ItemState::Idle => Self::Idle,
        }
    }
}

impl From<StateName> for ItemState {
    fn from(s: StateName) -> Self {
        match s {
            StateName::Pending => Self::Pending,
            StateName::Backoff => Self::Backoff,
            StateName::Running => Self::Running,
            StateName::Parked => Self::Parked,
            StateName::Idle => Self::Idle,
        }
    }
}

/// Query of `GET /v1/processes/{process}/items`.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ItemListQuery {
    /// Only items in this state.
    pub(crate) state: Option<StateName>,
    /// Page after this key (from the previous page's `next_after_key`).
    pub(crate) after_key: Option<String>,
    /// At most this many items (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// Query of `GET /v1/processes/{process}/triage` (and of the dashboard's
/// process page).
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TriageQuery {
    /// Only items in this state.
    pub(crate) state: Option<StateName>,
    /// Only keys starting with this (each state then in key order).
    #[param(max_length = 1024)]
    pub(crate) prefix: Option<String>,
    /// Where the previous page ended: its `next`, with the same filters.
    pub(crate) after: Option<String>,
    /// At most this many items (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// Query of `GET /v1/processes/{process}/items/{key}`.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ItemGetQuery {
    /// At most this many runs, newest first (0–1000, default 50).
    #[param(minimum = 0, maximum = 1000)]
    pub(crate) runs_limit: Option<u32>,
}

/// One durable item.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ItemBody {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// Its state.
    pub state: StateName,
    /// Its priority.
    pub priority: i32,
    /// When a pending item may start.
    pub ready_at: DateTime<Utc>,
    /// When the key became pending for its current (or next, or last) run.
    pub enqueued_at: DateTime<Utc>,
    /// Consecutive failed attempts, transient or permanent; reset when a run
    /// converges.
    pub failures: u32,
    /// The end of the current backoff.
    pub backoff_until: Option<DateTime<Utc>>,
    /// The last failure's error.
    pub last_error: Option<String>,
    /// Whether it runs once more after the current run.
    pub dirty: bool,
    /// The lease's session, while running.
    pub lease_session: Option<i64>,
    /// The lease's fencing token, while running.
    pub lease_token: Option<i64>,
    /// When the current run started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the key was first enqueued (null if only ever locked).
    pub first_enqueued_at: Option<DateTime<Utc>>,
    /// When the key was last enqueued.
    pub last_enqueued_at: Option<DateTime<Utc>>,
    /// How many enqueues it has had, coalesced ones included.
    pub enqueue_count: u64,
    /// How its last run ended: done, requeued, retry, parked, canceled or expired.
    pub last_outcome: Option<String>,
    /// When its last run ended.
    pub last_ended_at: Option<DateTime<Utc>>,
}

impl From<Item> for ItemBody {
    fn from(i: Item) -> Self {
        Self {
            process: i.process,
            key: i.key,
            state: i.state.into(),
            priority: i.priority,
            ready_at: i.ready_at,
            enqueued_at: i.enqueued_at,
            failures: i.failures,
            backoff_until: i.backoff_until,
            last_error: i.last_error,
            dirty: i.dirty,
            lease_session: i.lease_session.map(|s| s.0),
            lease_token: i.lease_token.map(|t| t.0),
            started_at: i.started_at,
            first_enqueued_at: i.first_enqueued_at,
            last_enqueued_at: i.last_enqueued_at,
            enqueue_count: i.enqueue_count,
            last_outcome: i.last_outcome.map(|o| o.as_str().to_owned()),
            last_ended_at: i.last_ended_at,
        }
    }
}

/// Response of `GET /v1/processes/{process}/series`: the charts' data.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SeriesBody {
    /// The window's start (a whole minute).
    pub start: DateTime<Utc>,
    /// The window's end: now.
    pub end: DateTime<Utc>,
    /// Runs that ended per minute and outcome; minutes with none left out.
    pub runs: Vec<RunBucketBody>,
    /// The queue depth samples in the window, oldest first.
    pub depth: Vec<DepthPointBody>,
}

/// Runs with one outcome that ended within one minute.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunBucketBody {
    /// The minute's start.
    pub at: DateTime<Utc>,
    /// How they ended.
    pub outcome: OutcomeName,
    /// How many.
    pub count: u64,
}

/// One queue depth sample.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DepthPointBody {
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

#[cfg(feature = "server")] // built by the server only
impl From<crate::store::Series> for SeriesBody {
    fn from(s: crate::store::Series) -> Self {
        Self {
            start: s.start,
            end: s.end,
            runs: s
                .runs
                .into_iter()
                .map(|b| RunBucketBody {
                    at: b.at,
                    outcome: b.outcome.into(),
                    count: b.count,
                })
                .collect(),
            depth: s
                .depth
                .into_iter()
                .map(|p| DepthPointBody {
                    at: p.at,
                    pending: p.pending,
                    backoff: p.backoff,
                    running: p.running,
                    parked: p.parked,
                })
                .collect(),
        }
    }
}

/// A page of the triage listing: parked items first, then backing off
/// (soonest retry first), pending in claim order, running, idle.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TriagePageBody {
    /// The items, in that order.
    pub items: Vec<ItemBody>,
    /// Pass as `after` (with the same filters) for the next page; null on the
    /// last page.
    pub next: Option<String>,
}

/// A page of items.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ItemPage {
    /// The items, in key order.
    pub items: Vec<ItemBody>,
    /// Pass as `after_key` for the next page; null on the last page.
    pub next_after_key: Option<String>,
}

/// How a run ended, or which action an operator took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeName {
    /// Converged: the key is idle (or pending again if changed during the run).
    Done,
    /// Converged for now, to be looked at again after a delay.
    Requeued,
    /// Failed transiently: pending again after the process's backoff.
    Retry,
    /// Failed permanently and parked (or, as an action, parked by an operator).
    Parked,
    /// Given back without an outcome (shutdown, cancellation).
    Canceled,
    /// Its worker's session expired and the lease was reclaimed.
    Expired,
    /// An operator's "retry now".
    Retried,
    /// An operator forgot the key.
    Deleted,
    /// An operator paused the process (key `""`).
    Paused,
    /// An operator resumed the process (key `""`).
    Resumed,
}

impl From<RunOutcome> for OutcomeName {
    fn from(o: RunOutcome) -> Self {
        match o {
            RunOutcome::Done => Self::Done,
            RunOutcome::Requeued => Self::Requeued,
            RunOutcome::Retry => Self::Retry,
            RunOutcome::Parked => Self::Parked,
            RunOutcome::Canceled => Self::Canceled,
            RunOutcome::Expired => Self::Expired,
            RunOutcome::Retried => Self::Retried,
            RunOutcome::Deleted => Self::Deleted,
            RunOutcome::Paused => Self::Paused,
            RunOutcome::Resumed => Self::Resumed,
        }
    }
}

impl From<OutcomeName> for RunOutcome {
    fn from(o: OutcomeName) -> Self {
        match o {
            OutcomeName::Done => Self::Done,
            OutcomeName::Requeued => Self::Requeued,
            OutcomeName::Retry => Self::Retry,
            OutcomeName::Parked => Self::Parked,
            OutcomeName::Canceled => Self::Canceled,
            OutcomeName::Expired => Self::Expired,
            OutcomeName::Retried => Self::Retried,
            OutcomeName::Deleted => Self::Deleted,
            OutcomeName::Paused => Self::Paused,
            OutcomeName::Resumed => Self::Resumed,
        }
    }
}

/// One history row: a run that ended, or an operator's action.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunBody {
    /// Increasing id; pass the last one of a page as `before` for the next.
    pub id: i64,
    /// The process.
    pub process: String,
    /// The key; empty for an action on the whole process (pause, resume).
    pub key: String,
    /// How the run ended, or which action an operator took.
    pub outcome: OutcomeName,
    /// Which consecutive attempt the run was: 1 + the failed attempts before
    /// it (null for an action).
    pub attempt: Option<u32>,
    /// Whether the run failed (outcome retry or parked, not an action).
    pub failed: bool,
    /// The session that held the lease (null for an action).
    pub session: Option<i64>,
    /// The lease's fencing token (null for an action).
    pub token: Option<i64>,
    /// When the key became pending for this run.
    pub pending_since: Option<DateTime<Utc>>,
    /// When the run started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the run ended, or the action was taken.
    pub ended_at: DateTime<Utc>,
    /// How long the key waited from pending to the run's start, in milliseconds.
    pub queue_wait_ms: Option<u64>,
    /// How long the run took, in milliseconds.
    pub duration_ms: Option<u64>,
    /// The error of a failed run, or the reason an operator parked the key.
    pub error: Option<String>,
    /// The role that took an action (null for a run).
    pub actor: Option<String>,
}

impl From<Run> for RunBody {
    fn from(r: Run) -> Self {
        Self {
            failed: r.failed(),
            queue_wait_ms: r.queue_wait().map(millis),
            duration_ms: r.duration().map(millis),
            id: r.id,
            process: r.process,
            key: r.key,
            outcome: r.outcome.into(),
            attempt: r.attempt,
            session: r.session.map(|s| s.0),
            token: r.token.map(|t| t.0),
            pending_since: r.pending_since,
            started_at: r.started_at,
            ended_at: r.ended_at,
            error: r.error,
            actor: r.actor,
        }
    }
}

/// A page of history, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    /// The rows, newest first.
    pub runs: Vec<RunBody>,
    /// Pass as `before` for the next (older) page; null on the last page.
    pub next_before: Option<i64>,
}

/// Query of `GET /v1/processes/{process}/runs`.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunListQuery {
    /// Only this key's runs.
    pub(crate) key: Option<String>,
    /// Only rows with this outcome.
    pub(crate) outcome: Option<OutcomeName>,
    /// Only rows older than this id (the previous page's `next_before`).
    pub(crate) before: Option<i64>,
    /// At most this many rows (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// An item with its newest runs: what happened to the key, and why.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ItemDetailBody {
    /// The item.
    pub item: ItemBody,
    /// Its newest runs and actions, newest first.
    pub runs: Vec<RunBody>,
}

impl From<ItemDetail> for ItemDetailBody {
    fn from(d: ItemDetail) -> Self {
        Self {
            item: d.item.into(),
            runs: d.runs.into_iter().map(Into::into).collect(),
        }
    }
}

/// A session as `GET /v1/sessions` lists it: who runs it and what it holds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionInfoBody {
    /// The session id.
    pub id: i64,
    /// The component that started it.
    pub component: String,
    /// The worker's host, as it reported it (null from older clients).
    pub host: Option<String>,
    /// The worker's process id.
    pub pid: Option<u32>,
    /// The worker's drover version.
    pub version: Option<String>,
    /// The TTL in milliseconds.
    pub ttl_ms: u64,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub deadline: DateTime<Utc>,
    /// Past its deadline: its leases go back to pending at the next reclaim.
    pub expired: bool,
    /// How many leases it holds.
    pub lease_count: u64,
    /// The oldest of them (at most 100).
    pub leases: Vec<HeldLeaseBody>,
}

/// A lease a session holds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeldLeaseBody {
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// When its run started.
    pub started_at: Option<DateTime<Utc>>,
    /// Its fencing token.
    pub token: i64,
}

/// Response of `GET /v1/sessions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionListBody {
    /// Every session, oldest first.
    pub sessions: Vec<SessionInfoBody>,
}

#[cfg(feature = "server")] // built by the server only
impl From<crate::store::SessionInfo> for SessionInfoBody {
    fn from(s: crate::store::SessionInfo) -> Self {
        Self {
            id: s.id.0,
            component: s.component,
            host: s.identity.host,
            pid: s.identity.pid,
            version: s.identity.version,
            ttl_ms: millis(s.ttl),
            started_at: s.started_at,
            heartbeat_at: s.heartbeat_at,
            deadline: s.deadline,
            expired: s.expired,
            lease_count: s.lease_count,
            leases: s
                .leases
                .into_iter()
                .map(|l| HeldLeaseBody {
                    process: l.process,
                    key: l.key,
                    started_at: l.started_at,
                    token: l.token.0,
                })
                .collect(),
        }
    }
}

/// Body of `POST /v1/sessions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Who is starting it, for operators ("billing-worker").
    pub component: String,
    /// How long the session lives without a heartbeat (1 ms – 1 day); heartbeat
    /// every third of it.
    #[schema(minimum = 1, maximum = 86400000)]
    pub ttl_ms: u64,
    /// The worker's host name, shown on the workers page (optional, as are
    /// `pid` and `version`: clients older than these fields send none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub host: Option<String>,
    /// The worker's process id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, maximum = 4294967295_u64)]
    pub pid: Option<u32>,
    /// The worker's drover (or client library) version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub version: Option<String>,
}

/// A live session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionBody {
    /// The id to heartbeat, claim with and close.
    pub id: i64,
    /// The component.
    pub component: String,
    /// The TTL in milliseconds.
    pub ttl_ms: u64,
    /// When it expires unless renewed (database clock).
    pub deadline: DateTime<Utc>,
}

impl From<Session> for SessionBody {
    fn from(s: Session) -> Self {
        Self {
            id: s.id.0,
            component: s.component,
            ttl_ms: millis(s.ttl),
            deadline: s.deadline,
        }
    }
}

/// Response of a heartbeat.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatResponse {
    /// The new deadline.
    pub deadline: DateTime<Utc>,
}

/// Response of closing a session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CloseResponse {
    /// How many leases went back to pending.
    pub released: u64,
}

/// Body of `POST /v1/sessions/{session}/claim`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The process to claim from.
    pub process: String,
    /// At most this many leases (at least 1, default 1). One answer holds at
    /// most 1000 (`MAX_CLAIM`): ask again for the rest.
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1, format = Int64, maximum = 4294967295_u64)]
    pub max: u32,
    /// When nothing is ready, wait up to this many milliseconds for work
    /// (default 0; a longer wait than the server's maximum, 60 s unless
    /// configured, is cut to it).
    #[serde(default)]
    pub wait_ms: u64,
}

fn one() -> u32 {
    1
}

/// A lease: proof that its holder alone may work on the key.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseBody {
    /// The holding session.
    pub session: i64,
    /// The process.
    pub process: String,
    /// The key to work on.
    pub key: String,
    /// The fencing token completions are checked against.
    pub token: i64,
    /// Which consecutive attempt this is.
    pub attempt: u32,
    /// The item's priority.
    pub priority: i32,
    /// When the enqueue this run answers arrived.
    pub enqueued_at: DateTime<Utc>,
    /// When the run started.
    pub started_at: DateTime<Utc>,
}

impl From<Lease> for LeaseBody {
    fn from(l: Lease) -> Self {
        Self {
            session: l.session.0,
            process: l.process,
            key: l.key,
            token: l.token.0,
            attempt: l.attempt,
            priority: l.priority,
            enqueued_at: l.enqueued_at,
            started_at: l.started_at,
        }
    }
}

/// Response of a claim.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimResponse {
    /// The leases; empty when nothing became ready within the wait.
    pub leases: Vec<LeaseBody>,
    /// The process is paused: nothing is claimed until it is resumed.
    #[serde(default)]
    pub paused: bool,
    /// The process's rate limit held the claim back (fewer leases than asked
    /// though more may be ready): its next token comes in this many
    /// milliseconds. Claim again then, not at the next poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub next_token_in_ms: Option<u64>,
}

/// A lease as a worker sends it back: the object a claim returned (the fields
/// that only describe it may be left out).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    /// The holding session.
    pub session: i64,
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// The fencing token.
    pub token: i64,
    /// The attempt (recorded in the history).
    #[schema(minimum = 1, format = Int64, maximum = 4294967295_u64)]
    pub attempt: u32,
    /// Ignored.
    #[serde(default)]
    pub priority: Option<i32>,
    /// Ignored.
    #[serde(default)]
    pub enqueued_at: Option<DateTime<Utc>>,
    /// When the run started; used for the work-duration metric.
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
}

impl From<&Lease> for LeaseRef {
    fn from(l: &Lease) -> Self {
        Self {
            session: l.session.0,
            process: l.process.clone(),
            key: l.key.clone(),
            token: l.token.0,
            attempt: l.attempt,
            priority: Some(l.priority),
            enqueued_at: Some(l.enqueued_at),
            started_at: Some(l.started_at),
        }
    }
}

impl From<LeaseBody> for Lease {
    fn from(l: LeaseBody) -> Self {
        Self {
            session: crate::store::SessionId(l.session),
            process: l.process,
            key: l.key,
            token: crate::store::FencingToken(l.token),
            attempt: l.attempt,
            priority: l.priority,
            enqueued_at: l.enqueued_at,
            started_at: l.started_at,
        }
    }
}

impl LeaseRef {
    /// The store's lease; the described-only fields are filled with neutral
    /// values the store does not check.
    #[cfg(feature = "server")] // read by the server only
    pub(crate) fn to_lease(&self) -> Lease {
        Lease {
            session: crate::store::SessionId(self.session),
            process: self.process.clone(),
            key: self.key.clone(),
            token: crate::store::FencingToken(self.token),
            attempt: self.attempt,
            priority: self.priority.unwrap_or(0),
            enqueued_at: self.enqueued_at.unwrap_or_default(),
            started_at: self.started_at.unwrap_or_default(),
        }
    }
}

/// What processing a key returned.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OutcomeBody {
    /// Converged: the item stays, idle (or pending again if it was enqueued
    /// meanwhile). A variant with no fields rather than a unit one, so that
    /// unknown fields are refused here too (serde ignores them beside the tag
    /// of a unit variant).
    Done {},
    /// Converged for now; look again after `after_ms`.
    RequeueAfter {
        /// The delay in milliseconds (at most 180 days).
        #[schema(maximum = 15552000000_u64)]
        after_ms: u64,
    },
    /// Failed, worth retrying after the process's backoff.
    Transient {
        /// What went wrong.
        error: String,
    },
    /// Failed for good: parked until the next enqueue.
    Permanent {
        /// What went wrong.
        error: String,
    },
}

impl From<&Outcome> for OutcomeBody {
    fn from(o: &Outcome) -> Self {
        match o {
            Outcome::Done => Self::Done {},
            Outcome::RequeueAfter(after) => Self::RequeueAfter {
                after_ms: millis(*after),
            },
            Outcome::Transient(error) => Self::Transient {
                error: error.clone(),
            },
            Outcome::Permanent(error) => Self::Permanent {
                error: error.clone(),
            },
        }
    }
}

impl OutcomeBody {
    /// The store's outcome.
    #[cfg(feature = "server")] // read by the server only
    pub(crate) fn to_outcome(&self) -> Outcome {
        match self {
            Self::Done {} => Outcome::Done,
            Self::RequeueAfter { after_ms } => Outcome::RequeueAfter(ms(*after_ms)),
            Self::Transient { error } => Outcome::Transient(error.clone()),
            Self::Permanent { error } => Outcome::Permanent(error.clone()),
        }
    }
}

/// Body of `POST /v1/leases/complete`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The lease, as the claim returned it.
    pub lease: LeaseRef,
    /// How the run went.
    pub outcome: OutcomeBody,
}

/// Body of `POST /v1/leases/complete-batch`: many outcomes, one transaction.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBatchRequest {
    /// The completions (1–4096), each checked against its own lease.
    #[schema(min_items = 1, max_items = 4096)]
    pub completions: Vec<CompleteRequest>,
}

/// What became of one completion of a batch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompletionResult {
    /// Null when the outcome was recorded; otherwise why this lease alone
    /// changed nothing: `lease_lost` or `session_expired` (final), or the code
    /// of an error that kept it from being written (`internal`, `unavailable`:
    /// it may be sent again).
    pub error: Option<String>,
    /// The refusal's message, when refused.
    pub message: Option<String>,
}

/// Response of `POST /v1/leases/complete-batch`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CompleteBatchResponse {
    /// One result per completion, in the request's order.
    pub results: Vec<CompletionResult>,
}

/// Body of `POST /v1/leases/release`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The lease, as the claim returned it.
    pub lease: LeaseRef,
}

/// Response of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unavailable` when the database cannot be reached.
    pub status: String,
    /// The engine: `sqlite` or `postgres`.
    pub database: String,
}

/// Query of `GET /v1/processes/{process}/error-groups`.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ErrorGroupsQuery {
    /// At most this many groups, most keys first (1–1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// The failing keys (parked or backing off) whose last errors differ only by
/// the key or by numbers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorGroupBody {
    /// The error with the key replaced by `<key>` and every run of digits by
    /// `<n>`: pass it as `error` to act on the group's keys.
    pub signature: String,
    /// One of the group's errors as stored.
    pub sample: String,
    /// How many keys have it.
    pub count: u64,
    /// The states those keys are in: `parked`, `backoff` or both.
    pub states: Vec<StateName>,
}

impl From<ErrorGroup> for ErrorGroupBody {
    fn from(g: ErrorGroup) -> Self {
        Self {
            signature: g.signature,
            sample: g.sample,
            count: g.count,
            states: g.states.into_iter().map(Into::into).collect(),
        }
    }
}

/// Response of `GET /v1/processes/{process}/error-groups`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorGroupList {
    /// The groups, most keys first.
    pub groups: Vec<ErrorGroupBody>,
}

/// A state a bulk action may select keys by (never `running`: only a key's
/// worker may end its run).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkState {
    /// Waiting to run.
    Pending,
    /// Waiting for its backoff to end.
    Backoff,
    /// Stopped after a permanent error until the next enqueue.
    Parked,
    /// Converged.
    Idle,
}

impl From<BulkState> for ItemState {
    fn from(s: BulkState) -> Self {
        match s {
            BulkState::Pending => Self::Pending,
            BulkState::Backoff => Self::Backoff,
            BulkState::Parked => Self::Parked,
            BulkState::Idle => Self::Idle,
        }
    }
}

/// Body of `POST /v1/processes/{process}/items:retry` and `…/items:delete`:
/// which keys. Every condition given must hold; at least one is required, so
/// nobody acts on a whole process by accident. Running keys are never touched.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// Only keys in this state.
    #[serde(default)]
    #[schema(nullable = false)]
    pub state: Option<BulkState>,
    /// Only keys whose last error has this signature (an error group's
    /// `signature`); without `state`, only parked and backing-off keys.
    #[serde(default)]
    #[schema(nullable = false, min_length = 1, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
    /// Only keys starting with this.
    #[serde(default)]
    #[schema(nullable = false, min_length = 1, pattern = "^[^\\u0000]*$")]
    pub key_prefix: Option<String>,
}

/// Body of `POST /v1/processes/{process}/items:park`: which keys, as for
/// [`BulkRequest`], and why.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkParkRequest {
    /// Only keys in this state.
    #[serde(default)]
    #[schema(nullable = false)]
    pub state: Option<BulkState>,
    /// Only keys whose last error has this signature.
    #[serde(default)]
    #[schema(nullable = false, min_length = 1, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
    /// Only keys starting with this.
    #[serde(default)]
    #[schema(nullable = false, min_length = 1, pattern = "^[^\\u0000]*$")]
    pub key_prefix: Option<String>,
    /// The keys' new last error (default "parked by an operator").
    #[serde(default)]
    pub reason: Option<String>,
}

/// What a bulk action did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BulkResponse {
    /// How many keys changed (each with a row in its history).
    pub changed: u64,
}

/// A process's stored settings: `GET /v1/processes/{process}/settings`, and
/// the answer of a `PATCH` there.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessSettingsBody {
    /// The process.
    pub process: String,
    /// Retry delay after the first failure.
    pub backoff_initial_ms: u64,
    /// Growth of the delay per further failure.
    pub backoff_factor: f64,
    /// The longest retry delay.
    pub backoff_max_ms: u64,
    /// Spread of each delay, 0 to 1.
    pub backoff_jitter: f64,
    /// Runs are kept this long.
    pub keep_runs_for_ms: u64,
    /// At most this many runs are kept per key.
    pub keep_runs_per_key: u32,
    /// Idle keys untouched this long are forgotten; null: never.
    pub forget_idle_after_ms: Option<u64>,
    /// No worker claims the process's keys while it is paused.
    pub paused: bool,
    /// At most this many of its keys run at once across the fleet; null: no limit.
    pub concurrency: Option<u32>,
    /// At most this many runs start per second across the fleet; null: no limit.
    pub rate_per_s: Option<f64>,
    /// The rate limit's burst; null when there is no rate limit.
    pub rate_burst: Option<u32>,
}

impl From<crate::store::ProcessSettings> for ProcessSettingsBody {
    fn from(s: crate::store::ProcessSettings) -> Self {
        Self {
            process: s.process,
            backoff_initial_ms: millis(s.backoff.initial()),
            backoff_factor: s.backoff.factor(),
            backoff_max_ms: millis(s.backoff.max()),
            backoff_jitter: s.backoff.jitter(),
            keep_runs_for_ms: millis(s.retention.keep_runs_for),
            keep_runs_per_key: s.retention.keep_runs_per_key,
            forget_idle_after_ms: s.retention.forget_idle_after.map(millis),
            paused: s.limits.paused,
            concurrency: s.limits.concurrency,
            rate_per_s: s.limits.rate.map(|r| r.per_second),
            rate_burst: s.limits.rate.map(|r| r.burst),
        }
    }
}

/// Body of `PATCH /v1/processes/{process}/settings`: the settings to change,
/// as `drover process configure` takes them; those left out keep their
/// stored values (a partial backoff is merged with the stored one). Pause
/// and resume have their own routes.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfigureRequest {
    /// Retry delay after the first failure.
    #[serde(default)]
    #[schema(maximum = 15552000000_u64)]
    pub backoff_initial_ms: Option<u64>,
    /// Growth of the delay per further failure, at least 1.
    #[serde(default)]
    #[schema(minimum = 1.0, maximum = 1000.0)]
    pub backoff_factor: Option<f64>,
    /// The longest retry delay (not below the initial one).
    #[serde(default)]
    #[schema(maximum = 15552000000_u64)]
    pub backoff_max_ms: Option<u64>,
    /// Spread of each delay, 0 to 1.
    #[serde(default)]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub backoff_jitter: Option<f64>,
    /// Keep runs this long (at least 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 15552000000_u64)]
    pub keep_runs_for_ms: Option<u64>,
    /// Keep at most this many runs per key (at least 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub keep_runs_per_key: Option<u32>,
    /// Forget idle keys untouched this long (at least 1); null: never.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 15552000000_u64)]
    pub forget_idle_after_ms: Option<Option<u64>>,
    /// At most this many keys running at once across the fleet (at least 1);
    /// null: no limit.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub concurrency: Option<Option<u32>>,
    /// At most this many runs started per second (above 0, at most
    /// 1,000,000); null: no limit.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(exclusive_minimum = 0.0, maximum = 1000000.0)]
    pub rate_per_s: Option<Option<f64>>,
    /// The rate limit's burst (at least 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub rate_burst: Option<u32>,
}

/// A field that may be given as null (`Some(None)`), apart from left out
/// (`None`, through `#[serde(default)]`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Answer of `POST /v1/processes/{process}/pause` and `…/resume`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseResponse {
    /// The process.
    pub process: String,
    /// Whether it is paused now.
    pub paused: bool,
    /// Whether this request changed it (false: it already was).
    pub changed: bool,
}
