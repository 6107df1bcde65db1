//! A process's charts on the wire: runs per minute and queue depth over a window.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::runs::OutcomeName;

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
