//! Leases on the wire: claiming keys, and completing or releasing them by
//! fencing token.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::limits::millis;
#[cfg(feature = "server")]
use super::limits::ms;
use crate::store::{Lease, Outcome, TraceContext, TraceLinks};

/// Body of `POST /v1/sessions/{session}/claim`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The process to claim from.
    pub process: String,
    /// At most this many leases (at least 1, default 1). One answer holds at
    /// most 1000 (`MAX_CLAIM`): ask again for the rest.
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1, format = Int64, maximum = 4294967295_u64)]
    pub max: u32,
    /// When nothing is ready, wait up to this many milliseconds for work
    /// (default 0; a longer wait than the server's maximum, 60 s unless
    /// configured, is cut to it).
    #[serde(default)]
    pub wait_ms: u64,
    /// Return each lease's `trace_links` (default false): ask when the
    /// worker traces its runs, so each run's span can link to the enqueues
    /// it absorbed. The claim reads them with the keys it leases.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trace_links: bool,
}

fn one() -> u32 {
    1
}

/// A lease: proof that its holder alone may work on the key.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseBody {
    /// The holding session.
    pub session: i64,
    /// The process.
    pub process: String,
    /// The key to work on.
    pub key: String,
    /// The fencing token completions are checked against.
    pub token: i64,
    /// Which consecutive attempt this is.
    pub attempt: u32,
    /// The item's priority.
    pub priority: i32,
    /// When the enqueue this run answers arrived.
    pub enqueued_at: DateTime<Utc>,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// The W3C contexts of the enqueues this run absorbed, when the claim
    /// asked for them (`trace_links`) and there are any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_links: Option<TraceLinksBody>,
}

/// The W3C trace contexts of the enqueues a run absorbed (DESIGN.md rule
/// 14): its span links to each, as the OpenTelemetry messaging conventions
/// describe for a batch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TraceLinksBody {
    /// The first and the last 8 contexts, oldest first.
    pub links: Vec<TraceContextBody>,
    /// How many contexts between them were dropped.
    #[serde(default)]
    pub dropped: u64,
}

/// One W3C trace context (<https://www.w3.org/TR/trace-context/>).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TraceContextBody {
    /// `00-<trace id>-<span id>-<flags>`, lowercase hex, neither id all
    /// zeros: what [`TraceContext::new`](crate::store::TraceContext::new)
    /// accepts.
    #[schema(
        example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        pattern = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
    )]
    pub traceparent: String,
    /// The vendors' `tracestate`, when the enqueue carried one (printable
    /// ASCII, at most 512 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 512, pattern = "^[ -~]*$")]
    pub tracestate: Option<String>,
}

impl From<TraceLinks> for TraceLinksBody {
    fn from(links: TraceLinks) -> Self {
        Self {
            links: links
                .links
                .iter()
                .map(|c| TraceContextBody {
                    traceparent: c.traceparent().to_owned(),
                    tracestate: c.tracestate().map(str::to_owned),
                })
                .collect(),
            dropped: links.dropped,
        }
    }
}

impl From<TraceLinksBody> for TraceLinks {
    /// A context that is not valid W3C is left out: a link is a help for
    /// debugging, never a reason to fail a run.
    fn from(body: TraceLinksBody) -> Self {
        Self {
            links: body
                .links
                .iter()
                .filter_map(|c| TraceContext::new(&c.traceparent, c.tracestate.as_deref()).ok())
                .collect(),
            dropped: body.dropped,
        }
    }
}

impl From<Lease> for LeaseBody {
    fn from(l: Lease) -> Self {
        Self {
            session: l.session.0,
            process: l.process,
            key: l.key,
            token: l.token.0,
            attempt: l.attempt,
            priority: l.priority,
            enqueued_at: l.enqueued_at,
            started_at: l.started_at,
            trace_links: l
                .trace_links
                .filter(|links| !links.is_empty())
                .map(Into::into),
        }
    }
}

/// Response of a claim.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimResponse {
    /// The leases; empty when nothing became ready within the wait.
    pub leases: Vec<LeaseBody>,
    /// The process is paused: nothing is claimed until it is resumed.
    #[serde(default)]
    pub paused: bool,
    /// The process's rate limit held the claim back (fewer leases than asked
    /// though more may be ready): its next token comes in this many
    /// milliseconds. Claim again then, not at the next poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub next_token_in_ms: Option<u64>,
}

/// A lease as a worker sends it back: the object a claim returned (the fields
/// that only describe it may be left out).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    /// The holding session.
    pub session: i64,
    /// The process.
    pub process: String,
    /// The key.
    pub key: String,
    /// The fencing token.
    pub token: i64,
    /// The attempt (recorded in the history).
    #[schema(minimum = 1, format = Int64, maximum = 4294967295_u64)]
    pub attempt: u32,
    /// Ignored.
    #[serde(default)]
    pub priority: Option<i32>,
    /// Ignored.
    #[serde(default)]
    pub enqueued_at: Option<DateTime<Utc>>,
    /// When the run started, for the work-duration metric of a lease another
    /// server handed out (or this one before a restart), if it is within a
    /// day and not in the future; a server times the leases it handed out
    /// from when it did, whatever is sent here.
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
}

impl From<&Lease> for LeaseRef {
    fn from(l: &Lease) -> Self {
        Self {
            session: l.session.0,
            process: l.process.clone(),
            key: l.key.clone(),
            token: l.token.0,
            attempt: l.attempt,
            priority: Some(l.priority),
            enqueued_at: Some(l.enqueued_at),
            started_at: Some(l.started_at),
        }
    }
}

impl From<LeaseBody> for Lease {
    fn from(l: LeaseBody) -> Self {
        Self {
            session: crate::store::SessionId(l.session),
            process: l.process,
            key: l.key,
            token: crate::store::FencingToken(l.token),
            attempt: l.attempt,
            priority: l.priority,
            enqueued_at: l.enqueued_at,
            started_at: l.started_at,
            trace_links: l.trace_links.map(Into::into),
        }
    }
}

impl LeaseRef {
    /// The store's lease; the described-only fields are filled with neutral
    /// values the store does not check. A process or key that no lease can
    /// have (empty, over 1024 bytes, a NUL) is refused here, as the routes
    /// that take names refuse it (422): PostgreSQL would refuse the NUL
    /// itself, as an internal error.
    #[cfg(feature = "server")] // read by the server only
    pub(crate) fn to_lease(&self) -> Result<Lease, crate::store::StoreError> {
        crate::store::validate_process(&self.process)?;
        crate::store::validate_key(&self.key)?;
        Ok(Lease {
            session: crate::store::SessionId(self.session),
            process: self.process.clone(),
            key: self.key.clone(),
            token: crate::store::FencingToken(self.token),
            attempt: self.attempt,
            priority: self.priority.unwrap_or(0),
            enqueued_at: self.enqueued_at.unwrap_or_default(),
            started_at: self.started_at.unwrap_or_default(),
            trace_links: None,
        })
    }
}

/// What processing a key returned.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OutcomeBody {
    /// Converged: the item stays, idle (or pending again if it was enqueued
    /// meanwhile). A variant with no fields rather than a unit one, so that
    /// unknown fields are refused here too (serde ignores them beside the tag
    /// of a unit variant).
    Done {},
    /// Converged for now; look again after `after_ms`.
    RequeueAfter {
        /// The delay in milliseconds (at most 180 days).
        #[schema(maximum = 15552000000_u64)]
        after_ms: u64,
    },
    /// Failed, worth retrying after the process's backoff.
    Transient {
        /// What went wrong.
        error: String,
    },
    /// Failed for good: parked until the next enqueue.
    Permanent {
        /// What went wrong.
        error: String,
    },
}

impl From<&Outcome> for OutcomeBody {
    fn from(o: &Outcome) -> Self {
        match o {
            Outcome::Done => Self::Done {},
            Outcome::RequeueAfter(after) => Self::RequeueAfter {
                after_ms: millis(*after),
            },
            Outcome::Transient(error) => Self::Transient {
                error: error.clone(),
            },
            Outcome::Permanent(error) => Self::Permanent {
                error: error.clone(),
            },
        }
    }
}

impl OutcomeBody {
    /// The store's outcome.
    #[cfg(feature = "server")] // read by the server only
    pub(crate) fn to_outcome(&self) -> Outcome {
        match self {
            Self::Done {} => Outcome::Done,
            Self::RequeueAfter { after_ms } => Outcome::RequeueAfter(ms(*after_ms)),
            Self::Transient { error } => Outcome::Transient(error.clone()),
            Self::Permanent { error } => Outcome::Permanent(error.clone()),
        }
    }
}

/// Body of `POST /v1/leases/complete`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The lease, as the claim returned it.
    pub lease: LeaseRef,
    /// How the run went.
    pub outcome: OutcomeBody,
    /// The trace id of the run's span (32 lowercase hex digits), when the
    /// worker traced the run and sampled it: kept with the run's history row
    /// (`trace_id` of a run), so the run can be found in a tracing UI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = "^[0-9a-f]{32}$",
        example = "4bf92f3577b34da6a3ce929d0e0e4736"
    )]
    pub trace_id: Option<String>,
}

/// Body of `POST /v1/leases/complete-batch`: many outcomes, one transaction.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBatchRequest {
    /// The completions (1–4096), each checked against its own lease.
    #[schema(min_items = 1, max_items = 4096)]
    pub completions: Vec<CompleteRequest>,
}

/// What became of one completion of a batch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompletionResult {
    /// Null when the outcome was recorded; otherwise why this lease alone
    /// changed nothing: `lease_lost` or `session_expired` (final), or the code
    /// of an error that kept it from being written (`key_busy`: another
    /// transaction holds the key's row; `internal`, `unavailable`: it may be
    /// sent again).
    pub error: Option<String>,
    /// The refusal's message, when refused.
    pub message: Option<String>,
}

/// Response of `POST /v1/leases/complete-batch`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CompleteBatchResponse {
    /// One result per completion, in the request's order.
    pub results: Vec<CompletionResult>,
}

/// Body of `POST /v1/leases/trace-link`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TraceLinkRequest {
    /// The lease of the run that failed, as the claim returned it.
    pub lease: LeaseRef,
    /// The W3C context of the failed run's span, which the key's next run
    /// (its retry) links to.
    pub context: TraceContextBody,
}

/// Body of `POST /v1/leases/release`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The lease, as the claim returned it.
    pub lease: LeaseRef,
}
