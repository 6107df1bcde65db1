//! Leases: claim (long-polling), complete with an outcome, release. The same loop
//! `drover work --db` runs, over HTTP: start a session, claim with `wait_ms`,
//! complete each lease with its fencing token, heartbeat every ttl/3.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tokio::time::Instant;

use crate::server::auth::{Authorized, Work};
use crate::server::error::{ApiError, ErrorBody};
use crate::server::extract::{JsonBody, PathParams, session_id};
use crate::server::model::{
    ClaimRequest, ClaimResponse, CompleteRequest, MAX_CLAIM, ReleaseRequest, max_delay_ms,
};
use crate::server::state::AppState;
use crate::store::{
    Lease, LeaseClaim, LeaseComplete, LeaseRelease, SessionClose, SessionId, StoreEngine as _,
    StoreError, validate_process,
};

/// Leases up to `max` ready keys of a process for the session. When none is
/// ready it waits up to `wait_ms` and returns as soon as work arrives (an enqueue
/// through this server at once; on PostgreSQL, through any node at once;
/// otherwise at the next poll). An empty list means nothing became ready.
///
/// If the database connection breaks as the claim commits, the claim may have
/// leased keys the client never hears of; the server then closes the session
/// (handing every lease it holds back) and answers 409 `session_expired`, so the
/// client starts a new session, as after any lost session.
#[utoipa::path(
    post, path = "/v1/sessions/{session}/claim", tag = "work",
    security(("bearer" = [])),
    params(("session" = i64, Path, description = "The claiming session")),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "The leases (maybe none)", body = ClaimResponse),
        (status = 400, description = "Malformed body, max or wait_ms out of range", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "The token is not a worker's", body = ErrorBody),
        (status = 409, description = "The session expired or never existed", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 422, description = "Invalid process name", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    )
)]
pub(crate) async fn claim(
    _: Authorized<Work>,
    State(state): State<AppState>,
    PathParams(session): PathParams<String>,
    JsonBody(body): JsonBody<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    let session = session_id(&session)?;
    if !(1..=MAX_CLAIM).contains(&body.max) {
        return Err(ApiError::field("max", "max must be between 1 and 1000"));
    }
    let max_wait = state.options.max_wait;
    let wait = Duration::from_millis(body.wait_ms);
    if wait > max_wait {
        return Err(ApiError::field(
            "wait_ms",
            format!("wait_ms must be at most {}", max_wait.as_millis()),
        ));
    }
    validate_process(&body.process)?;
    let leases = wait_for_leases(&state, session, &body, wait).await?;
    state.metrics.claimed(&leases);
    Ok(Json(ClaimResponse {
        leases: leases.into_iter().map(Into::into).collect(),
    }))
}

/// Claims until something is leased, the wait is over or the server shuts down.
/// The wake-up is armed before each claim, so an enqueue between an empty claim
/// and the wait is never missed.
async fn wait_for_leases(
    state: &AppState,
    session: SessionId,
    body: &ClaimRequest,
    wait: Duration,
) -> Result<Vec<Lease>, ApiError> {
    let deadline = Instant::now() + wait;
    let notify = state.store.wakeup(&body.process);
    if !wait.is_zero() {
        state.wake.subscribe(&body.process);
    }
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let params = LeaseClaim {
            session,
            process: body.process.clone(),
            max: body.max,
        };
        let leases = match state.store.lease_claim(params).await {
            Ok(leases) => leases,
            Err(e @ StoreError::CommitUnknown(_)) => return Err(give_up(state, session, e).await),
            Err(e) => return Err(e.into()),
        };
        let now = Instant::now();
        if !leases.is_empty() || now >= deadline {
            return Ok(leases);
        }
        let pause = (deadline - now).min(state.options.poll_interval);
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(pause) => {}
            () = state.shutdown.cancelled() => return Ok(Vec::new()),
        }
    }
}

/// After a claim whose commit is unknown: closes `session`, so that whatever it
/// may have leased goes back, and tells the client its session is gone. If the
/// close fails too, the claim's error stands (503) and the session's leases go
/// back when it expires.
async fn give_up(state: &AppState, session: SessionId, unknown: StoreError) -> ApiError {
    tracing::warn!(%session, error = %unknown, "a claim's commit is unknown; closing its session");
    match state.store.session_close(SessionClose { session }).await {
        Ok(_) => StoreError::SessionExpired { session }.into(),
        Err(e) => {
            tracing::warn!(%session, error = %e, "cannot close the session; it will expire");
            unknown.into()
        }
    }
}

/// Records a run's outcome, checked against the session and the fencing token:
/// 409 (changing nothing) when the lease was lost or the session expired.
#[utoipa::path(
    post, path = "/v1/leases/complete", tag = "work",
    security(("bearer" = [])),
    request_body = CompleteRequest,
    responses(
        (status = 204, description = "Recorded"),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "The token is not a worker's", body = ErrorBody),
        (status = 409, description = "The lease was lost or the session expired", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    )
)]
pub(crate) async fn complete(
    _: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CompleteRequest>,
) -> Result<StatusCode, ApiError> {
    if let crate::server::model::OutcomeBody::RequeueAfter { after_ms } = body.outcome
        && after_ms > max_delay_ms()
    {
        return Err(ApiError::field(
            "outcome.after_ms",
            format!("after_ms must be at most {}", max_delay_ms()),
        ));
    }
    let lease = body.lease.to_lease();
    let outcome = body.outcome.to_outcome();
    state
        .store
        .lease_complete(LeaseComplete {
            lease: &lease,
            outcome: &outcome,
        })
        .await?;
    let now = chrono::Utc::now();
    state
        .metrics
        .completed(&lease.process, outcome.name(), body.lease.started_at, now);
    Ok(StatusCode::NO_CONTENT)
}

/// Gives a lease back without an outcome: the key is pending at once and no
/// failure is counted. 409 when the lease was already lost.
#[utoipa::path(
    post, path = "/v1/leases/release", tag = "work",
    security(("bearer" = [])),
    request_body = ReleaseRequest,
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "The token is not a worker's", body = ErrorBody),
        (status = 409, description = "The lease was lost or the session expired", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    )
)]
pub(crate) async fn release(
    _: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ReleaseRequest>,
) -> Result<StatusCode, ApiError> {
    let lease = body.lease.to_lease();
    state
        .store
        .lease_release(LeaseRelease { lease: &lease })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
