//! Sessions: a worker's registration with a TTL, kept alive by heartbeats.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::api::ErrorBody;
use crate::api::{
    CloseResponse, HeartbeatResponse, MAX_TTL_MS, SessionBody, SessionListBody, SessionListQuery,
    SessionRequest,
};
use crate::server::auth::{Authorized, Read, Work};
use crate::server::error::ApiError;
use crate::server::extract::{JsonBody, PathParams, QueryParams, session_id};
use crate::server::operations::session_page;
use crate::server::owner::Standing;
use crate::server::redact;
use crate::server::state::AppState;
use crate::store::{
    SessionClose, SessionHeartbeat, SessionStart, StoreEngine as _, WorkerIdentity,
};

/// The longest `component`, `host` or `version` a session may carry: labels
/// for the workers page, not documents (every session is listed to viewers).
const MAX_LABEL_BYTES: usize = 1024;

/// Lists the sessions, live or expired and awaiting reclaim, oldest first, a
/// page at a time (pass the answer's `next` as `after` for the next page; it
/// is null on the last): each one's component, host, pid and version (as
/// the worker reported them), when it started and last heartbeated, its
/// deadline, and the leases it holds (at most 100 listed, all counted).
#[utoipa::path(
    get, operation_id = "list_sessions", path = "/v1/sessions", tag = "read",
    security(("bearer" = [])),
    params(SessionListQuery),
    responses(
        (status = 200, description = "A page of the sessions", body = SessionListBody),
        (status = 400, description = "Bad query parameter", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    auth: Authorized<Read>,
    State(state): State<AppState>,
    QueryParams(query): QueryParams<SessionListQuery>,
) -> Result<Json<SessionListBody>, ApiError> {
    let page = session_page(&state, query).await?;
    let body = SessionListBody {
        sessions: page.items.into_iter().map(Into::into).collect(),
        next: page.next.map(|s| s.0),
    };
    Ok(Json(redact::sessions(body, redact::shows_tokens(&auth))))
}

/// Starts a session; its deadline is now + ttl on the database clock. Heartbeat
/// every third of the TTL; claims and completions of an expired session are
/// refused with 409. A token holding the server's limit of live sessions
/// (`--max-sessions-per-token`) is refused with 429 until it closes one or
/// one expires (an open server has one caller and no limit).
#[utoipa::path(
    post, operation_id = "start_session", path = "/v1/sessions", tag = "work",
    security(("bearer" = [])),
    request_body = SessionRequest,
    responses(
        (status = 201, description = "Started", body = SessionBody),
        (status = 400, description = "Malformed body or TTL out of range", body = ErrorBody),
        (status = 429, description = "`too_many_sessions`: the token holds the server's limit of live sessions (10,000 unless configured)", body = ErrorBody),
    )
)]
pub(crate) async fn start(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<(StatusCode, Json<SessionBody>), ApiError> {
    if !(1..=MAX_TTL_MS).contains(&body.ttl_ms) {
        return Err(ApiError::field(
            "ttl_ms",
            format!("ttl_ms must be between 1 and {MAX_TTL_MS}"),
        ));
    }
    let labels = [
        ("component", Some(&body.component)),
        ("host", body.host.as_ref()),
        ("version", body.version.as_ref()),
    ];
    for (field, value) in labels {
        if value.is_some_and(|v| v.len() > MAX_LABEL_BYTES) {
            return Err(ApiError::field(
                field,
                format!("{field} must be at most {MAX_LABEL_BYTES} bytes"),
            ));
        }
    }
    if let Some(owner) = &auth.owner {
        let max = state.options.max_sessions_per_token;
        let held = state.store.session_count_owned(owner).await?;
        if held >= u64::try_from(max).unwrap_or(u64::MAX) {
            return Err(ApiError::TooManySessions(max));
        }
    }
    let session = state
        .store
        .session_start(SessionStart {
            component: body.component,
            ttl: Duration::from_millis(body.ttl_ms),
            identity: WorkerIdentity {
                host: body.host,
                pid: body.pid,
                version: body.version,
            },
            owner: auth.owner.clone(),
        })
        .await?;
    state.owners.remember(session.id, auth.owner);
    Ok((StatusCode::CREATED, Json(session.into())))
}

/// Pushes the session's deadline to now + ttl; 409 if it already expired (stop
/// working and start a new session).
#[utoipa::path(
    post, operation_id = "heartbeat_session", path = "/v1/sessions/{session}/heartbeat", tag = "work",
    security(("bearer" = [])),
    params(("session" = i64, Path, description = "The session id")),
    responses(
        (status = 200, description = "Renewed", body = HeartbeatResponse),
        (status = 400, description = "Malformed session id", body = ErrorBody),
        (status = 409, description = "The session expired or never existed", body = ErrorBody),
    )
)]
pub(crate) async fn heartbeat(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    PathParams(session): PathParams<String>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let session = session_id(&session)?;
    state.check_owner(&auth, session).await?;
    let deadline = state
        .store
        .session_heartbeat(SessionHeartbeat { session })
        .await?;
    Ok(Json(HeartbeatResponse { deadline }))
}

/// Ends a session: its leases go back to pending at once (no failure counted).
/// Closing an unknown session is not an error.
#[utoipa::path(
    delete, operation_id = "close_session", path = "/v1/sessions/{session}", tag = "work",
    security(("bearer" = [])),
    params(("session" = i64, Path, description = "The session id")),
    responses(
        (status = 200, description = "Closed", body = CloseResponse),
        (status = 400, description = "Malformed session id", body = ErrorBody),
    )
)]
pub(crate) async fn close(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    PathParams(session): PathParams<String>,
) -> Result<Json<CloseResponse>, ApiError> {
    let session = session_id(&session)?;
    if state.standing(&auth, session).await? == Standing::Unknown {
        return Ok(Json(CloseResponse { released: 0 }));
    }
    let released = state.store.session_close(SessionClose { session }).await?;
    Ok(Json(CloseResponse { released }))
}
