//! Shared support for the server tests: a [`Server`] over a test database,
//! driven in-process with `tower::ServiceExt::oneshot` (no sockets), and JSON
//! helpers.

#![allow(dead_code)] // each test binary uses a different part of this module

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use drover::server::{Server, ServerOptions};
use drover::store::Store;
use http_body_util::BodyExt as _;
use serde_json::Value;
use tower::ServiceExt as _;

/// A server under test. Dropping it stops its background tasks, so the test
/// database can be closed.
pub(crate) struct Api {
    server: Server,
    router: Router,
    /// The token sent when a call gives none.
    pub(crate) token: Option<String>,
}

/// One response.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) text: String,
}

impl Reply {
    /// The body as JSON (panics with the body when it is not).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.server.stop();
    }
}

impl Api {
    /// An open server (no tokens) with default options.
    pub(crate) fn new(store: &Store) -> Self {
        Self::with(store, ServerOptions::default())
    }

    /// A server with `options`.
    pub(crate) fn with(store: &Store, options: ServerOptions) -> Self {
        let server = Server::new(store.clone(), options);
        let router = server.router();
        Self {
            server,
            router,
            token: None,
        }
    }

    /// Sends a request with an optional JSON body and the default token.
    pub(crate) async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> Reply {
        let token = self.token.clone();
        self.send(method, uri, body.map(|b| b.to_string()), token.as_deref())
            .await
    }

    /// Sends a request with a raw body and an explicit token.
    pub(crate) async fn send(
        &self,
        method: Method,
        uri: &str,
        body: Option<String>,
        token: Option<&str>,
    ) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match body {
            Some(body) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body)),
            None => request.body(Body::empty()),
        }
        .expect("request");
        self.request(request).await
    }

    /// Sends a prepared request.
    pub(crate) async fn request(&self, request: Request<Body>) -> Reply {
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        Reply {
            status,
            headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// `GET`, expecting 200 JSON.
    pub(crate) async fn get_ok(&self, uri: &str) -> Value {
        let reply = self.call(Method::GET, uri, None).await;
        assert_eq!(reply.status, StatusCode::OK, "GET {uri}: {}", reply.text);
        reply.json()
    }

    /// `POST` with a JSON body, expecting `status`; returns the body (or Null).
    pub(crate) async fn post(&self, uri: &str, body: Value, status: StatusCode) -> Value {
        let reply = self.call(Method::POST, uri, Some(body)).await;
        assert_eq!(reply.status, status, "POST {uri}: {}", reply.text);
        if reply.text.is_empty() {
            Value::Null
        } else {
            reply.json()
        }
    }

    /// Enqueues `keys` for `process`.
    pub(crate) async fn enqueue(&self, process: &str, keys: &[&str]) -> Value {
        let uri = format!("/v1/processes/{process}/items");
        self.post(&uri, serde_json::json!({ "keys": keys }), StatusCode::OK)
            .await
    }

    /// Starts a session with `ttl_ms`; returns its id.
    pub(crate) async fn session(&self, ttl_ms: u64) -> i64 {
        let body = serde_json::json!({ "component": "test", "ttl_ms": ttl_ms });
        let session = self.post("/v1/sessions", body, StatusCode::CREATED).await;
        session["id"].as_i64().expect("session id")
    }

    /// Claims up to `max` leases without waiting.
    pub(crate) async fn claim(&self, session: i64, process: &str, max: u32) -> Vec<Value> {
        let uri = format!("/v1/sessions/{session}/claim");
        let body = serde_json::json!({ "process": process, "max": max });
        let reply = self.post(&uri, body, StatusCode::OK).await;
        reply["leases"].as_array().expect("leases").clone()
    }

    /// Returns once `n` claims wait on this server for work, as its
    /// `drover_claims_waiting` gauge says (the server tells no one when a
    /// claim starts to wait, so `/metrics` is read again every 5 ms); fails
    /// after 10 s.
    pub(crate) async fn until_claims_waiting(&self, n: i64) {
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let metrics = self.call(Method::GET, "/metrics", None).await;
                let waiting = metrics
                    .text
                    .lines()
                    .find_map(|l| l.strip_prefix("drover_claims_waiting "))
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    .expect("the server reports drover_claims_waiting");
                if waiting >= n {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        waited.unwrap_or_else(|_| panic!("{n} claims never waited on the server"));
    }

    /// The counts of one process from `GET /v1/processes`, following its
    /// pages.
    pub(crate) async fn counts(&self, process: &str) -> Option<Value> {
        self.every_page("/v1/processes", "processes")
            .await
            .into_iter()
            .find(|p| p["process"] == process)
    }

    /// Every entry of the list `field` that `GET {path}` answers a page at a
    /// time, following each page's `next` (passed back as `after`,
    /// percent-encoded) until a page has none.
    pub(crate) async fn every_page(&self, path: &str, field: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut uri = path.to_owned();
        loop {
            let page = self.get_ok(&uri).await;
            all.extend(page[field].as_array().expect("a list").iter().cloned());
            let after = match &page["next"] {
                Value::Null => return all,
                Value::String(s) => segment(s),
                other => other.to_string(),
            };
            let joiner = if path.contains('?') { '&' } else { '?' };
            uri = format!("{path}{joiner}after={after}");
        }
    }
}

/// Starts a claim of `max` keys of `process` for `session` that waits up to
/// `wait_ms`: its status and body, once answered.
pub(crate) fn waiting_claim(
    api: &std::sync::Arc<Api>,
    wait_ms: u64,
    session: i64,
    process: &str,
    max: u32,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let (api, process) = (std::sync::Arc::clone(api), process.to_owned());
    tokio::spawn(async move {
        let body = serde_json::json!({ "process": process, "max": max, "wait_ms": wait_ms });
        let uri = format!("/v1/sessions/{session}/claim");
        let reply = api.call(Method::POST, &uri, Some(body)).await;
        (reply.status, reply.json())
    })
}

/// `ns/name` → `ns%2Fname`: a key as a path segment.
pub(crate) fn segment(key: &str) -> String {
    let mut out = String::new();
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Method shorthands.
pub(crate) const GET: Method = Method::GET;
/// `POST`.
pub(crate) const POST: Method = Method::POST;
/// `DELETE`.
pub(crate) const DELETE: Method = Method::DELETE;

/// A server on a real socket on 127.0.0.1, for tests that need what the HTTP
/// stack delivers (the `Host` a client sent). [`stop`](Self::stop) ends it.
pub(crate) struct Socket {
    /// Where it listens.
    pub(crate) addr: std::net::SocketAddr,
    shutdown: tokio_util::sync::CancellationToken,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Socket {
    /// Serves `store` with default options on a free port.
    pub(crate) async fn serve(store: &Store) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = Server::new(store.clone(), ServerOptions::default());
        let serving = tokio::spawn(server.serve(listener, shutdown.clone()));
        Self {
            addr,
            shutdown,
            serving,
        }
    }

    /// Stops serving and waits for the server to finish.
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        self.serving.await.expect("server task").expect("served");
    }
}
