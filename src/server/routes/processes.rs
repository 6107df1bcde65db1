//! `GET /v1/processes`: every process with its counts and recent activity.

use axum::Json;
use axum::extract::State;

use crate::api::ProcessList;
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::operations::process_summaries;
use crate::server::state::AppState;

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
        processes: process_summaries(&state).await?,
    }))
}
