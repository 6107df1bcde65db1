//! [`ApiError`]: every way a request can fail, mapped to one status and one JSON
//! body ([`ErrorBody`]) at a single place.
//!
//! Client errors (4xx) are decided before anything is written, so a rejected
//! request never changes state; only database trouble is a 5xx (503 when
//! retrying may help, 500 otherwise).

use std::fmt;

use crate::api::ErrorBody;
use crate::store::{StoreError, error_chain as chain};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::role::Role;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// 400: the request is malformed (bad JSON, a wrong type, a value out of range).
    #[error("{message}")]
    BadRequest {
        /// The field at fault, when known.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// 401: no token, or one the server does not know.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// 403: the token's role is below what the route needs.
    #[error("this needs the {needed} role; the token has {has}")]
    Forbidden {
        /// The role the route needs.
        needed: Role,
        /// The caller's role.
        has: Role,
    },
    /// 403 `cross_origin`: a browser made a state-changing request for another
    /// site's page (see [`CrossOrigin`]); decided before authentication.
    #[error(
        "cross-origin request refused: {0}; send it from the dashboard's own origin \
         or without a browser"
    )]
    CrossOrigin(CrossOrigin),
    /// 403: an open server (no tokens) was addressed by a name it does not
    /// answer to, as a DNS-rebinding page would address it (see `host.rs`).
    #[error(
        "this server has no tokens, so it answers only requests to an IP address or a \
         localhost name, not to {0:?}; add the name with --allowed-host, or give the server tokens"
    )]
    HostNotAllowed(String),
    /// 403 `not_your_session`: a token acted on a session another token
    /// started (see `owner.rs`).
    #[error(
        "session {0} was started with another token: only that token may heartbeat, claim, \
         complete or close it"
    )]
    NotYourSession(crate::store::SessionId),
    /// 429 `too_many_sessions`: a token that holds the server's cap of live
    /// sessions started another (see `routes/sessions.rs`).
    #[error(
        "this token holds {0} live sessions, the server's limit (--max-sessions-per-token): \
         close the sessions it no longer uses, or let them expire"
    )]
    TooManySessions(usize),
    /// 422 `too_many_processes`: an enqueue would create a process over the
    /// server's cap (see `known.rs`).
    #[error(
        "the database holds {0} processes, this server's limit (--max-processes): enqueue to \
         a process it holds, or raise the limit"
    )]
    TooManyProcesses(usize),
    /// 429 `too_many_waiting_claims`: a claim that would wait is over the
    /// server's or its session's cap of waiting claims (see `waiting.rs`).
    #[error("{0}: claim again later, or with wait_ms 0")]
    TooManyWaiting(String),
    /// 404: no such route, process, item or session.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists but not with this method.
    #[error("this route does not take this method")]
    MethodNotAllowed,
    /// 409: the request conflicts with the current state (a lost lease, an
    /// expired session, an item held by a worker).
    #[error("{message}")]
    Conflict {
        /// `lease_lost`, `session_expired` or `item_running`.
        code: &'static str,
        /// What conflicts.
        message: String,
    },
    /// 413: the body is over the server's limit.
    #[error("the request body is over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 408: the body did not arrive within the server's client timeout.
    #[error(
        "the request body did not arrive within {}s: send it whole without pausing, or ask for a longer --client-timeout",
        .0.as_secs_f64()
    )]
    RequestTimeout(std::time::Duration),
    /// 422: well-formed, but a key or process name breaks drover's rules (empty,
    /// over 1024 bytes, NUL).
    #[error("{message}")]
    Unprocessable {
        /// `invalid_key` or `invalid_process`.
        code: &'static str,
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// 503: the database is busy, unreachable, read-only or shutting down
    /// (the message says which); nothing was written and retrying later may
    /// succeed.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// 503 `key_busy`: another transaction (a caller's that enqueued the
    /// running key) holds the key's row; nothing was written: send the
    /// outcome again (drover's workers do, with their backoff). Not a 409:
    /// the lease still holds, and a worker that takes a 409 for final would
    /// drop the outcome.
    #[error("{0}")]
    KeyBusy(String),
    /// 503 `commit_unknown`: the database connection broke while committing,
    /// so the request may or may not have been applied.
    #[error(
        "the database connection failed while committing; the outcome is unknown: the write may have committed, check before repeating it"
    )]
    CommitUnknown,
    /// 500: anything else (logged with its cause).
    #[error("internal error")]
    Internal,
}

impl ApiError {
    /// A 400 naming `field`.
    pub(crate) fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadRequest {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// The response status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. }
            | Self::CrossOrigin(_)
            | Self::HostNotAllowed(_)
            | Self::NotYourSession(_) => StatusCode::FORBIDDEN,
            Self::TooManyWaiting(_) | Self::TooManySessions(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::TooManyProcesses(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) | Self::KeyBusy(_) | Self::CommitUnknown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body.
    #[must_use]
    pub fn body(&self) -> ErrorBody {
        let (code, field) = match self {
            Self::BadRequest { field, .. } => ("bad_request", field.clone()),
            Self::Unauthorized => ("unauthorized", None),
            Self::Forbidden { .. } => ("forbidden", None),
            Self::CrossOrigin(_) => ("cross_origin", None),
            Self::HostNotAllowed(_) => ("host_not_allowed", None),
            Self::NotYourSession(_) => ("not_your_session", None),
            Self::TooManyWaiting(_) => ("too_many_waiting_claims", None),
            Self::TooManySessions(_) => ("too_many_sessions", None),
            Self::TooManyProcesses(_) => ("too_many_processes", None),
            Self::NotFound(_) => ("not_found", None),
            Self::MethodNotAllowed => ("method_not_allowed", None),
            Self::Conflict { code, .. } => (*code, None),
            Self::PayloadTooLarge { .. } => ("payload_too_large", None),
            Self::RequestTimeout(_) => ("request_timeout", None),
            Self::Unprocessable { code, field, .. } => (*code, Some((*field).to_owned())),
            Self::Unavailable(_) => ("unavailable", None),
            Self::KeyBusy(_) => ("key_busy", None),
            Self::CommitUnknown => ("commit_unknown", None),
            Self::Internal => ("internal", None),
        };
        ErrorBody {
            error: code.to_owned(),
            message: self.to_string(),
            field,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if matches!(self, Self::Unauthorized) {
            let challenges = response.headers_mut();
            for challenge in [r#"Bearer realm="drover""#, r#"Basic realm="drover""#] {
                challenges.append(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
            }
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidKey { .. } => Self::Unprocessable {
                code: "invalid_key",
                field: "key",
                message: e.to_string(),
            },
            StoreError::InvalidProcess { .. } => Self::Unprocessable {
                code: "invalid_process",
                field: "process",
                message: e.to_string(),
            },
            StoreError::UnknownProcess(_) => Self::NotFound(e.to_string()),
            StoreError::InvalidArgument(message) => Self::BadRequest {
                field: None,
                message,
            },
            StoreError::SessionExpired { .. } => conflict("session_expired", &e),
            StoreError::LeaseLost { .. } => conflict("lease_lost", &e),
            StoreError::AlreadyLeased { .. }
            | StoreError::InBackoff { .. }
            | StoreError::Parked { .. } => conflict("item_running", &e),
            StoreError::Held { .. } => conflict("process_held", &e),
            StoreError::KeyBusy { .. } => Self::KeyBusy(e.to_string()),
            e if e.is_commit_unknown() => {
                tracing::warn!(error = %chain(&e), "commit unknown");
                Self::CommitUnknown
            }
            e if e.is_transient() => {
                tracing::warn!(error = %chain(&e), "database unavailable");
                Self::Unavailable(e.to_string())
            }
            e => {
                tracing::error!(error = %chain(&e), "request failed");
                Self::Internal
            }
        }
    }
}

fn conflict(code: &'static str, e: &StoreError) -> ApiError {
    ApiError::Conflict {
        code,
        message: e.to_string(),
    }
}

/// Why a state-changing request was taken for another site's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CrossOrigin {
    /// `Sec-Fetch-Site` was neither `same-origin` nor `none` (the value as
    /// sent, or `None` when it was not readable text).
    FetchSite(Option<String>),
    /// `Origin` names another host than the request's (`None`s as above).
    Origin {
        /// The `Origin` header.
        origin: Option<String>,
        /// The request's host (`Host`, or the authority of an absolute URI).
        host: Option<String>,
    },
}

impl fmt::Display for CrossOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |value: &Option<String>| value.clone().unwrap_or_else(|| "unreadable".into());
        match self {
            Self::FetchSite(site) => write!(f, "Sec-Fetch-Site is {}", shown(site)),
            Self::Origin { origin, host: None } => {
                write!(f, "Origin {} and the request names no host", shown(origin))
            }
            Self::Origin {
                origin,
                host: Some(host),
            } => write!(f, "Origin {} is not this server ({host})", shown(origin)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_rejections_map_to_client_statuses() {
        let key = StoreError::InvalidKey {
            key: String::new(),
            reason: "must not be empty",
        };
        assert_eq!(
            ApiError::from(key).status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        let lost = StoreError::LeaseLost {
            process: "p".into(),
            key: "k".into(),
            token: crate::store::FencingToken(1),
        };
        let lost = ApiError::from(lost);
        assert_eq!(lost.status(), StatusCode::CONFLICT);
        assert_eq!(lost.body().error, "lease_lost");
        let unknown = ApiError::from(StoreError::UnknownProcess("p".into()));
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_full_database_is_a_503_that_says_so_not_an_internal_error() {
        let disk = crate::store::DriverError(sqlx::Error::Protocol("disk full".into()));
        let full = ApiError::from(StoreError::Full(disk));
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = full.body();
        assert_eq!(body.error, "unavailable");
        assert!(body.message.contains("no room left"), "{}", body.message);
    }
}
