//! [`WorkerBackend`] for [`Client`]: the worker's calls as HTTP requests.

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Method;

use super::http::{CALL_TIMEOUT, Client, Failure};
use crate::api::{
    ClaimRequest, ClaimResponse, CloseResponse, CompleteBatchRequest, CompleteBatchResponse,
    CompleteRequest, CompletionResult, HeartbeatResponse, LeaseRef, MAX_COMPLETE_BATCH,
    OutcomeBody, ReleaseRequest, SessionBody, SessionRequest, TraceContextBody, TraceLinkRequest,
};
use crate::store::{
    ClaimGate, Claimed, Lease, LeaseClaim, LeaseComplete, LeaseRelease, MAX_TEXT_BYTES, Outcome,
    ProcessConfigure, RemoteError, Session, SessionClose, SessionHeartbeat, SessionId,
    SessionStart, StoreError, TraceContext, WorkerBackend, clean_text,
};

/// The most bytes of completions one request carries: half the server's
/// default body limit (1 MiB), so a batch of long error texts still fits.
const MAX_BATCH_BYTES: usize = 512 * 1024;

/// How much longer than the long-poll itself a claim may take to answer.
const CLAIM_SLACK: Duration = Duration::from_secs(10);

impl WorkerBackend for Client {
    const RECLAIMS: bool = false;

    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        let body = SessionRequest {
            component: params.component,
            ttl_ms: millis(params.ttl),
            host: params.identity.host,
            pid: params.identity.pid,
            version: params.identity.version,
        };
        let session: SessionBody = self
            .call(Method::POST, "/v1/sessions", Some(&body), CALL_TIMEOUT)
            .await
            .map_err(Failure::into_store)?;
        Ok(Session {
            id: SessionId(session.id),
            component: session.component,
            ttl: Duration::from_millis(session.ttl_ms),
            deadline: session.deadline,
        })
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        let path = format!("/v1/sessions/{}/heartbeat", params.session);
        let answer: HeartbeatResponse = self
            .call(Method::POST, &path, None::<&()>, CALL_TIMEOUT)
            .await
            .map_err(|f| session_failure(f, params.session))?;
        Ok(answer.deadline)
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        let path = format!("/v1/sessions/{}", params.session);
        let answer: CloseResponse = self
            .call(Method::DELETE, &path, None::<&()>, CALL_TIMEOUT)
            .await
            .map_err(Failure::into_store)?;
        Ok(answer.released)
    }

    async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> Result<Claimed, StoreError> {
        let path = format!("/v1/sessions/{}/claim", params.session);
        let body = ClaimRequest {
            process: params.process,
            max: params.max.max(1),
            wait_ms: millis(wait),
            trace_links: params.trace_links,
        };
        let answer: ClaimResponse = self
            .call(Method::POST, &path, Some(&body), wait + CLAIM_SLACK)
            .await
            .map_err(|f| session_failure(f, params.session))?;
        Ok(Claimed {
            leases: answer.leases.into_iter().map(Lease::from).collect(),
            gate: ClaimGate {
                paused: answer.paused,
                // The server wakes its long-polls when a slot comes free.
                concurrency_limited: false,
                next_token_in: answer.next_token_in_ms.map(Duration::from_millis),
            },
        })
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut results = Vec::with_capacity(batch.len());
        for chunk in chunks(batch) {
            let request = CompleteBatchRequest {
                completions: chunk.iter().map(completion).collect(),
            };
            let path = "/v1/leases/complete-batch";
            let answer: Result<CompleteBatchResponse, Failure> = self
                .call(Method::POST, path, Some(&request), CALL_TIMEOUT)
                .await;
            // An earlier chunk may have committed: a chunk that fails is
            // answered per completion, so each is retried (a retry of one that
            // did commit is refused as lost, which is harmless).
            let failed = match answer {
                Ok(answer) if answer.results.len() == chunk.len() => {
                    let each = chunk.iter().zip(&answer.results);
                    results.extend(each.map(|(sent, result)| refusal(sent.lease, result)));
                    continue;
                }
                Ok(answer) => RemoteError {
                    message: format!(
                        "the server answered {} results for {} completions",
                        answer.results.len(),
                        chunk.len()
                    ),
                    status: None,
                    unknown: true,
                },
                Err(failure) => failure.into_remote(),
            };
            results.extend(
                chunk
                    .iter()
                    .map(|_| Err(StoreError::Remote(failed.clone()))),
            );
        }
        Ok(results)
    }

    async fn item_trace_link(
        &self,
        lease: &Lease,
        context: &TraceContext,
    ) -> Result<(), StoreError> {
        let body = TraceLinkRequest {
            lease: LeaseRef::from(lease),
            context: TraceContextBody {
                traceparent: context.traceparent().to_owned(),
                tracestate: context.tracestate().map(str::to_owned),
            },
        };
        let answer: Result<(), Failure> = self
            .call(
                Method::POST,
                "/v1/leases/trace-link",
                Some(&body),
                CALL_TIMEOUT,
            )
            .await;
        answer.map_err(|f| lease_failure(f, lease))
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        let body = ReleaseRequest {
            lease: LeaseRef::from(params.lease),
        };
        let answer: Result<(), Failure> = self
            .call(
                Method::POST,
                "/v1/leases/release",
                Some(&body),
                CALL_TIMEOUT,
            )
            .await;
        answer.map_err(|f| lease_failure(f, params.lease))
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        Err(StoreError::InvalidArgument(format!(
            "the backoff policy of {} is set where its database is: configure it from a \
             worker or `drover` command on the database, not over the HTTP API",
            params.process
        )))
    }
}

/// Splits a batch into requests within [`MAX_COMPLETE_BATCH`] completions and
/// about [`MAX_BATCH_BYTES`] of error text.
fn chunks<'b, 'a>(batch: &'b [LeaseComplete<'a>]) -> Vec<&'b [LeaseComplete<'a>]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in batch.iter().enumerate() {
        let size = 256 + c.lease.key.len() + c.lease.process.len() + error_len(c);
        if i > start && (i - start == MAX_COMPLETE_BATCH || bytes + size > MAX_BATCH_BYTES) {
            out.push(&batch[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < batch.len() {
        out.push(&batch[start..]);
    }
    out
}

/// The error text's size as [`completion`] sends it.
fn error_len(c: &LeaseComplete<'_>) -> usize {
    match c.outcome {
        Outcome::Transient(e) | Outcome::Permanent(e) => e.len().min(MAX_TEXT_BYTES),
        Outcome::Done | Outcome::RequeueAfter(_) => 0,
    }
}

/// One completion as the API takes it, its error text cleaned as the store
/// would store it: a huge error then cannot make every retry of the request
/// too large for the server (a 413, and the key never parked).
fn completion(c: &LeaseComplete<'_>) -> CompleteRequest {
    let mut outcome = OutcomeBody::from(c.outcome);
    if let OutcomeBody::Transient { error } | OutcomeBody::Permanent { error } = &mut outcome
        && let Cow::Owned(cleaned) = clean_text(error)
    {
        *error = cleaned;
    }
    CompleteRequest {
        lease: LeaseRef::from(c.lease),
        outcome,
        trace_id: c.trace_id.map(|id| id.to_string()),
    }
}

/// One completion's result in the store's words: a lost lease or session as
/// the store says them, any other code (the server could not write this one)
/// as a remote error the completer retries.
fn refusal(lease: &Lease, result: &CompletionResult) -> Result<(), StoreError> {
    match result.error.as_deref() {
        None => Ok(()),
        Some(code @ ("lease_lost" | "session_expired")) => {
            Err(lease_failure(Failure::Conflict(code.to_owned()), lease))
        }
        Some(code) => Err(StoreError::Remote(RemoteError {
            message: format!("{code}: {}", result.message.as_deref().unwrap_or("")),
            status: None,
            unknown: false,
        })),
    }
}

/// A refused session call: `session_expired` as the store says it.
fn session_failure(failure: Failure, session: SessionId) -> StoreError {
    match failure {
        Failure::Conflict(code) if code == "session_expired" => {
            StoreError::SessionExpired { session }
        }
        other => other.into_store(),
    }
}

/// A refused lease call: `lease_lost` / `session_expired` as the store says them.
fn lease_failure(failure: Failure, lease: &Lease) -> StoreError {
    match failure {
        Failure::Conflict(code) if code == "lease_lost" => StoreError::lease_lost(lease),
        Failure::Conflict(code) if code == "session_expired" => StoreError::SessionExpired {
            session: lease.session,
        },
        other => other.into_store(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FencingToken;

    #[test]
    fn a_batch_result_is_final_only_for_a_lost_lease_or_session() {
        let lease = Lease {
            session: SessionId(7),
            process: "p".into(),
            key: "k".into(),
            token: FencingToken(3),
            attempt: 1,
            priority: 0,
            enqueued_at: DateTime::<Utc>::UNIX_EPOCH,
            started_at: DateTime::<Utc>::UNIX_EPOCH,
            trace_links: None,
        };
        let result = |code: Option<&str>| CompletionResult {
            error: code.map(str::to_owned),
            message: Some("why".into()),
        };
        assert!(refusal(&lease, &result(None)).is_ok());
        let lost = refusal(&lease, &result(Some("lease_lost"))).unwrap_err();
        assert!(matches!(
            lost,
            StoreError::LeaseLost {
                token: FencingToken(3),
                ..
            }
        ));
        let expired = refusal(&lease, &result(Some("session_expired"))).unwrap_err();
        assert!(matches!(
            expired,
            StoreError::SessionExpired {
                session: SessionId(7)
            }
        ));
        // Not written, for a reason of the server's: the completer retries it.
        let failed = refusal(&lease, &result(Some("internal"))).unwrap_err();
        assert!(
            !failed.is_lease_rejection() && failed.is_transient(),
            "{failed}"
        );
    }
}
