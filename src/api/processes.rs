//! Processes on the wire: the list of processes with their counts.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[cfg(feature = "server")]
use super::limits::millis;

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

/// Query of `GET /v1/processes` (and of the dashboard's overview): one page
/// of the processes, by name.
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ProcessListQuery {
    /// Where the previous page ended: its `next` (a process name; at most
    /// 1024 bytes, without NUL).
    #[param(max_length = 1024)]
    pub(crate) after: Option<String>,
    /// At most this many processes (1–1000, default 1000: ten times the
    /// processes a server lets workers create unless told otherwise, so a
    /// client that reads one page sees them all on most servers).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<u32>,
}

/// Query of `POST /v1/process/pause` and `…/resume`: the process, for a
/// name a URL cannot carry as a path segment (`.` and `..`, which every
/// HTTP client removes, as `%2e` too, before it sends a path).
#[cfg(feature = "server")] // read by the server only
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ProcessNameQuery {
    /// The process.
    pub(crate) process: String,
}

/// Response of `GET /v1/processes`: one page of the known processes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    /// The page's processes, by name (byte order).
    pub processes: Vec<ProcessSummary>,
    /// Pass as `after` for the next page; null on the last page (absent from
    /// servers older than paging, which listed every process at once).
    #[serde(default)]
    pub next: Option<String>,
}
