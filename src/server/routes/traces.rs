//! `POST /v1/leases/trace-link`: a worker over HTTP links the retry of a run
//! that failed to that run's span (DESIGN.md rule 14), as a worker on the
//! database does in its own transaction.

use axum::extract::State;
use axum::http::StatusCode;

use crate::api::{ErrorBody, TraceLinkRequest};
use crate::server::auth::{Authorized, Work};
use crate::server::error::ApiError;
use crate::server::extract::JsonBody;
use crate::server::state::AppState;
use crate::store::TraceContext;

/// Adds the W3C context of a failed run's span to its key's next run, so the
/// retry's span links to the attempt that failed. Send it before the
/// run's transient outcome, while the lease still holds the key (a lease
/// that lost it is refused with 409); a worker that does not trace never
/// calls it.
#[utoipa::path(
    post, operation_id = "trace_link", path = "/v1/leases/trace-link", tag = "work",
    security(("bearer" = [])),
    request_body = TraceLinkRequest,
    responses(
        (status = 204, description = "Linked"),
        (status = 400, description = "Malformed body or trace context", body = ErrorBody),
        (status = 409, description = "The lease no longer holds its key: nothing linked", body = ErrorBody),
        (status = 422, description = "A lease naming a key or process no lease can have (empty, over 1024 bytes, a NUL)", body = ErrorBody),
    )
)]
pub(crate) async fn link(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TraceLinkRequest>,
) -> Result<StatusCode, ApiError> {
    let sent = &body.context;
    let context = TraceContext::new(&sent.traceparent, sent.tracestate.as_deref())
        .map_err(|e| ApiError::field("context", e.to_string()))?;
    let lease = body.lease.to_lease()?;
    state.check_owner(&auth, lease.session).await?;
    state.store.item_trace_link(&lease, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}
