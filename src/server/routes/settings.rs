//! A process's settings (`GET` / `PATCH /v1/processes/{process}/settings`)
//! and its pause switch (`POST …/pause`, `…/resume`, and `POST
//! /v1/process/pause|resume?process=…` for a process named `.` or `..`):
//! what `drover process configure` and `drover pause|resume` do, for admins
//! over HTTP.

use axum::Json;
use axum::extract::State;

use crate::api::ErrorBody;
use crate::api::{PauseResponse, ProcessConfigureRequest, ProcessNameQuery, ProcessSettingsBody};
use crate::backoff::Backoff;
use crate::server::auth::{Authorized, Manage, Read};
use crate::server::error::ApiError;
use crate::server::extract::{JsonBody, PathParams, QueryParams};
use crate::server::operations::process_pause;
use crate::server::state::AppState;
use crate::store::{ProcessSettings, StoreEngine as _, StoreError, validate_process};

/// The stored settings of `process`; 404 if it is unknown.
async fn stored(state: &AppState, process: &str) -> Result<ProcessSettings, ApiError> {
    validate_process(process)?;
    state
        .store
        .process_get(process)
        .await?
        .ok_or_else(|| StoreError::UnknownProcess(process.to_owned()).into())
}

/// A process's settings: backoff, retention and fleet controls.
#[utoipa::path(
    get, operation_id = "get_settings", path = "/v1/processes/{process}/settings", tag = "read",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    responses(
        (status = 200, description = "Its settings", body = ProcessSettingsBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn get(
    _: Authorized<Read>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
) -> Result<Json<ProcessSettingsBody>, ApiError> {
    Ok(Json(stored(&state, &process).await?.into()))
}

/// Changes a process's settings (creating the process if unknown); those not
/// given keep their stored values, and a partial backoff is merged with the
/// stored one. Every node obeys the new values from its next claim.
#[utoipa::path(
    patch, operation_id = "configure_process", path = "/v1/processes/{process}/settings", tag = "admin",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    request_body = ProcessConfigureRequest,
    responses(
        (status = 200, description = "The settings now", body = ProcessSettingsBody),
        (status = 400, description = "Malformed body or a value out of range", body = ErrorBody),
    )
)]
pub(crate) async fn configure(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    JsonBody(body): JsonBody<ProcessConfigureRequest>,
) -> Result<Json<ProcessSettingsBody>, ApiError> {
    validate_process(&process)?;
    let current = match stored(&state, &process).await {
        Ok(settings) => Some(settings),
        Err(ApiError::NotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let stored_backoff = current.map_or_else(Backoff::default, |s| s.backoff);
    let params = body
        .changes(process.clone(), stored_backoff)
        .map_err(|e| ApiError::field("backoff", format!("invalid backoff: {e}")))?;
    state.store.process_configure(params).await?;
    Ok(Json(stored(&state, &process).await?.into()))
}

/// Pauses a process for every node: no worker claims its keys until it is
/// resumed; runs already going finish normally, and enqueues are kept.
/// Recorded in the history (key `""`, outcome `paused`, actor `admin`).
#[utoipa::path(
    post, operation_id = "pause_process", path = "/v1/processes/{process}/pause", tag = "admin",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    responses(
        (status = 200, description = "Paused (changed: false if it already was)", body = PauseResponse),
    )
)]
pub(crate) async fn pause(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
) -> Result<Json<PauseResponse>, ApiError> {
    process_pause(&state, process, true).await.map(Json)
}

/// Resumes a paused process: workers on every node claim its keys again
/// (woken at once). Recorded in the history (outcome `resumed`).
#[utoipa::path(
    post, operation_id = "resume_process", path = "/v1/processes/{process}/resume", tag = "admin",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    responses(
        (status = 200, description = "Resumed (changed: false if it was not paused)", body = PauseResponse),
    )
)]
pub(crate) async fn resume(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
) -> Result<Json<PauseResponse>, ApiError> {
    process_pause(&state, process, false).await.map(Json)
}

/// Pauses a process named in the query, as `POST
/// /v1/processes/{process}/pause` does: the form for a process named `.` or
/// `..`, which no HTTP client sends as a path segment (it removes it, or
/// climbs with it, before sending), and which `drover pause --server` uses
/// for such a name.
#[utoipa::path(
    post, operation_id = "pause_process_by_query", path = "/v1/process/pause", tag = "admin",
    security(("bearer" = [])),
    params(ProcessNameQuery),
    responses(
        (status = 200, description = "Paused (changed: false if it already was)", body = PauseResponse),
        (status = 400, description = "No process in the query", body = ErrorBody),
        (status = 422, description = "Invalid process name", body = ErrorBody),
    )
)]
pub(crate) async fn pause_by_query(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    QueryParams(name): QueryParams<ProcessNameQuery>,
) -> Result<Json<PauseResponse>, ApiError> {
    process_pause(&state, name.process, true).await.map(Json)
}

/// Resumes a process named in the query (see
/// [`pause_by_query`]).
#[utoipa::path(
    post, operation_id = "resume_process_by_query", path = "/v1/process/resume", tag = "admin",
    security(("bearer" = [])),
    params(ProcessNameQuery),
    responses(
        (status = 200, description = "Resumed (changed: false if it was not paused)", body = PauseResponse),
        (status = 400, description = "No process in the query", body = ErrorBody),
        (status = 422, description = "Invalid process name", body = ErrorBody),
    )
)]
pub(crate) async fn resume_by_query(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    QueryParams(name): QueryParams<ProcessNameQuery>,
) -> Result<Json<PauseResponse>, ApiError> {
    process_pause(&state, name.process, false).await.map(Json)
}
