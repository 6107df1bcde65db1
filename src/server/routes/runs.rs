//! A process's history: runs (one row each, written when the run ends) and
//! operators' actions, newest first, a page at a time.

use axum::Json;
use axum::extract::State;

use crate::api::ErrorBody;
use crate::api::{RunListQuery, RunPage};
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::{PathParams, QueryParams};
use crate::server::operations::page_limit;
use crate::server::redact;
use crate::server::state::AppState;
use crate::store::{RunList, StoreEngine as _, validate_key, validate_process};

/// Pages through a process's runs, newest first: "what happened to key X".
/// Paged by run id (`before` = the previous page's `next_before`), never by
/// offset, so a page costs the same however deep it is.
#[utoipa::path(
    get, operation_id = "list_runs", path = "/v1/processes/{process}/runs", tag = "read",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process"), RunListQuery),
    responses(
        (status = 200, description = "A page of runs, newest first", body = RunPage),
        (status = 400, description = "Bad query parameter", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
        (status = 422, description = "Invalid process name or key", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    auth: Authorized<Read>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    QueryParams(query): QueryParams<RunListQuery>,
) -> Result<Json<RunPage>, ApiError> {
    let limit = page_limit(query.limit, 100)?;
    validate_process(&process)?;
    if let Some(key) = &query.key {
        validate_key(key)?;
    }
    let runs = state
        .store
        .run_list(RunList {
            process: Some(process),
            key: query.key,
            outcome: query.outcome.map(Into::into),
            before: query.before,
            limit,
        })
        .await?;
    let next_before = (runs.len() == limit as usize)
        .then(|| runs.last().map(|r| r.id))
        .flatten();
    let runs = runs.into_iter().map(Into::into).collect();
    Ok(Json(RunPage {
        runs: redact::runs(runs, redact::shows_tokens(&auth)),
        next_before,
    }))
}
