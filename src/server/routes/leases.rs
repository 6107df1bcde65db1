//! Leases: claim (long-polling), complete with an outcome, release. The same loop
//! `drover work --db` runs, over HTTP: start a session, claim with `wait_ms`,
//! complete each lease with its fencing token, heartbeat every ttl/3.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use futures_util::FutureExt as _;
use tokio::time::Instant;

use crate::api::ErrorBody;
use crate::api::{
    ClaimRequest, ClaimResponse, CompleteBatchRequest, CompleteBatchResponse, CompleteRequest,
    CompletionResult, LeaseBody, MAX_CLAIM, MAX_COMPLETE_BATCH, OutcomeBody, ReleaseRequest,
    max_delay_ms,
};
use crate::server::auth::{Authorized, Work};
use crate::server::error::ApiError;
use crate::server::extract::{JsonBody, PathParams, session_id};
use crate::server::state::AppState;
use crate::store::rules::written::Written;
use crate::store::{
    Claimed, Lease, LeaseClaim, LeaseComplete, LeaseRelease, Outcome, SessionId, StoreEngine as _,
    StoreError, TraceId, validate_process,
};

/// Leases up to `max` ready keys of a process for the session (at most 1000 in
/// one answer, whatever `max` asks: claim again for the rest). When none is
/// ready it waits up to `wait_ms` and returns as soon as work arrives (an enqueue
/// through this server at once; on PostgreSQL, through any node at once;
/// otherwise at the next poll); a wait longer than the server's maximum (60 s
/// unless configured) is cut to it. An empty list means nothing became ready.
///
/// If the database connection breaks as the claim commits, the claim may have
/// leased keys the client never hears of: the server answers 503
/// `commit_unknown`, and the client gives its session up: it stops the runs it
/// started under it, then closes it (handing every lease it holds back, the
/// unknown ones too), and starts a new one. drover's client does. The server
/// does not close the session itself: the client's runs under it may still be
/// going, and their keys, handed back at once, could start elsewhere beside
/// them.
#[utoipa::path(
    post, operation_id = "claim", path = "/v1/sessions/{session}/claim", tag = "work",
    security(("bearer" = [])),
    params(("session" = i64, Path, description = "The claiming session")),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "The leases (maybe none)", body = ClaimResponse),
        (status = 400, description = "Malformed body, or a max of 0", body = ErrorBody),
        (status = 409, description = "The session expired or never existed", body = ErrorBody),
        (status = 422, description = "Invalid process name", body = ErrorBody),
        (status = 429, description = "Nothing was ready, and too many claims wait already (on this server, or of this session)", body = ErrorBody),
        (status = 503, description = "The database is unavailable; or, `commit_unknown`, the claim may have leased keys: give the session up (stop its runs, then close it)", body = ErrorBody),
    )
)]
pub(crate) async fn claim(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    PathParams(session): PathParams<String>,
    JsonBody(body): JsonBody<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    let session = session_id(&session)?;
    state.check_owner(&auth, session).await?;
    if body.max == 0 {
        return Err(ApiError::field("max", "max must be at least 1"));
    }
    // A longer wait than the server allows is cut to its maximum: the worker
    // claims again when the answer comes back empty.
    let wait = Duration::from_millis(body.wait_ms).min(state.options.max_wait);
    validate_process(&body.process)?;
    let claimed = wait_for_leases(&state, session, auth.owner.as_deref(), &body, wait).await?;
    for lease in &claimed.leases {
        state.handed.handed(lease);
        let waited = (lease.started_at - lease.enqueued_at).to_std();
        state
            .metrics
            .claimed(&lease.process, waited.unwrap_or_default());
    }
    let next_token_in = claimed.gate.next_token_in;
    let leases: Vec<LeaseBody> = claimed.leases.into_iter().map(Into::into).collect();
    Ok(Json(ClaimResponse {
        leases,
        paused: claimed.gate.paused,
        next_token_in_ms: next_token_in.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }))
}

/// The claim, and when it finds nothing, the wait: in its process's line
/// (see `waiting.rs`), claiming again at its turn, until it gets keys or
/// `wait` passes. A wake-up sent between the first claim and entering the
/// line is caught by the store's signal, armed before that claim. When the
/// process's rate limit held the claim back, the line is told when the next
/// token comes, and gives one of its waiters a turn then (or at the poll
/// interval, if sooner: the limit may be changed meanwhile), since no
/// wake-up can come sooner.
async fn wait_for_leases(
    state: &AppState,
    session: SessionId,
    owner: Option<&str>,
    body: &ClaimRequest,
    wait: Duration,
) -> Result<Claimed, ApiError> {
    let deadline = Instant::now() + wait;
    let params = LeaseClaim {
        session,
        process: body.process.clone(),
        max: body.max.min(MAX_CLAIM),
        trace_links: body.trace_links,
    };
    // A claim that will not wait listens for nothing: subscribing it would
    // hold one of the store's `LISTEN` channels for a process nobody waits
    // on (a busy worker's claims, or made-up names by the thousand).
    if wait.is_zero() {
        return claim_once(state, &params).await;
    }
    // Nor does one on a name the database does not hold, past a bound
    // (see `waiting.rs`): it waits by the poll alone.
    let held = state
        .known
        .holds(&state.store, &params.process, state.options.max_processes)
        .await?;
    let ear = state.waiting.ear(&params.process, held);
    let signal = ear.as_ref().map(|_| state.store.subscribe(&params.process));
    let mut before = signal.as_ref().map(|signal| Box::pin(signal.notified()));
    if let Some(before) = before.as_mut() {
        before.as_mut().enable();
    }
    let mut claimed = claim_once(state, &params).await?;
    if !claimed.leases.is_empty() {
        return Ok(claimed);
    }
    let place = state.waiting.enter(
        &state.store,
        &params.process,
        session,
        owner,
        ear.as_ref(),
        state.options.poll_interval,
        &state.shutdown,
    )?;
    let _waiting = state.metrics.claim_waiting();
    let mut missed = before.is_some_and(|before| before.now_or_never().is_some());
    loop {
        if !missed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(claimed);
            }
            match claimed.gate.next_token_in {
                Some(token) if token >= left => return Ok(claimed),
                // One turn of the line when the token comes, or at the poll
                // interval if it comes first: a limit raised or removed
                // meanwhile is obeyed within one poll.
                Some(token) => place.token_in(token),
                None => {}
            }
            tokio::select! {
                () = place.turn() => {}
                () = tokio::time::sleep(left) => return Ok(claimed),
                () = state.shutdown.cancelled() => return Ok(Claimed::default()),
            }
        }
        missed = false;
        claimed = match claim_once(state, &params).await {
            Ok(claimed) => claimed,
            Err(e) => {
                // Its session ended while it waited (closed, or expired with
                // its worker): the turn it took, maybe an enqueue's wake-up,
                // goes on to a claim that can use it, not to the next poll.
                if matches!(
                    e,
                    ApiError::Conflict {
                        code: "session_expired",
                        ..
                    }
                ) {
                    place.pass_on();
                }
                return Err(e);
            }
        };
        if !claimed.leases.is_empty() {
            if claimed.leases.len() >= params.max as usize {
                place.pass_on();
            } else if let Some(token) = claimed.gate.next_token_in {
                // The rest wait for the next token.
                place.token_in(token);
            }
            return Ok(claimed);
        }
    }
}

/// One claim statement; a claim whose commit is unknown is answered 503
/// `commit_unknown`, for its client to give the session up (see [`claim`]).
async fn claim_once(state: &AppState, params: &LeaseClaim) -> Result<Claimed, ApiError> {
    state.metrics.claim_attempted();
    match state.store.lease_claim(params.clone()).await {
        Ok(claimed) => Ok(claimed),
        Err(e) => {
            if e.is_commit_unknown() {
                tracing::warn!(session = %params.session, error = %e, "a claim's commit is unknown; its client gives the session up");
            }
            Err(e.into())
        }
    }
}

/// Records a run's outcome, checked against the session and the fencing token:
/// 409 (changing nothing) when the lease was lost or the session expired.
#[utoipa::path(
    post, operation_id = "complete", path = "/v1/leases/complete", tag = "work",
    security(("bearer" = [])),
    request_body = CompleteRequest,
    responses(
        (status = 204, description = "Recorded"),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 409, description = "The lease was lost or the session expired", body = ErrorBody),
        (status = 422, description = "A lease naming a key or process no lease can have (empty, over 1024 bytes, a NUL)", body = ErrorBody),
        (status = 503, description = "`key_busy`: another transaction holds the key's row, nothing was written: send the outcome again. `unavailable`: the database, nothing was written. `commit_unknown`: the outcome may have been written: send it again (one recorded is answered 204)", body = ErrorBody),
    )
)]
pub(crate) async fn complete(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CompleteRequest>,
) -> Result<StatusCode, ApiError> {
    check_outcome(&body.outcome, "outcome.after_ms")?;
    let trace_id = trace_id(body.trace_id.as_deref(), "trace_id")?;
    let lease = body.lease.to_lease()?;
    state.check_owner(&auth, lease.session).await?;
    let outcome = body.outcome.to_outcome();
    let one = [LeaseComplete {
        lease: &lease,
        outcome: &outcome,
        trace_id,
    }];
    let written = state.store.lease_complete_written(&one).await?;
    // One answer per completion (the store's contract).
    let written = written.into_iter().next().transpose()?;
    let started = state.handed.ended(&lease);
    if written.is_some_and(|w| counted_now(w, started)) {
        let now = chrono::Utc::now();
        let timed = timed_from(started, &lease, now);
        state
            .metrics
            .completed(&lease.process, outcome.name(), timed, now);
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Whether an outcome the store answered `Ok` goes into the metrics now, so
/// each is counted once however often its worker sends it: one this call
/// wrote; or one an earlier try wrote (its answer lost) that this server
/// handed out and has not seen end (`started`), as when that try's commit
/// was unknown: it counted nothing then. A retry of one this server
/// answered was counted then.
fn counted_now(written: Written, started: Option<chrono::DateTime<chrono::Utc>>) -> bool {
    written == Written::Now || started.is_some()
}

/// The longest run timed from the start its worker sent back.
const TRUSTED_RUN: chrono::TimeDelta = chrono::TimeDelta::days(1);

/// When a run is timed from: when this server handed its lease out
/// (`handed`), never from a start its worker sends back when it did; for a
/// lease another server over the same database handed out (or this one,
/// before a restart), from the start the worker sent if it is plausible,
/// not in the future and within a day, so no caller can put years into a
/// histogram every operator reads; otherwise the run is not timed.
fn timed_from(
    handed: Option<chrono::DateTime<chrono::Utc>>,
    lease: &Lease,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    handed.or_else(|| {
        let sent = lease.started_at;
        (sent <= now && now - sent <= TRUSTED_RUN).then_some(sent)
    })
}

/// A requeue delay the store would refuse is the caller's mistake: a 400
/// naming the field, before anything is written.
fn check_outcome(outcome: &OutcomeBody, field: &str) -> Result<(), ApiError> {
    match outcome {
        OutcomeBody::RequeueAfter { after_ms } if *after_ms > max_delay_ms() => {
            Err(ApiError::field(
                field,
                format!("after_ms must be at most {}", max_delay_ms()),
            ))
        }
        _ => Ok(()),
    }
}

/// A run's trace id as sent: absent, or 32 lowercase hex digits (a 400
/// naming `field` otherwise, before anything is written).
fn trace_id(sent: Option<&str>, field: &str) -> Result<Option<TraceId>, ApiError> {
    sent.map(TraceId::parse)
        .transpose()
        .map_err(|e| ApiError::field(field, e.to_string()))
}

/// Records many runs' outcomes in one transaction (what `drover::client` sends,
/// so a remote worker commits as rarely as one on the database). Each lease is
/// checked on its own: a lost lease gets its own `lease_lost` /
/// `session_expired` result and changes nothing, while the rest commit; an
/// outcome the database could not write even alone gets the error's code
/// (`internal`, `unavailable`), and the worker may send it again.
#[utoipa::path(
    post, operation_id = "complete_batch", path = "/v1/leases/complete-batch", tag = "work",
    security(("bearer" = [])),
    request_body = CompleteBatchRequest,
    responses(
        (status = 200, description = "One result per completion, in order", body = CompleteBatchResponse),
        (status = 400, description = "Malformed body, or no or too many completions", body = ErrorBody),
        (status = 503, description = "The database is unavailable; nothing was written", body = ErrorBody),
        (status = 422, description = "A lease naming a key or process no lease can have (empty, over 1024 bytes, a NUL)", body = ErrorBody),
    )
)]
pub(crate) async fn complete_batch(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CompleteBatchRequest>,
) -> Result<Json<CompleteBatchResponse>, ApiError> {
    let count = body.completions.len();
    if !(1..=MAX_COMPLETE_BATCH).contains(&count) {
        return Err(ApiError::field(
            "completions",
            format!("a batch holds 1 to {MAX_COMPLETE_BATCH} completions, got {count}"),
        ));
    }
    let mut trace_ids = Vec::with_capacity(count);
    for (i, completion) in body.completions.iter().enumerate() {
        check_outcome(
            &completion.outcome,
            &format!("completions[{i}].outcome.after_ms"),
        )?;
        let field = format!("completions[{i}].trace_id");
        trace_ids.push(trace_id(completion.trace_id.as_deref(), &field)?);
    }
    let runs: Vec<(Lease, Outcome)> = body
        .completions
        .iter()
        .map(|c| Ok((c.lease.to_lease()?, c.outcome.to_outcome())))
        .collect::<Result<_, StoreError>>()?;
    let mut sessions: Vec<SessionId> = runs.iter().map(|(lease, _)| lease.session).collect();
    sessions.sort_unstable_by_key(|s| s.0);
    sessions.dedup();
    // Leases of a session the database does not know are answered as after
    // it expired, without reaching the store (see `owner.rs`).
    let unknown = state
        .owners
        .check_all(&state.store, auth.owner.as_deref(), &sessions)
        .await?;
    let batch: Vec<LeaseComplete<'_>> = runs
        .iter()
        .zip(trace_ids)
        .filter(|((lease, _), _)| !unknown.contains(&lease.session))
        .map(|((lease, outcome), trace_id)| LeaseComplete {
            lease,
            outcome,
            trace_id,
        })
        .collect();
    let written = if batch.is_empty() {
        Vec::new()
    } else {
        state.store.lease_complete_written(&batch).await?
    };
    if written.len() != batch.len() {
        tracing::error!(
            sent = batch.len(),
            answered = written.len(),
            "a completion batch was not answered once per completion"
        );
        return Err(ApiError::Internal);
    }
    let mut written = written.into_iter();
    let results: Vec<Result<Written, StoreError>> = runs
        .iter()
        .filter_map(|(lease, _)| {
            if unknown.contains(&lease.session) {
                Some(Err(StoreError::SessionExpired {
                    session: lease.session,
                }))
            } else {
                written.next()
            }
        })
        .collect();
    let now = chrono::Utc::now();
    let results = results
        .into_iter()
        .zip(&runs)
        .map(|(result, (lease, outcome))| match result {
            Ok(written) => {
                let started = state.handed.ended(lease);
                if counted_now(written, started) {
                    let timed = timed_from(started, lease, now);
                    state
                        .metrics
                        .completed(&lease.process, outcome.name(), timed, now);
                }
                CompletionResult {
                    error: None,
                    message: None,
                }
            }
            // The others committed: this one alone is refused (a lost lease)
            // or could not be written (the worker may retry it).
            Err(e) => {
                let body = ApiError::from(e).body();
                CompletionResult {
                    error: Some(body.error),
                    message: Some(format!(
                        "{}/{} (token {}): {}",
                        lease.process, lease.key, lease.token, body.message
                    )),
                }
            }
        })
        .collect();
    Ok(Json(CompleteBatchResponse { results }))
}

/// Gives a lease back without an outcome: the key is pending at once and no
/// failure is counted. 409 when the lease was already lost.
#[utoipa::path(
    post, operation_id = "release", path = "/v1/leases/release", tag = "work",
    security(("bearer" = [])),
    request_body = ReleaseRequest,
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 409, description = "The lease was lost or the session expired", body = ErrorBody),
        (status = 422, description = "A lease naming a key or process no lease can have (empty, over 1024 bytes, a NUL)", body = ErrorBody),
    )
)]
pub(crate) async fn release(
    auth: Authorized<Work>,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ReleaseRequest>,
) -> Result<StatusCode, ApiError> {
    let lease = body.lease.to_lease()?;
    state.check_owner(&auth, lease.session).await?;
    state
        .store
        .lease_release(LeaseRelease { lease: &lease })
        .await?;
    state.handed.ended(&lease);
    Ok(StatusCode::NO_CONTENT)
}
