//! Runs on the wire: the history of a process or a key, newest first.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::limits::millis;
use crate::store::{Run, RunOutcome};

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
    /// The lease's fencing token (null for an action, and for a viewer token).
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
    /// The trace id of the run's span (32 lowercase hex digits), when its
    /// worker traced it; null otherwise (tracing off, an action). The
    /// server's `--trace-url` turns it into a link on the dashboard.
    #[serde(default)]
    #[schema(
        pattern = "^[0-9a-f]{32}$",
        example = "4bf92f3577b34da6a3ce929d0e0e4736"
    )]
    pub trace_id: Option<String>,
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
            trace_id: r.trace_id.map(|id| id.to_string()),
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
