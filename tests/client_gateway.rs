//! A worker over HTTP behind a gateway (nginx, an ingress, a load balancer)
//! that answers some requests with its own page instead of drover's: what
//! the work itself did (a reconciler's own record of its runs) must still
//! follow every change. Found by the session-41 review of the HTTP worker
//! path.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// Which requests (by path) the gateway swallows: never passed on, never
/// answered, as a link that goes silent while the request is on its way.
type Hold = dyn Fn(&str) -> bool + Send + Sync;

async fn gateway(upstream: &str, answer: Arc<Rewrite>) -> String {
    holding_gateway(upstream, answer, Arc::new(|_| false)).await
}

/// [`gateway`] that also swallows the requests `hold` names.
async fn holding_gateway(upstream: &str, answer: Arc<Rewrite>, hold: Arc<Hold>) -> String {
    let upstream = upstream.to_owned();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |req: Request| {
        let (upstream, http, answer) = (upstream.clone(), http.clone(), Arc::clone(&answer));
        let hold = Arc::clone(&hold);
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
            if hold(&path) {
                return std::future::pending().await;
            }
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

/// A worker told to stop while it hands back the keys it claimed ahead of a
/// paused process, over a link that has gone silent (the release is sent,
/// no answer comes), stops within its shutdown deadline, and the keys go
/// back with its session's close. Before, the claim loop waited for each
/// release's answer without hearing the shutdown: the HTTP client's whole
/// request timeout (30 s) per key, so three keys held a worker with a 1 s
/// deadline up for 90 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_while_its_hand_back_of_a_paused_process_goes_unanswered_stops_in_time() {
    const PROCESS: &str = "handback";
    let (db, _dir) = support::sqlite().await;
    let (upstream, _server) = server(&db.store, ServerOptions::default());
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hold: Arc<Hold> = {
        let held = Arc::clone(&held);
        Arc::new(move |path| {
            let release = path == "/v1/leases/release";
            if release {
                held.fetch_add(1, Ordering::SeqCst);
            }
            release
        })
    };
    let url = holding_gateway(&upstream, Arc::new(|_, _, _| None), hold).await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, keys.clone()))
        .await
        .expect("enqueue");
    let started = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let first_may_end = Arc::new(tokio::sync::Notify::new());
    let controller = {
        let (started, first_may_end) = (Arc::clone(&started), Arc::clone(&first_may_end));
        Controller::builder(
            Client::new(&url).expect("a valid URL"),
            PROCESS,
            move |_: Task| {
                let (started, first_may_end) = (Arc::clone(&started), Arc::clone(&first_may_end));
                async move {
                    if started.fetch_add(1, Ordering::SeqCst) == 0 {
                        first_may_end.notified().await;
                    }
                    Ok::<_, std::io::Error>(Action::Done)
                }
            },
        )
        .parallelism(1)
        .prefetch(3)
        .ttl(Duration::from_secs(3))
        .idle_poll(Duration::from_millis(100))
        .shutdown_deadline(Duration::from_secs(1))
        .build()
        .expect("valid settings")
    };
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    support::process::eventually("the first run to start", || async {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    let pause = drover::store::ProcessPause {
        process: PROCESS.into(),
        paused: true,
        actor: "test".into(),
    };
    db.store.process_pause(pause).await.expect("pause");
    // The keys claimed ahead are older than an idle poll by now: the next
    // claim hears of the pause and they are handed back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first_may_end.notify_one();
    support::process::eventually("a hand-back to be sent", || async {
        held.load(Ordering::SeqCst) > 0
    })
    .await;
    stops_in_time(
        &shutdown,
        running,
        "it waits for the answer to a hand-back that will not come",
    )
    .await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "no key claimed ahead ran"
    );
    for key in &keys[1..] {
        assert_eq!(
            state(&db.store, PROCESS, key).await,
            Some(ItemState::Pending),
            "{key}, claimed ahead and handed back or closed with the session, is pending again"
        );
    }
}

/// A worker told to stop while it closes a session it gave up (a claim's
/// answer was lost) over a link that has gone silent stops within its
/// shutdown deadline: the session's leases go back when it expires, as they
/// would after any close that does not get through. Before, the close of a
/// session given up waited one whole TTL (here 10 s) whatever the shutdown
/// said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_while_closing_a_session_it_gave_up_over_a_silent_link_stops_in_time() {
    const PROCESS: &str = "giving_up";
    let (db, _dir) = support::sqlite().await;
    let (upstream, _server) = server(&db.store, ServerOptions::default());
    let tripped = Arc::new(AtomicBool::new(false));
    let answer: Arc<Rewrite> = {
        let trip = Arc::clone(&tripped);
        Arc::new(move |path, status, body| {
            let leased = path.ends_with("/claim")
                && status == StatusCode::OK
                && String::from_utf8_lossy(body).contains("\"leases\":[{");
            (leased && !trip.swap(true, Ordering::SeqCst)).then(|| {
                let page = "<html><body><h1>504 Gateway Time-out</h1></body></html>";
                (StatusCode::GATEWAY_TIMEOUT, page).into_response()
            })
        })
    };
    // A session's close is `DELETE /v1/sessions/{id}`: the only path with
    // nothing after the id.
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hold: Arc<Hold> = {
        let held = Arc::clone(&held);
        Arc::new(move |path| {
            let close = path
                .strip_prefix("/v1/sessions/")
                .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
            if close {
                held.fetch_add(1, Ordering::SeqCst);
            }
            close
        })
    };
    let url = holding_gateway(&upstream, answer, hold).await;
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    let controller = Controller::builder(
        Client::new(&url).expect("a valid URL"),
        PROCESS,
        |_: Task| async { Ok::<_, std::io::Error>(Action::Done) },
    )
    .ttl(Duration::from_secs(10))
    .idle_poll(Duration::from_millis(100))
    .shutdown_deadline(Duration::from_secs(1))
    .build()
    .expect("valid settings");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    support::process::eventually("the session given up to be closed", || async {
        held.load(Ordering::SeqCst) > 0
    })
    .await;
    stops_in_time(
        &shutdown,
        running,
        "it waits for the close of the session it gave up, for one TTL (10 s)",
    )
    .await;
}

/// Tells the worker `running` to stop and asserts it does within 5 s (its
/// shutdown deadline is 1 s); `why` says what it waited for before.
async fn stops_in_time(
    shutdown: &CancellationToken,
    running: tokio::task::JoinHandle<Result<(), drover::runner::RunError>>,
    why: &str,
) {
    let stopping = tokio::time::Instant::now();
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), running).await;
    let took = stopping.elapsed();
    assert!(
        stopped.is_ok(),
        "the worker had not stopped {took:?} after it was told to, with a 1 s shutdown \
         deadline: {why}"
    );
    stopped
        .expect("stopped")
        .expect("worker task")
        .expect("worker");
}

/// How long a worker with a 3 s TTL may take, on a loaded machine, to do
/// what the fixes below make it do within about one TTL; the bugs they fix
/// took the client's request timeout (30 s) or more.
const PROMPTLY: Duration = Duration::from_secs(10);

/// Whether `path` is a worker's claim or heartbeat (of any session).
fn claim_or_heartbeat(path: &str) -> bool {
    path.starts_with("/v1/sessions/") && (path.ends_with("/claim") || path.ends_with("/heartbeat"))
}

/// A [`worker`] of `process` through a gateway in front of a server on
/// `store` that swallows the requests `hold` names, with `key` enqueued:
/// the keys it ran, what stops it, and its task.
struct Behind {
    runs: Arc<parking_lot::Mutex<Vec<String>>>,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<(), drover::runner::RunError>>,
    _server: TestBackend,
}

impl Behind {
    async fn start(store: &Store, process: &'static str, key: &str, hold: Arc<Hold>) -> Self {
        let (upstream, server) = server(store, ServerOptions::default());
        let url = holding_gateway(&upstream, Arc::new(|_, _, _| None), hold).await;
        store
            .item_enqueue(ItemEnqueue::new(process, [key]))
            .await
            .expect("enqueue");
        let runs = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let client = Client::new(&url).expect("a valid URL");
        let shutdown = CancellationToken::new();
        let running =
            tokio::spawn(worker(client, process, Arc::clone(&runs)).run(shutdown.clone()));
        Self {
            runs,
            shutdown,
            running,
            _server: server,
        }
    }

    /// Waits until `done` holds, for [`PROMPTLY`] at most; how long it took.
    async fn promptly<F: Future<Output = bool>>(&self, done: impl Fn() -> F) -> Duration {
        let from = tokio::time::Instant::now();
        while !done().await && from.elapsed() < PROMPTLY {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        from.elapsed()
    }

    /// Stops the worker; the keys it ran.
    async fn stop(self) -> Vec<String> {
        self.shutdown.cancel();
        self.running.await.expect("worker task").expect("worker");
        self.runs.lock().clone()
    }
}

/// A completion batch whose request goes silent (the gateway swallows it:
/// no answer, no error, both sides alive) is given up after a heartbeat
/// interval (TTL/3) and its outcome written at the retry, and an outcome
/// queued behind it is written as promptly. Before, the completer waited the
/// client's whole request timeout (30 s) for the silent batch and wrote
/// nothing else meanwhile: both keys stayed `running` under a live worker
/// for 30 s, past the one TTL (3 s here) outcomes are retried for, and the
/// first outcome was then dropped and its key run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_batch_gone_silent_holds_no_outcome_for_the_request_timeout() {
    support::each_engine(|db| async move {
        const PROCESS: &str = "silent_batch";
        let batches = Arc::new(AtomicUsize::new(0));
        let hold: Arc<Hold> = {
            let batches = Arc::clone(&batches);
            Arc::new(move |path| {
                path == "/v1/leases/complete-batch" && batches.fetch_add(1, Ordering::SeqCst) == 0
            })
        };
        let worker = Behind::start(&db.store, PROCESS, "k1", hold).await;
        support::process::eventually("k1's outcome to be sent", || async {
            batches.load(Ordering::SeqCst) > 0
        })
        .await;
        // Its outcome queues behind the silent batch.
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["k2"]))
            .await
            .expect("enqueue");
        let written = || async {
            state(&db.store, PROCESS, "k1").await == Some(ItemState::Idle)
                && state(&db.store, PROCESS, "k2").await == Some(ItemState::Idle)
        };
        let took = worker.promptly(written).await;
        let (k1, k2) = (
            state(&db.store, PROCESS, "k1").await,
            state(&db.store, PROCESS, "k2").await,
        );
        let runs = worker.stop().await;
        assert!(
            k1 == Some(ItemState::Idle) && k2 == Some(ItemState::Idle),
            "{took:?} after k1's completion batch went silent, k1 is {k1:?} and k2 is {k2:?}: \
             their outcomes wait on the silent request (the TTL is 3 s)"
        );
        assert_eq!(
            runs,
            ["k1", "k2"],
            "each key ran once: the silent batch's outcome was written at its retry"
        );
    })
    .await;
}

/// A worker whose session is lost while its claim is in flight over a link
/// gone silent (the claim and the heartbeats are swallowed) claims under
/// its next session at once, and the waiting key runs. Before, the claim
/// loop kept waiting for the lost session's claim, for the client's request
/// timeout (30 s; 40 s for an idle worker's long-poll), while the next
/// session, started within the TTL, claimed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_flight_for_a_lost_session_does_not_hold_up_the_next_one() {
    support::each_engine(|db| async move {
        const PROCESS: &str = "lost_claim";
        // The first session's claims and heartbeats go silent; the second
        // session's go through.
        let starts = Arc::new(AtomicUsize::new(0));
        let hold: Arc<Hold> = {
            let starts = Arc::clone(&starts);
            Arc::new(move |path| {
                if path == "/v1/sessions" {
                    starts.fetch_add(1, Ordering::SeqCst);
                    return false;
                }
                starts.load(Ordering::SeqCst) < 2 && claim_or_heartbeat(path)
            })
        };
        let worker = Behind::start(&db.store, PROCESS, "k", hold).await;
        support::process::eventually("the lost session to be replaced", || async {
            starts.load(Ordering::SeqCst) >= 2
        })
        .await;
        let took = worker
            .promptly(|| async { !worker.runs.lock().is_empty() })
            .await;
        let item = state(&db.store, PROCESS, "k").await;
        assert_eq!(
            worker.stop().await,
            ["k"],
            "{took:?} after its session was replaced the worker had not run the waiting key \
             (it is {item:?}): its claim loop waits for the lost session's silent claim"
        );
    })
    .await;
}

/// A worker whose session is lost, and whose first try to start the next one
/// goes silent, tries again within a heartbeat interval (TTL/3) and runs the
/// waiting key. Before, one try waited the client's request timeout (30 s):
/// the worker went that long without a session, and without claims, after a
/// single swallowed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_start_gone_silent_is_tried_again_within_a_heartbeat_interval() {
    support::each_engine(|db| async move {
        const PROCESS: &str = "silent_start";
        // The first session's claims and heartbeats go silent, and so does
        // the first try to start the next session; the next try goes through.
        let starts = Arc::new(AtomicUsize::new(0));
        let hold: Arc<Hold> = {
            let starts = Arc::clone(&starts);
            Arc::new(move |path| {
                if path == "/v1/sessions" {
                    return starts.fetch_add(1, Ordering::SeqCst) + 1 == 2;
                }
                starts.load(Ordering::SeqCst) < 3 && claim_or_heartbeat(path)
            })
        };
        let worker = Behind::start(&db.store, PROCESS, "k", hold).await;
        support::process::eventually("a start of the next session to go silent", || async {
            starts.load(Ordering::SeqCst) >= 2
        })
        .await;
        let took = worker
            .promptly(|| async { !worker.runs.lock().is_empty() })
            .await;
        let tries = starts.load(Ordering::SeqCst);
        assert_eq!(
            worker.stop().await,
            ["k"],
            "{took:?} after a session start went silent the worker had not run the waiting key \
             ({tries} session starts were sent): it waits for the silent start"
        );
    })
    .await;
}

/// A traced worker whose run failed (transient) links the key's next run to
/// this attempt before writing the outcome (`POST /v1/leases/trace-link`);
/// over a link gone silent that best-effort call is given up within a
/// heartbeat interval and the outcome written. Before, it waited the
/// client's request timeout (30 s), the run's slot and its key's outcome
/// with it: the key stayed `running` 30 s after its run had ended.
#[cfg(feature = "cli")]
#[tokio::test]
async fn a_retrys_trace_link_gone_silent_does_not_hold_the_outcome() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    const PROCESS: &str = "silent_link";
    // A sampled OpenTelemetry trace of every span on this (the runtime's
    // only) thread: the worker's runs are traced as `drover work` traces them.
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let traces = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    let _traced = tracing::subscriber::set_default(tracing_subscriber::registry().with(traces));
    let (db, _dir) = support::sqlite().await;
    let (upstream, _server) = server(&db.store, ServerOptions::default());
    let links = Arc::new(AtomicUsize::new(0));
    let hold: Arc<Hold> = {
        let links = Arc::clone(&links);
        Arc::new(move |path| {
            let link = path == "/v1/leases/trace-link";
            if link {
                links.fetch_add(1, Ordering::SeqCst);
            }
            link
        })
    };
    let url = holding_gateway(&upstream, Arc::new(|_, _, _| None), hold).await;
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    let controller = Controller::builder(
        Client::new(&url).expect("a valid URL"),
        PROCESS,
        |_: Task| async { Err::<Action, _>(std::io::Error::other("fails, to be retried")) },
    )
    .ttl(Duration::from_secs(3))
    .idle_poll(Duration::from_millis(100))
    .build()
    .expect("valid settings");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    support::process::eventually("the failed run's trace link to be sent", || async {
        links.load(Ordering::SeqCst) > 0
    })
    .await;
    let silent = tokio::time::Instant::now();
    while state(&db.store, PROCESS, "k").await == Some(ItemState::Running)
        && silent.elapsed() < PROMPTLY
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = silent.elapsed();
    let item = state(&db.store, PROCESS, "k").await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
    assert_ne!(
        item,
        Some(ItemState::Running),
        "{took:?} after the failed run's trace link went silent its outcome was still not \
         written (the TTL is 3 s)"
    );
}
