//! `GET /v1/processes`: every process with its counts and recent activity.

use std::collections::HashMap;
use std::time::Duration;

use axum::Json;
use axum::extract::State;

use crate::api::{ProcessList, ProcessSummary};
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::state::AppState;
use crate::store::{HistoryActivity, StoreEngine as _};

/// The window of `recent_finished` / `recent_failed`.
pub(crate) const RECENT: Duration = Duration::from_secs(300);

/// Counts and recent activity per process, shared with the dashboard.
pub(crate) async fn summaries(state: &AppState) -> Result<Vec<ProcessSummary>, ApiError> {
    let counts = state.store.process_counts().await?;
    let activity = state
        .store
        .history_activity(HistoryActivity { window: RECENT })
        .await?;
    let recent: HashMap<_, _> = activity
        .into_iter()
        .map(|a| (a.process, (a.finished, a.failed)))
        .collect();
    Ok(counts
        .into_iter()
        .map(|c| {
            let (finished, failed) = recent.get(&c.process).copied().unwrap_or((0, 0));
            ProcessSummary::new(c, finished, failed)
        })
        .collect())
}

/// Lists every known process with its item counts per state, the age of its
/// oldest ready item, and its runs finished and failed in the last five minutes.
#[utoipa::path(
    get, operation_id = "list_processes", path = "/v1/processes", tag = "read",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every known process", body = ProcessList),
    )
)]
pub(crate) async fn list(
    _: Authorized<Read>,
    State(state): State<AppState>,
) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(ProcessList {
        processes: summaries(&state).await?,
    }))
}
