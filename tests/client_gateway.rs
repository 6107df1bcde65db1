//! A worker over HTTP behind a gateway (nginx, an ingress, a load balancer)
//! that answers some requests with its own page instead of drover's: what
//! the work itself did (a reconciler's own record of its runs) must still
//! follow every change. Found by the session-41 review of the HTTP worker
//! path.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use drover::client::Client;
use drover::runner::{Action, Controller, Task};
use drover::server::ServerOptions;
use drover::store::{ItemEnqueue, ItemGet, ItemState, Store, StoreEngine as _};
use support::backend::{TestBackend, served_with};
use tokio_util::sync::CancellationToken;

/// A reverse proxy in front of a drover server (as nginx, an ingress or a
/// load balancer stands there), forwarding every request; `answer` may
/// replace the upstream's answer to one (the request, the upstream's status
/// and body) with its own, as a gateway does when its read timeout passes
/// or the upstream's connection breaks after the request went through.
type Rewrite = dyn Fn(&str, StatusCode, &[u8]) -> Option<Response> + Send + Sync;

async fn gateway(upstream: &str, answer: Arc<Rewrite>) -> String {
    let upstream = upstream.to_owned();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |req: Request| {
        let (upstream, http, answer) = (upstream.clone(), http.clone(), Arc::clone(&answer));
        async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX)
                .await
                .expect("request body");
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let mut request = http
                .request(parts.method.clone(), format!("{upstream}{path}"))
                .body(body.to_vec());
            for (name, value) in &parts.headers {
                if name != "host" && name != "connection" {
                    request = request.header(name, value);
                }
            }
            let reply = request.send().await.expect("the upstream answers");
            let status = reply.status();
            let content_type = reply.headers().get("content-type").cloned();
            let bytes = reply.bytes().await.expect("the upstream's body");
            if let Some(replaced) = answer(&path, status, &bytes) {
                return replaced;
            }
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            if let Some(content_type) = content_type {
                response.headers_mut().insert("content-type", content_type);
            }
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let addr = listener.local_addr().expect("gateway address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("gateway") });
    format!("http://{addr}")
}

/// The server a test's workers reach, on `store`: its client's base URL,
/// and the guard that stops it.
fn server(store: &Store, options: ServerOptions) -> (String, TestBackend) {
    let backend = served_with(store, options);
    let TestBackend::Client(client, ..) = &backend else {
        unreachable!("served_with serves")
    };
    (client.base_url().to_owned(), backend)
}

/// A controller of `process` on `client` whose work records each run's key.
fn worker(
    client: Client,
    process: &str,
    runs: Arc<parking_lot::Mutex<Vec<String>>>,
) -> Controller<impl drover::runner::Reconciler, Client> {
    Controller::builder(client, process, move |task: Task| {
        let runs = Arc::clone(&runs);
        async move {
            runs.lock().push(task.key().to_owned());
            Ok::<_, std::io::Error>(Action::Done)
        }
    })
    .parallelism(4)
    .ttl(Duration::from_secs(3))
    .idle_poll(Duration::from_millis(100))
    .build()
    .expect("valid settings")
}

async fn state(store: &Store, process: &str, key: &str) -> Option<ItemState> {
    store
        .item_get(ItemGet {
            process: process.into(),
            key: key.into(),
            runs_limit: 1,
        })
        .await
        .expect("get")
        .map(|detail| detail.item.state)
}

/// A claim the server committed whose answer the worker never got, because
/// the gateway in front of the server answered it with its own 504 page (its
/// read timeout passed, or the upstream's connection broke after the claim
/// went through: nginx says 502 or 504, neither with drover's JSON). The
/// client took any 5xx that is not drover's `commit_unknown` for "nothing
/// applied", so the worker kept its session and claimed again: the key the
/// lost answer leased stayed running under that live session, which the
/// worker heartbeats for ever, and it never ran — nor did the changes
/// enqueued to it afterwards (DESIGN.md rule 3).
///
/// Before the fix the key never ran in 10 s (the work recorded no run), the
/// item stayed `running`, and a second enqueue only marked it dirty. Now the
/// claim's fate is unknown, so the worker gives the session up (closing it
/// hands the lease back) and the key runs, as after a cut connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_by_a_gateways_5xx_page_loses_no_lease() {
    lost_claim_answer("a gateway's 504", || {
        let page = "<html><body><h1>504 Gateway Time-out</h1></body></html>";
        (StatusCode::GATEWAY_TIMEOUT, page).into_response()
    })
    .await;
}

/// The same claim answered `200 OK` with a body that is not drover's (a
/// proxy's page, a truncated answer): the server applied the request, and
/// which keys it leased cannot be read. The client took it for "nothing
/// applied", as it did a gateway's 5xx, and the key never ran in 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_ok_answer_does_not_parse_loses_no_lease() {
    lost_claim_answer("a 200 that does not parse", || {
        let page = "<html><body>Welcome to nginx!</body></html>";
        (StatusCode::OK, page).into_response()
    })
    .await;
}

/// Runs a worker through a gateway that replaces the first claim answer that
/// leased a key with `replaced()`, enqueues the key again afterwards, and
/// requires a run of it within 10 s, as the work itself records it.
async fn lost_claim_answer(what: &str, replaced: fn() -> Response) {
    const PROCESS: &str = "gateway";
    let (db, _dir) = support::sqlite().await;
    let (upstream, _server) = server(&db.store, ServerOptions::default());
    let tripped = Arc::new(AtomicBool::new(false));
    let trip = Arc::clone(&tripped);
    let answer: Arc<Rewrite> = Arc::new(move |path, status, body| {
        let leased = path.ends_with("/claim")
            && status == StatusCode::OK
            && String::from_utf8_lossy(body).contains("\"leases\":[{");
        (leased && !trip.swap(true, Ordering::SeqCst)).then(replaced)
    });
    let url = gateway(&upstream, answer).await;
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    let runs = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let client = Client::new(&url).expect("a valid URL");
    let shutdown = CancellationToken::new();
    let controller = worker(client, PROCESS, Arc::clone(&runs));
    let running = tokio::spawn(controller.run(shutdown.clone()));
    support::process::eventually("the gateway to hide a claim's answer", || async {
        tripped.load(Ordering::SeqCst)
    })
    .await;
    // A change after the lost claim: it must be followed by a run.
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue again");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runs.lock().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let item = state(&db.store, PROCESS, "k").await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
    assert!(
        !runs.lock().is_empty(),
        "the key never ran in 10 s after its claim's answer was lost to {what} \
         (the item was {item:?}, leased to the worker's live session)"
    );
}
