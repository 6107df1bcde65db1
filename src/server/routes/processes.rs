//! `GET /v1/processes`: the processes with their counts and recent activity,
//! a page at a time.

use axum::Json;
use axum::extract::State;

use crate::api::{ErrorBody, ProcessList, ProcessListQuery};
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::QueryParams;
use crate::server::operations::process_summaries;
use crate::server::state::AppState;

/// Lists the known processes by name, a page at a time (pass the answer's
/// `next` as `after` for the next page; it is null on the last), each with
/// its item counts per state, the age of its oldest ready item, and its runs
/// finished and failed in the last five minutes. Without `limit` a page holds
/// 1000 processes: ten times what a server lets workers create by default.
#[utoipa::path(
    get, operation_id = "list_processes", path = "/v1/processes", tag = "read",
    security(("bearer" = [])),
    params(ProcessListQuery),
    responses(
        (status = 200, description = "A page of the known processes", body = ProcessList),
        (status = 400, description = "Bad query parameter", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    _: Authorized<Read>,
    State(state): State<AppState>,
    QueryParams(query): QueryParams<ProcessListQuery>,
) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(process_summaries(&state, query).await?))
}
