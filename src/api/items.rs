//! Items on the wire: enqueueing keys, listing and reading items (the routes in
//! `server/routes/items.rs`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::runs::RunBody;
use crate::store::{Item, ItemDetail, ItemState};

/// Body of `POST /v1/processes/{process}/items`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// The keys (each 1–1024 bytes of UTF-8 without NUL; at most
    /// [`MAX_ENQUEUE_KEYS`](super::MAX_ENQUEUE_KEYS)); duplicates count once.
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
    /// The lease's fencing token, while running (null for a viewer token).
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
