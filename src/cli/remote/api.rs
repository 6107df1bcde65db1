//! The worker half of drover's HTTP API (`/v1/sessions…`, `/v1/leases…`), as a
//! client.

use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::{Value, json};

/// How a call failed, in the terms the worker acts on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// 409: the session expired or the lease was lost; nothing was changed.
    #[error("{0}")]
    Conflict(String),
    /// Any other failure (network, 5xx, a 4xx that retrying will not fix).
    #[error("{0}")]
    Other(String),
}

/// A lease as the server returned it, kept whole so it goes back as sent.
#[derive(Debug, Clone)]
pub(crate) struct RemoteLease {
    pub(crate) body: Value,
    pub(crate) key: String,
    pub(crate) process: String,
    pub(crate) attempt: u32,
}

#[derive(Debug, Deserialize)]
struct SessionBody {
    id: i64,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    message: Option<String>,
    error: Option<String>,
}

/// A drover server reached over HTTP with an optional bearer token.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    /// A client for the server at `base` (`http://host:port`).
    pub(crate) fn new(base: &str, token: Option<String>) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        anyhow::ensure!(
            base.starts_with("http://") || base.starts_with("https://"),
            "--server takes an http:// or https:// URL, got {base:?}"
        );
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self { http, base, token })
    }

    async fn post(&self, path: &str, body: Value, timeout: Duration) -> Result<Value, CallError> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .timeout(timeout);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| CallError::Other(format!("{path}: {e}")))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| CallError::Other(format!("{path}: {e}")))?;
        if status.is_success() {
            return Ok(serde_json::from_str(&text).unwrap_or(Value::Null));
        }
        let message = serde_json::from_str::<ErrorBody>(&text)
            .ok()
            .and_then(|b| b.message.or(b.error))
            .unwrap_or(text);
        let message = format!("{path}: {status}: {message}");
        Err(if status == reqwest::StatusCode::CONFLICT {
            CallError::Conflict(message)
        } else {
            CallError::Other(message)
        })
    }

    /// Starts a session; returns its id.
    pub(crate) async fn session_start(
        &self,
        component: &str,
        ttl: Duration,
    ) -> Result<i64, CallError> {
        let body = json!({ "component": component, "ttl_ms": millis(ttl) });
        let value = self.post("/v1/sessions", body, ttl).await?;
        let session: SessionBody = serde_json::from_value(value)
            .map_err(|e| CallError::Other(format!("session reply: {e}")))?;
        Ok(session.id)
    }

    /// Renews the session's deadline.
    pub(crate) async fn heartbeat(&self, session: i64, timeout: Duration) -> Result<(), CallError> {
        self.post(
            &format!("/v1/sessions/{session}/heartbeat"),
            json!({}),
            timeout,
        )
        .await
        .map(drop)
    }

    /// Ends the session; its leases go back to pending.
    pub(crate) async fn session_close(&self, session: i64) -> Result<(), CallError> {
        let mut request = self
            .http
            .delete(format!("{}/v1/sessions/{session}", self.base))
            .timeout(Duration::from_secs(10));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| CallError::Other(e.to_string()))?;
        match response.status() {
            s if s.is_success() => Ok(()),
            s => Err(CallError::Other(format!("closing the session: {s}"))),
        }
    }

    /// Claims up to `max` leases, long-polling up to `wait` for work to arrive.
    pub(crate) async fn claim(
        &self,
        session: i64,
        process: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RemoteLease>, CallError> {
        let body = json!({ "process": process, "max": max, "wait_ms": millis(wait) });
        let path = format!("/v1/sessions/{session}/claim");
        let value = self
            .post(&path, body, wait + Duration::from_secs(10))
            .await?;
        let leases = value
            .get("leases")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        leases.into_iter().map(lease).collect()
    }

    /// Records a run's outcome through its lease (checked by fencing token).
    pub(crate) async fn complete(
        &self,
        lease: &RemoteLease,
        outcome: Value,
    ) -> Result<(), CallError> {
        let body = json!({ "lease": lease.body, "outcome": outcome });
        self.post("/v1/leases/complete", body, Duration::from_secs(30))
            .await
            .map(drop)
    }

    /// Gives a lease back without an outcome.
    pub(crate) async fn release(&self, lease: &RemoteLease) -> Result<(), CallError> {
        let body = json!({ "lease": lease.body });
        self.post("/v1/leases/release", body, Duration::from_secs(30))
            .await
            .map(drop)
    }
}

fn lease(body: Value) -> Result<RemoteLease, CallError> {
    let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
    let (Some(key), Some(process)) = (field("key"), field("process")) else {
        return Err(CallError::Other(format!(
            "a claimed lease lacks key or process: {body}"
        )));
    };
    let attempt = body.get("attempt").and_then(Value::as_u64).unwrap_or(1);
    Ok(RemoteLease {
        key,
        process,
        attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        body,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
