//! [`Client`]: requests to a drover server and the mapping of its answers.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::ErrorBody;
use crate::store::{RemoteError, StoreError, error_chain};

/// How long a request other than a long-polling claim may take.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A drover server reached over HTTP, with an optional bearer token. Cheap to
/// clone; clones share the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Arc<str>,
    token: Option<Arc<str>>,
}

/// How a call failed before the caller's own mapping.
#[derive(Debug)]
pub(super) enum Failure {
    /// A 409 with its code (`lease_lost`, `session_expired`, …).
    Conflict(String),
    /// Anything else.
    Remote(RemoteError),
}

impl Failure {
    /// As a remote error; a conflict the caller did not map names its code.
    pub(super) fn into_remote(self) -> RemoteError {
        match self {
            Self::Conflict(code) => RemoteError {
                message: format!("409 {code}"),
                status: Some(409),
                unknown: false,
            },
            Self::Remote(remote) => remote,
        }
    }

    /// As a store error (see [`into_remote`](Self::into_remote)).
    pub(super) fn into_store(self) -> StoreError {
        StoreError::Remote(self.into_remote())
    }
}

impl Client {
    /// A client for the server at `base` (`http://host:port`, or `https://…`,
    /// perhaps with a path prefix). Anything else (another scheme, no host,
    /// a URL that does not parse, a query) is refused at once, not at the
    /// first request.
    pub fn new(base: &str) -> Result<Self, StoreError> {
        let trimmed = base.trim_end_matches('/');
        // Redacted: the URL may carry credentials, sent as Basic auth.
        let invalid = |reason: String| StoreError::InvalidServerUrl {
            url: crate::store::redact_url(base),
            reason,
        };
        let expected = "expected http://HOST:PORT or https://…";
        let url = reqwest::Url::parse(trimmed).map_err(|e| invalid(format!("{e}; {expected}")))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(invalid(expected.into()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid(
                "a query or fragment cannot be part of a server's base URL".into(),
            ));
        }
        // A drover server closes a connection idle for its client timeout
        // (30 s by default): dropping ours well before means a request is
        // never sent on one the server is closing, which would leave its
        // outcome unknown.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| {
                StoreError::InvalidArgument(format!("cannot build the HTTP client: {e}"))
            })?;
        Ok(Self {
            http,
            base: trimmed.into(),
            token: None,
        })
    }

    /// Sends `token` as the bearer token of every request (a worker's or an
    /// admin's, for a server started with tokens).
    #[must_use]
    pub fn token(self, token: impl Into<String>) -> Self {
        Self {
            token: Some(token.into().into()),
            ..self
        }
    }

    /// The server's base URL.
    #[must_use]
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends one request and parses its JSON answer (`()` for 204).
    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        timeout: Duration,
    ) -> Result<T, Failure> {
        let what = format!("{method} {path}");
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(&**token);
        }
        let response = request.send().await.map_err(|e| transport(&what, &e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| transport(&what, &e))?;
        if status.is_success() {
            let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
            // The request was applied, but what it did cannot be read (a
            // proxy's page, a cut answer): a claim may have leased keys
            // nobody will hear of, so it is unknown, as a lost answer is.
            return serde_json::from_slice(bytes).map_err(|e| {
                Failure::Remote(RemoteError {
                    message: format!("{what}: the answer does not parse: {e}"),
                    status: Some(status.as_u16()),
                    unknown: true,
                })
            });
        }
        Err(refusal(&what, status, &bytes))
    }
}

/// A request that got no answer: refused before sending (nothing applied) or
/// lost after (maybe applied).
fn transport(what: &str, e: &reqwest::Error) -> Failure {
    // reqwest's own message is generic ("error sending request"): the cause
    // (refused, reset, timed out) is in its sources.
    Failure::Remote(RemoteError {
        message: format!("{what}: {}", error_chain(e)),
        status: None,
        unknown: !e.is_connect() && !e.is_builder(),
    })
}

/// An error status with the server's [`ErrorBody`], when it sent one.
///
/// A 5xx that is not drover's own answer (no [`ErrorBody`]: a gateway's or
/// a load balancer's page, as nginx's 502 and 504 or envoy's 503 "upstream
/// reset") says nothing of what drover did with the request: the gateway
/// may have given up on it after drover took it, and a claim may then have
/// leased keys. It is unknown, as a request whose answer never came.
/// Taken for "nothing applied", a claim's lost leases stayed with a session
/// its worker kept alive, and their keys never ran again.
fn refusal(what: &str, status: StatusCode, bytes: &[u8]) -> Failure {
    let body = serde_json::from_slice::<ErrorBody>(bytes).ok();
    let code = body.as_ref().map_or("", |b| b.error.as_str());
    if status == StatusCode::CONFLICT {
        return Failure::Conflict(code.to_owned());
    }
    let message = body.as_ref().map_or_else(
        || String::from_utf8_lossy(bytes).chars().take(200).collect(),
        |b| b.message.clone(),
    );
    let unknown = match &body {
        Some(body) => body.error == "commit_unknown",
        None => status.is_server_error(),
    };
    Failure::Remote(RemoteError {
        message: format!("{what}: {status}: {message}"),
        status: Some(status.as_u16()),
        unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, code: &str) -> Failure {
        let body = format!(r#"{{"error":"{code}","message":"why"}}"#);
        refusal(
            "POST /x",
            StatusCode::from_u16(status).unwrap(),
            body.as_bytes(),
        )
    }

    #[test]
    fn a_servers_refusal_maps_to_what_the_worker_does_next() {
        assert!(matches!(answer(409, "lease_lost"), Failure::Conflict(c) if c == "lease_lost"));
        // Maybe applied: a claim in this state gives its session up.
        let unknown = answer(503, "commit_unknown").into_store();
        assert!(
            unknown.is_commit_unknown() && !unknown.is_transient(),
            "{unknown}"
        );
        // Nothing applied, worth retrying.
        let down = answer(503, "unavailable").into_store();
        assert!(!down.is_commit_unknown() && down.is_transient(), "{down}");
        // The caller's mistake: retrying cannot help.
        let token = answer(401, "unauthorized").into_store();
        assert!(
            !token.is_commit_unknown() && !token.is_transient(),
            "{token}"
        );
        // Not JSON (a proxy's page): still a clear error with the status,
        // and, a 5xx, maybe applied: the gateway may have given up on a
        // request drover took.
        let page = refusal("POST /x", StatusCode::BAD_GATEWAY, b"<html>oops").into_store();
        assert!(
            page.is_commit_unknown() && page.to_string().contains("502"),
            "{page}"
        );
        // A proxy's 4xx page: the request went no further.
        let page = refusal("POST /x", StatusCode::FORBIDDEN, b"<html>no").into_store();
        assert!(!page.is_commit_unknown(), "{page}");
    }

    /// A URL no request could be sent to is refused when the client is made
    /// (a worker then stops at once with one line), not at its first request
    /// (`http://[::1` started `drover work` and failed its session with
    /// reqwest's "builder error"); the error names the server's URL, not a
    /// database's, with its password hidden.
    #[test]
    fn a_server_url_no_request_could_go_to_is_refused_at_once() {
        for bad in [
            "htp://x",
            "http://",
            "localhost:7420",
            "http://[::1",
            "http://h:1/?token=t",
            "http://u:secret@h:1/#x",
        ] {
            let err = Client::new(bad).map(|_| ()).expect_err(bad);
            let text = err.to_string();
            assert!(
                matches!(err, StoreError::InvalidServerUrl { .. })
                    && text.starts_with("invalid server URL")
                    && !text.contains("secret"),
                "{bad}: {text}"
            );
        }
        for good in [
            "http://127.0.0.1:7420",
            "https://drover.example/base/",
            "http://[::1]:1",
        ] {
            let client = Client::new(good).expect(good);
            assert_eq!(client.base_url(), good.trim_end_matches('/'));
        }
    }
}
