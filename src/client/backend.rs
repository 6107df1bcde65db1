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
    ClaimGate, Claimed, Lease, LeaseClaim, LeaseComplete, LeaseRelease, Outcome, ProcessConfigure,
    RemoteError, Session, SessionClose, SessionHeartbeat, SessionId, SessionStart, StoreError,
    TraceContext, WorkerBackend, clean_text,
};

/// The most bytes of completions one request carries: half the server's
/// default body limit (1 MiB), so a batch of long error texts still fits.
const MAX_BATCH_BYTES: usize = 512 * 1024;

/// How much longer than the long-poll itself a claim may take to answer: as
/// long as any other request ([`CALL_TIMEOUT`]). A claim may rightly wait on
/// the server for a lock or a connection, and a claim given up is a session
/// given up (its answer is unknown), with every run under it.
const CLAIM_SLACK: Duration = CALL_TIMEOUT;

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
        self.lease_complete_batch_within(batch, CALL_TIMEOUT).await
    }

    /// Each request waits `within` at most (the completer passes a heartbeat
    /// interval): one whose answer does not come by then is maybe applied,
    /// and its completions fail as unknown, to be retried by their runs.
    async fn lease_complete_batch_within(
        &self,
        batch: &[LeaseComplete<'_>],
        within: Duration,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let within = within.min(CALL_TIMEOUT);
        let mut results: Vec<Option<Result<(), StoreError>>> = batch.iter().map(|_| None).collect();
        // Ranges of `batch` still to send, the next last, each with the most
        // bytes its error texts may take as JSON (`None`: as they are).
        let mut todo: Vec<(usize, usize, Option<usize>)> = chunks(batch)
            .into_iter()
            .rev()
            .map(|(start, end)| (start, end, None))
            .collect();
        while let Some((start, end, cut)) = todo.pop() {
            let chunk = &batch[start..end];
            let request = CompleteBatchRequest {
                completions: chunk.iter().map(|c| completion(c, cut)).collect(),
            };
            let path = "/v1/leases/complete-batch";
            let answer: Result<CompleteBatchResponse, Failure> =
                self.call(Method::POST, path, Some(&request), within).await;
            // An earlier chunk may have committed: a chunk that fails is
            // answered per completion, so each is retried (a retry of one that
            // did commit is answered as written).
            let failed = match answer {
                Ok(answer) if answer.results.len() == chunk.len() => {
                    let each = chunk.iter().zip(&answer.results);
                    for (at, (sent, result)) in (start..end).zip(each) {
                        results[at] = Some(refusal(sent.lease, result));
                    }
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
            if failed.status == Some(TOO_LARGE) {
                // The server takes smaller bodies than this one (its
                // `--body-limit`): nothing was written, so send it in halves,
                // and a lone completion with its error text cut shorter,
                // rather than fail it again at every retry until its lease
                // lapses and its key runs again.
                if end - start > 1 {
                    let middle = start + (end - start) / 2;
                    todo.push((middle, end, cut));
                    todo.push((start, middle, cut));
                    continue;
                }
                let now = cut.unwrap_or_else(|| error_len(&chunk[0]));
                if now > MIN_CUT {
                    todo.push((start, end, Some(now / 2)));
                    continue;
                }
            }
            for result in &mut results[start..end] {
                *result = Some(Err(StoreError::Remote(failed.clone())));
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every completion is answered"))
            .collect())
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
/// [`MAX_BATCH_BYTES`] of error text as JSON sends it, as ranges of `batch`.
fn chunks(batch: &[LeaseComplete<'_>]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in batch.iter().enumerate() {
        let size = 256 + json_len(&c.lease.key) + json_len(&c.lease.process) + error_len(c);
        if i > start && (i - start == MAX_COMPLETE_BATCH || bytes + size > MAX_BATCH_BYTES) {
            out.push((start, i));
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < batch.len() {
        out.push((start, batch.len()));
    }
    out
}

/// The HTTP status of a body over the server's limit.
const TOO_LARGE: u16 = 413;

/// The fewest bytes of error text (as JSON) a completion refused as too
/// large is cut to before its refusal is its answer.
const MIN_CUT: usize = 64;

/// The error text's size as [`completion`] sends it, as JSON: a control
/// character (a terminal's colours, a progress bar's carriage returns) takes
/// up to six bytes there, so the text's own length undercounted a batch of
/// them sixfold, and a batch the server refused whole (413) was sent again
/// at every retry until its leases lapsed.
fn error_len(c: &LeaseComplete<'_>) -> usize {
    match c.outcome {
        Outcome::Transient(e) | Outcome::Permanent(e) => json_len(&clean_text(e)),
        Outcome::Done | Outcome::RequeueAfter(_) => 0,
    }
}

/// The bytes `text` takes as a JSON string's contents (serde_json's escapes).
fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// `text` cut to at most `most` bytes as JSON, on a character boundary, with
/// an ellipsis saying so.
fn cut_to(text: &str, most: usize) -> String {
    let mut taken = 0;
    let mut end = 0;
    for (at, c) in text.char_indices() {
        let mut buf = [0; 4];
        taken += json_len(c.encode_utf8(&mut buf));
        if taken > most.saturating_sub(3) {
            break;
        }
        end = at + c.len_utf8();
    }
    format!("{}…", &text[..end])
}

/// One completion as the API takes it, its error text cleaned as the store
/// would store it (a huge error then cannot make every retry of the request
/// too large for the server), and cut to `cut` bytes as JSON when the server
/// refused it as too large.
fn completion(c: &LeaseComplete<'_>, cut: Option<usize>) -> CompleteRequest {
    let mut outcome = OutcomeBody::from(c.outcome);
    if let OutcomeBody::Transient { error } | OutcomeBody::Permanent { error } = &mut outcome {
        if let Cow::Owned(cleaned) = clean_text(error) {
            *error = cleaned;
        }
        if let Some(most) = cut
            && json_len(error) > most
        {
            *error = cut_to(error, most);
        }
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
        Some("key_busy") => Err(StoreError::KeyBusy {
            process: lease.process.clone(),
            key: lease.key.clone(),
        }),
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
    fn text_is_measured_and_cut_as_json_sends_it() {
        for text in [
            "plain",
            "\u{1b}[31mred\r\n",
            "quote \" and \\",
            "é\u{0}\u{7f}",
            "",
        ] {
            let sent = serde_json::to_string(text).expect("a string");
            assert_eq!(json_len(text), sent.len() - 2, "{text:?}");
        }
        let colours = "\u{1b}[1mé".repeat(100);
        let cut = cut_to(&colours, 50);
        assert!(json_len(&cut) <= 50, "{cut:?}");
        assert!(cut.ends_with('…') && colours.starts_with(cut.trim_end_matches('…')));
        assert_eq!(cut_to("é", 3), "…", "never inside a character");
    }

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
