//! The HTTP API, route by route, on every engine (`support::each_engine`).
//! No test sleeps: TTLs pass by advancing the store's clock.

mod server_support;
mod support;

use std::time::Duration;

use axum::http::StatusCode;
use drover::server::ServerOptions;
use drover::store::{
    DepthSample, ItemEnqueue, LeaseClaim, LeaseComplete, Outcome, SessionStart, StoreEngine as _,
};
use serde_json::{Value, json};
use server_support::{Api, DELETE, GET, POST, segment, waiting_claim};
use support::each_engine;

const P: &str = "provision";

fn complete_body(lease: &Value, outcome: Value) -> Value {
    json!({ "lease": lease, "outcome": outcome })
}

#[tokio::test]
async fn enqueued_keys_show_up_in_the_process_counts() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let report = api.enqueue(P, &["a", "b", "a"]).await;
        assert_eq!(report, json!({ "pending": 2, "dirty": 0 }));
        let counts = api.counts(P).await.expect("process listed");
        assert_eq!(counts["pending"], 2);
        assert_eq!(counts["running"], 0);
        assert!(counts["oldest_pending_age_ms"].is_u64());
    })
    .await;
}

#[tokio::test]
async fn enqueue_options_delay_and_prioritise_keys() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let uri = format!("/v1/processes/{P}/items");
        let later = json!({ "keys": ["late"], "after_ms": 60_000 });
        api.post(&uri, later, StatusCode::OK).await;
        let first = json!({ "keys": ["urgent"], "priority": 9, "bypass_backoff": true });
        api.post(&uri, first, StatusCode::OK).await;
        api.enqueue(P, &["plain"]).await;
        let session = api.session(30_000).await;
        let keys: Vec<_> = api
            .claim(session, P, 10)
            .await
            .iter()
            .map(|l| l["key"].clone())
            .collect();
        assert_eq!(
            keys,
            [json!("urgent"), json!("plain")],
            "the delayed key waits"
        );
    })
    .await;
}

#[tokio::test]
async fn items_are_listed_by_state_a_page_at_a_time() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "b", "c"]).await;
        let session = api.session(30_000).await;
        api.claim(session, P, 1).await;
        let page = api
            .get_ok(&format!("/v1/processes/{P}/items?limit=2"))
            .await;
        assert_eq!(page["items"].as_array().expect("items").len(), 2);
        assert_eq!(page["next_after_key"], "b");
        let rest = api
            .get_ok(&format!("/v1/processes/{P}/items?limit=2&after_key=b"))
            .await;
        assert_eq!(rest["items"][0]["key"], "c");
        assert_eq!(rest["next_after_key"], Value::Null);
        let running = api
            .get_ok(&format!("/v1/processes/{P}/items?state=running"))
            .await;
        assert_eq!(running["items"][0]["key"], "a");
        assert_eq!(running["items"][0]["state"], "running");
    })
    .await;
}

#[tokio::test]
async fn one_item_is_read_with_its_runs_even_with_a_slash_in_its_key() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["ns/name"]).await;
        api.enqueue(P, &["ns/name"]).await;
        let uri = format!("/v1/processes/{P}/items/{}", segment("ns/name"));
        let detail = api.get_ok(&uri).await;
        assert_eq!(detail["item"]["key"], "ns/name");
        assert_eq!(detail["item"]["state"], "pending");
        assert_eq!(detail["item"]["enqueue_count"], 2);
        assert!(detail["item"]["first_enqueued_at"].is_string());
        assert_eq!(
            detail["runs"],
            json!([]),
            "no run yet: nothing in the history"
        );
        let missing = api
            .call(GET, &format!("/v1/processes/{P}/items/nope"), None)
            .await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
    })
    .await;
}

#[tokio::test]
async fn a_worker_claims_completes_and_the_item_stays_known_and_idle() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(30_000).await;
        let leases = api.claim(session, P, 5).await;
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0]["attempt"], 1);
        assert!(
            api.claim(session, P, 5).await.is_empty(),
            "a held key is not handed out twice"
        );
        let body = complete_body(&leases[0], json!({ "type": "done" }));
        api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT)
            .await;
        let uri = format!("/v1/processes/{P}/items/a");
        let detail = api.get_ok(&uri).await;
        assert_eq!(detail["item"]["state"], "idle");
        assert_eq!(detail["item"]["last_outcome"], "done");
        let run = &detail["runs"][0];
        assert_eq!(run["outcome"], "done");
        assert_eq!(run["attempt"], 1);
        assert_eq!(run["failed"], false);
        assert_eq!(run["token"], leases[0]["token"]);
        assert!(
            run["duration_ms"].is_u64() && run["queue_wait_ms"].is_u64(),
            "{run}"
        );
    })
    .await;
}

#[tokio::test]
async fn runs_page_newest_first_by_key_and_outcome_without_offsets() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let session = api.session(30_000).await;
        for round in 0..3 {
            api.enqueue(P, &["a", "b"]).await;
            for lease in api.claim(session, P, 5).await {
                let outcome = if lease["key"] == "b" && round == 1 {
                    json!({ "type": "transient", "error": "flaky" })
                } else {
                    json!({ "type": "done" })
                };
                let body = complete_body(&lease, outcome);
                api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT)
                    .await;
            }
            db.store.clock().advance(std::time::Duration::from_secs(10));
        }
        let runs = format!("/v1/processes/{P}/runs");
        let first = api.get_ok(&format!("{runs}?limit=4")).await;
        let ids: Vec<i64> = first["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["id"].as_i64().expect("id"))
            .collect();
        assert_eq!(ids.len(), 4);
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
        let next = first["next_before"].as_i64().expect("a next page");
        assert_eq!(next, ids[3]);
        let second = api.get_ok(&format!("{runs}?limit=4&before={next}")).await;
        assert_eq!(second["runs"].as_array().expect("runs").len(), 2);
        assert_eq!(second["next_before"], json!(null), "the last page");
        let b = api.get_ok(&format!("{runs}?key=b")).await;
        let outcomes: Vec<&str> = b["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["outcome"].as_str().expect("outcome"))
            .collect();
        assert_eq!(outcomes, ["done", "retry", "done"]);
        assert_eq!(b["runs"][0]["attempt"], 2, "the run after a failure");
        let failed = api.get_ok(&format!("{runs}?outcome=retry")).await;
        assert_eq!(failed["runs"][0]["key"], "b");
        assert_eq!(failed["runs"][0]["error"], "flaky");
        assert_eq!(failed["runs"][0]["failed"], true);
        assert_eq!(failed["runs"].as_array().expect("runs").len(), 1);
        for bad in ["outcome=exploded", "limit=0", "limit=1001", "before=x"] {
            let reply = api.call(GET, &format!("{runs}?{bad}"), None).await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{bad}: {}",
                reply.text
            );
        }
        let unknown = api.call(GET, "/v1/processes/nope/runs", None).await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    })
    .await;
}

#[tokio::test]
async fn each_outcome_moves_the_item_as_the_store_contract_says() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["later", "flaky", "broken"]).await;
        let session = api.session(30_000).await;
        let leases = api.claim(session, P, 3).await;
        // One enqueue's keys tie on priority and ready time; their claim order
        // is the engine's, so each outcome goes by key.
        let outcome = |key: &str| match key {
            "later" => json!({ "type": "requeue_after", "after_ms": 60_000 }),
            "flaky" => json!({ "type": "transient", "error": "try again" }),
            _ => json!({ "type": "permanent", "error": "<b>bad</b>" }),
        };
        assert_eq!(leases.len(), 3);
        for lease in &leases {
            let body = complete_body(lease, outcome(lease["key"].as_str().unwrap()));
            api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT).await;
        }
        let state = |key: &'static str| {
            let api = &api;
            async move { api.get_ok(&format!("/v1/processes/{P}/items/{key}")).await["item"].clone() }
        };
        assert_eq!(state("later").await["state"], "pending");
        let flaky = state("flaky").await;
        assert_eq!((flaky["state"].clone(), flaky["failures"].clone()), (json!("backoff"), json!(1)));
        let broken = state("broken").await;
        assert_eq!(broken["state"], "parked");
        assert_eq!(broken["last_error"], "<b>bad</b>");
    })
    .await;
}

#[tokio::test]
async fn heartbeat_renews_and_close_gives_the_leases_back() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(10_000).await;
        api.claim(session, P, 1).await;
        db.store.clock().advance(Duration::from_secs(8));
        let beat = api
            .post(
                &format!("/v1/sessions/{session}/heartbeat"),
                json!(null),
                StatusCode::OK,
            )
            .await;
        assert!(beat["deadline"].is_string());
        db.store.clock().advance(Duration::from_secs(8));
        let closed = api
            .call(DELETE, &format!("/v1/sessions/{session}"), None)
            .await;
        assert_eq!(closed.status, StatusCode::OK, "{}", closed.text);
        assert_eq!(
            closed.json()["released"],
            1,
            "alive thanks to the heartbeat"
        );
        assert_eq!(api.counts(P).await.expect("counts")["pending"], 1);
    })
    .await;
}

#[tokio::test]
async fn a_released_lease_is_pending_again_without_a_failure() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(30_000).await;
        let lease = api.claim(session, P, 1).await.remove(0);
        api.post(
            "/v1/leases/release",
            json!({ "lease": lease }),
            StatusCode::NO_CONTENT,
        )
        .await;
        let item = api.get_ok(&format!("/v1/processes/{P}/items/a")).await;
        assert_eq!(item["item"]["state"], "pending");
        assert_eq!(item["item"]["failures"], 0);
    })
    .await;
}

#[tokio::test]
async fn completing_after_the_session_expired_is_refused_and_changes_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(1_000).await;
        let lease = api.claim(session, P, 1).await.remove(0);
        db.store.clock().advance(Duration::from_secs(5));
        let body = complete_body(&lease, json!({ "type": "done" }));
        let refused = api
            .post("/v1/leases/complete", body, StatusCode::CONFLICT)
            .await;
        assert_eq!(refused["error"], "session_expired");
        let beat = api
            .call(POST, &format!("/v1/sessions/{session}/heartbeat"), None)
            .await;
        assert_eq!(beat.status, StatusCode::CONFLICT);
        let item = api.get_ok(&format!("/v1/processes/{P}/items/a")).await;
        assert_eq!(item["item"]["state"], "running", "only a reclaim frees it");
    })
    .await;
}

#[tokio::test]
async fn a_trace_link_from_a_lease_that_lost_its_key_is_refused() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(30_000).await;
        let lease = api.claim(session, P, 1).await.remove(0);
        let context =
            json!({ "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" });
        let mut stale = lease.clone();
        stale["token"] = json!(lease["token"].as_i64().expect("a token") + 1);
        let refused = api
            .post(
                "/v1/leases/trace-link",
                json!({ "lease": stale, "context": context }),
                StatusCode::CONFLICT,
            )
            .await;
        assert_eq!(refused["error"], "lease_lost");
        api.post(
            "/v1/leases/trace-link",
            json!({ "lease": lease, "context": context }),
            StatusCode::NO_CONTENT,
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_waiting_claim_returns_as_soon_as_a_key_is_enqueued() {
    each_engine(|db| async move {
        // Polling once a minute: only the wake-up can answer within the test.
        // A process name of its own: no neighbour's enqueue can wake it.
        let process = support::process_name("woken");
        let options = ServerOptions::default().poll_interval(Duration::from_secs(60));
        let api = std::sync::Arc::new(Api::with(&db.store, options));
        let session = api.session(60_000).await;
        let waiting = waiting_claim(&api, 30_000, session, &process, 1);
        // The claim waits (it found nothing): only a wake-up can answer it.
        api.until_claims_waiting(1).await;
        // Enqueue through another connection, as another node would.
        let other = db.reconnect().await;
        other
            .item_enqueue(ItemEnqueue::new(process.as_str(), ["a"]))
            .await
            .expect("enqueue");
        let (status, claimed) = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("woken before the poll")
            .expect("claim task");
        assert_eq!(status, StatusCode::OK, "{claimed}");
        assert_eq!(claimed["leases"][0]["key"], "a");
        other.close().await;
    })
    .await;
}

/// On PostgreSQL, a server over `db` that polls once a minute, so only the
/// store's `LISTEN` can wake its waiting claims within a test; `None`
/// (with the reason printed) on SQLite, which hears no other process.
fn hearing_other_nodes(db: &support::TestDb) -> Option<std::sync::Arc<Api>> {
    if db.engine != "postgres" {
        eprintln!(
            "skipping on {}: only PostgreSQL hears wake-ups from other processes",
            db.engine
        );
        return None;
    }
    let options = ServerOptions::default().poll_interval(Duration::from_secs(60));
    Some(std::sync::Arc::new(Api::with(&db.store, options)))
}

/// A claim of `process` that waits (30 s) on `api`'s server, and the key
/// `from-elsewhere` enqueued to that process by another OS process (`drover
/// enqueue` on `url`) once it waits (with `waiting_already` other claims). On a server that polls once a
/// minute only the store's `LISTEN` can answer it within the 20 s this
/// waits. Returns its answer.
async fn claim_woken_from_another_process(
    api: &std::sync::Arc<Api>,
    url: &str,
    session: i64,
    process: &str,
    waiting_already: i64,
) -> Value {
    let waiting = waiting_claim(api, 30_000, session, process, 1);
    api.until_claims_waiting(waiting_already + 1).await;
    let enqueued = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["enqueue", process, "from-elsewhere", "--db", url])
        .output()
        .await
        .expect("run drover enqueue");
    assert!(
        enqueued.status.success(),
        "{}",
        String::from_utf8_lossy(&enqueued.stderr)
    );
    let (status, claimed) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("woken by NOTIFY, long before the 60 s poll")
        .expect("claim task");
    assert_eq!(status, StatusCode::OK, "{claimed}");
    claimed
}

#[tokio::test]
async fn on_postgres_a_waiting_claim_hears_an_enqueue_from_another_process() {
    each_engine(|db| async move {
        let Some(api) = hearing_other_nodes(&db) else {
            return;
        };
        let session = api.session(60_000).await;
        let process = support::process_name("listen");
        let claimed = claim_woken_from_another_process(&api, &db.url, session, &process, 0).await;
        assert_eq!(claimed["leases"][0]["key"], "from-elsewhere");
    })
    .await;
}

/// A store listens on at most 1,024 processes at once. A caller's claims on
/// made-up names, one each, used to take every channel for the server's
/// lifetime, and a real long-poll then heard another node's enqueue only at
/// the poll interval (found in review). Now a claim that does not wait
/// listens for nothing, a line lets go of its process's signal when its last
/// waiter leaves, and a store short of channels lets go of those nobody
/// waits on.
#[tokio::test]
async fn on_postgres_claims_on_a_thousand_made_up_names_leave_a_real_waiter_its_wakeups() {
    each_engine(|db| async move {
        let Some(api) = hearing_other_nodes(&db) else {
            return;
        };
        let session = api.session(60_000).await;
        let uri = format!("/v1/sessions/{session}/claim");
        // Waits that end at once, and claims that do not wait at all.
        // More waits than a store has channels: the last ones need the
        // channels of those that ended.
        for (i, wait_ms) in (0..1300).map(|i| (i, if i % 6 == 0 { 0 } else { 1 })) {
            let body = json!({ "process": format!("made-up-{i}"), "max": 1, "wait_ms": wait_ms });
            api.post(&uri, body, StatusCode::OK).await;
        }
        let process = support::process_name("listen");
        let claimed = claim_woken_from_another_process(&api, &db.url, session, &process, 0).await;
        assert_eq!(claimed["leases"][0]["key"], "from-elsewhere");
    })
    .await;
}

/// Long-polls on more made-up names than a store has `LISTEN` channels, all
/// waiting at once (66 sessions of 16, inside every default cap), leave a
/// real process's new waiter its wake-ups: the server listens for at most
/// 64 names the database does not hold, and the rest wait by their poll.
/// Before, each held a channel while it waited, and the real waiter heard
/// another node's enqueue only at its poll (found in review).
#[tokio::test]
async fn on_postgres_long_polls_on_a_thousand_made_up_names_leave_a_real_waiter_its_wakeups() {
    each_engine(|db| async move {
        let Some(api) = hearing_other_nodes(&db) else {
            return;
        };
        // The real process exists, its one key running: its waiter waits.
        let process = support::process_name("listen");
        api.enqueue(&process, &["running"]).await;
        let session = api.session(60_000).await;
        assert_eq!(api.claim(session, &process, 1).await.len(), 1);
        let mut made_up = Vec::new();
        for s in 0..66 {
            let session = api.session(60_000).await;
            for i in 0..16 {
                let name = format!("made-up-{s}-{i}");
                made_up.push(waiting_claim(&api, 50_000, session, &name, 1));
            }
        }
        let waiting = i64::try_from(made_up.len()).expect("small");
        api.until_claims_waiting(waiting).await;
        let claimed =
            claim_woken_from_another_process(&api, &db.url, session, &process, waiting).await;
        assert_eq!(claimed["leases"][0]["key"], "from-elsewhere");
        for claim in made_up {
            claim.abort();
        }
    })
    .await;
}

/// A caller's open transaction that enqueued a running key holds its row;
/// the key's outcome, sent on its own, is answered 503 `key_busy` (nothing
/// written, send it again), not 409, which the API documents as a lost
/// lease or session and a hand-written worker takes for final (found in
/// review). Sent again after the caller commits, it is recorded, and the
/// caller's change runs the key once more.
#[tokio::test]
async fn on_postgres_an_outcome_whose_row_a_caller_holds_is_answered_key_busy_to_send_again() {
    each_engine(|db| async move {
        if db.engine != "postgres" {
            eprintln!(
                "skipping on {}: only PostgreSQL completions skip a row another transaction holds",
                db.engine
            );
            return;
        }
        let api = Api::new(&db.store);
        api.enqueue(P, &["held"]).await;
        let session = api.session(60_000).await;
        let lease = api.claim(session, P, 1).await.remove(0);
        let mut caller = support::caller_tx::CallerTx::begin(&db.store).await;
        caller
            .enqueue(ItemEnqueue::new(P, ["held"]))
            .await
            .expect("the caller's enqueue");
        let body = complete_body(&lease, json!({ "type": "done" }));
        let busy = api
            .post(
                "/v1/leases/complete",
                body.clone(),
                StatusCode::SERVICE_UNAVAILABLE,
            )
            .await;
        assert_eq!(busy["error"], "key_busy", "{busy}");
        caller.commit().await;
        api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT)
            .await;
        let counts = api.counts(P).await.expect("process listed");
        assert_eq!(
            counts["pending"], 1,
            "the caller's change runs the key again: {counts}"
        );
        assert_eq!(counts["running"], 0, "{counts}");
    })
    .await;
}

#[tokio::test]
async fn a_waiting_claim_held_back_by_the_rate_limit_returns_at_the_next_token() {
    each_engine(|db| async move {
        // Polling once a minute: only the wait for the next token can answer
        // within the test.
        let process = support::process_name("paced");
        let limit = drover::store::ProcessConfigure::new(process.as_str())
            .rate(Some(1.0))
            .burst(1);
        db.store.process_configure(limit).await.expect("limit");
        let options = ServerOptions::default().poll_interval(Duration::from_secs(60));
        let api = Api::with(&db.store, options);
        api.enqueue(&process, &["a", "b"]).await;
        let session = api.session(60_000).await;
        assert_eq!(api.claim(session, &process, 1).await.len(), 1, "the burst");
        let body = json!({ "process": process, "max": 1, "wait_ms": 30_000 });
        let uri = format!("/v1/sessions/{session}/claim");
        let claimed = tokio::time::timeout(
            Duration::from_secs(20),
            api.post(&uri, body, StatusCode::OK),
        )
        .await
        .expect("answered at the next token (a second away), not at the poll or the wait's end");
        assert_eq!(claimed["leases"][0]["key"], "b");
    })
    .await;
}

#[tokio::test]
async fn a_waiting_claim_with_nothing_to_do_returns_empty_after_its_wait() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["x"]).await;
        let session = api.session(60_000).await;
        api.claim(session, P, 1).await;
        let body = json!({ "process": P, "max": 1, "wait_ms": 50 });
        let reply = api
            .post(
                &format!("/v1/sessions/{session}/claim"),
                body,
                StatusCode::OK,
            )
            .await;
        assert_eq!(reply["leases"], json!([]));
    })
    .await;
}

#[tokio::test]
async fn admins_retry_park_and_delete_items() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let item = format!("/v1/processes/{P}/items/a");
        let parked = api
            .post(&format!("{item}/park"), json!(null), StatusCode::OK)
            .await;
        assert_eq!(parked["state"], "parked");
        let session = api.session(30_000).await;
        assert!(
            api.claim(session, P, 1).await.is_empty(),
            "parked keys do not run"
        );
        let retried = api
            .post(&format!("{item}/retry"), json!(null), StatusCode::OK)
            .await;
        assert_eq!(retried["state"], "pending");
        let lease = api.claim(session, P, 1).await.remove(0);
        let busy = api.call(DELETE, &item, None).await;
        assert_eq!(
            busy.status,
            StatusCode::CONFLICT,
            "a running item is the worker's"
        );
        api.post(
            "/v1/leases/release",
            json!({ "lease": lease }),
            StatusCode::NO_CONTENT,
        )
        .await;
        assert_eq!(
            api.call(DELETE, &item, None).await.status,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            api.call(GET, &item, None).await.status,
            StatusCode::NOT_FOUND
        );
        let history = api.get_ok(&format!("/v1/processes/{P}/runs?key=a")).await;
        let rows: Vec<(&str, &str)> = history["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| {
                let actor = r["actor"].as_str().unwrap_or("-");
                (r["outcome"].as_str().expect("outcome"), actor)
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("deleted", "admin"),
                ("canceled", "-"),
                ("retried", "admin"),
                ("parked", "admin")
            ],
            "the forgotten key's runs and actions stay"
        );
    })
    .await;
}

#[tokio::test]
async fn health_readiness_metrics_and_the_openapi_document_answer() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        assert_eq!(api.get_ok("/healthz").await["status"], "ok");
        let ready = api.get_ok("/readyz").await;
        assert_eq!(ready["database"], db.engine);
        api.enqueue(P, &["a", "b"]).await;
        let metrics = api.call(GET, "/metrics", None).await;
        assert_eq!(metrics.status, StatusCode::OK);
        let text = metrics.text;
        assert!(text.contains(&format!("drover_items{{process=\"{P}\",state=\"pending\"}} 2")), "{text}");
        assert!(text.contains("drover_http_requests_total{method=\"POST\",route=\"/v1/processes/{process}/items\",status=\"200\"} 1"), "{text}");
        assert!(text.contains("drover_db_pool_max_connections"), "{text}");
        assert!(text.contains(&format!("workqueue_adds_total{{name=\"{P}\"}}")), "{text}");
        assert!(text.ends_with("# EOF\n"));
        let doc = api.get_ok("/openapi.json").await;
        assert!(doc["openapi"].as_str().expect("version").starts_with("3."));
        let claim = &doc["paths"]["/v1/sessions/{session}/claim"]["post"];
        assert!(claim.is_object());
        // This server has no tokens: its document asks for none.
        assert!(claim.get("security").is_none(), "{claim}");
    })
    .await;
}

#[tokio::test]
async fn the_dashboard_lists_processes_and_shows_a_hostile_key_as_text() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let hostile = "<script>alert(1)</script>";
        api.enqueue(P, &[hostile]).await;
        let overview = api.call(GET, "/", None).await;
        assert_eq!(overview.status, StatusCode::OK);
        assert!(overview.text.contains("http-equiv=\"refresh\""));
        assert!(overview.text.contains(&format!("data-process=\"{P}\"")));
        let page = api
            .call(
                GET,
                &format!("/ui/processes/{P}/items/{}", segment(hostile)),
                None,
            )
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        assert!(page.text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!page.text.contains(hostile));
        assert!(
            page.text.contains("Retry now"),
            "an open server's caller is an admin"
        );
        let list = api.call(GET, &format!("/ui/processes/{P}"), None).await;
        assert!(list.text.contains("&lt;script&gt;") && !list.text.contains(hostile));
        let search = api
            .call(
                GET,
                &format!("/ui/search?process={P}&key=%3Cscript%3E"),
                None,
            )
            .await;
        assert_eq!(search.status, StatusCode::SEE_OTHER);
    })
    .await;
}

#[tokio::test]
async fn the_dashboard_shows_each_process_resync_and_when_the_next_is_due() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let page = api.call(GET, &format!("/ui/processes/{P}"), None).await;
        assert!(page.text.contains("Resync: never"), "{}", page.text);
        db.store
            .process_configure(
                drover::store::ProcessConfigure::new(P)
                    .resync_every(Some(Duration::from_secs(3600)))
                    .resync_jitter(0.0),
            )
            .await
            .expect("configure");
        support::store::run_ready(&db.store, P, 1, &drover::store::Outcome::Done).await;
        let page = api.call(GET, &format!("/ui/processes/{P}"), None).await;
        assert!(
            page.text
                .contains("every 1h +0%, priority -100, first pass pending"),
            "{}",
            page.text
        );
        // A pass finds `a` idle and due in an hour: the next resync then.
        drover::runner::Resyncer::new(db.store.clone())
            .resync_process(P)
            .await
            .expect("resync");
        let overview = api.call(GET, "/", None).await;
        assert!(overview.text.contains("next in 59m"), "{}", overview.text);
    })
    .await;
}

#[tokio::test]
async fn dashboard_buttons_retry_and_park_and_refuse_cross_site_posts() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let park = format!("/ui/processes/{P}/items/a/park");
        let done = api.call(POST, &park, None).await;
        assert_eq!(done.status, StatusCode::SEE_OTHER);
        assert_eq!(api.counts(P).await.expect("counts")["parked"], 1);
        let request = axum::http::Request::post(format!("/ui/processes/{P}/items/a/retry"))
            .header("sec-fetch-site", "cross-site")
            .body(axum::body::Body::empty())
            .expect("request");
        assert_eq!(api.request(request).await.status, StatusCode::FORBIDDEN);
        assert_eq!(
            api.counts(P).await.expect("counts")["parked"],
            1,
            "nothing changed"
        );
        let retry = api
            .call(POST, &format!("/ui/processes/{P}/items/a/retry"), None)
            .await;
        assert_eq!(retry.status, StatusCode::SEE_OTHER);
        assert_eq!(api.counts(P).await.expect("counts")["pending"], 1);
    })
    .await;
}

/// The `href` and form `action` values of `page`, unescaped.
fn links(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for marker in [" href=\"", " action=\""] {
        for (at, _) in page.match_indices(marker) {
            let rest = &page[at + marker.len()..];
            out.push(rest[..rest.find('"').expect("a closing quote")].replace("&amp;", "&"));
        }
    }
    out
}

/// Where a browser on `from` goes for `href`: the path and query of the URL
/// it resolves, dot segments (`.`, `..`, `%2e`) removed as the URL standard
/// says.
fn resolved(from: &str, href: &str) -> String {
    let base = reqwest::Url::parse("http://127.0.0.1:7420").expect("base");
    let url = base.join(from).expect("page URL").join(href).expect("link");
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    }
}

#[tokio::test]
async fn the_dashboard_links_and_buttons_of_a_key_named_dot_or_dot_dot_reach_that_key() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &[".", ".."]).await;
        let list_path = format!("/ui/processes/{P}");
        let list = api.call(GET, &list_path, None).await;
        assert_eq!(list.status, StatusCode::OK, "{}", list.text);
        for key in [".", ".."] {
            let cell = "<td class=\"key\"><a href=\"";
            let href = list
                .text
                .match_indices(cell)
                .map(|(at, _)| {
                    let rest = &list.text[at + cell.len()..];
                    let (href, after) = rest.split_once('"').expect("a closing quote");
                    (href.replace("&amp;", "&"), after)
                })
                .find(|(_, after)| after.starts_with(&format!("><bdi>{key}</bdi></a>")))
                .map(|(href, _)| href)
                .unwrap_or_else(|| panic!("a link to key {key:?} on {}", list.text));
            let target = resolved(&list_path, &href);
            let page = api.call(GET, &target, None).await;
            assert_eq!(
                page.status,
                StatusCode::OK,
                "key {key:?}: its link {href:?} reaches {target:?}: {}",
                page.text
            );
            assert!(
                page.text
                    .contains(&format!("<td class=\"key\"><bdi>{key}</bdi></td>")),
                "key {key:?}: its link {href:?} reaches {target:?}, not the key's page: {}",
                page.text
            );
            let park = links(&page.text)
                .into_iter()
                .find(|l| l.contains("park"))
                .unwrap_or_else(|| panic!("key {key:?}: a park button on {}", page.text));
            let target_park = resolved(&target, &park);
            let parked = api.call(POST, &target_park, None).await;
            assert_eq!(
                parked.status,
                StatusCode::SEE_OTHER,
                "key {key:?}: its park button {park:?} posts to {target_park:?}: {}",
                parked.text
            );
            let back = parked.headers["location"].to_str().expect("location");
            assert_eq!(
                resolved(&target_park, back),
                target,
                "key {key:?}: the button leads back to the key's page"
            );
        }
        assert_eq!(
            api.counts(P).await.expect("counts")["parked"],
            2,
            "both keys parked from their pages"
        );
    })
    .await;
}

/// `keys` of `process` enqueued, and the first of them failed for good with
/// `error`, so the process page has an error group and its buttons.
async fn one_parked(db: &support::TestDb, process: &str, keys: &[&str], error: &str) {
    db.store
        .item_enqueue(ItemEnqueue::new(process, keys.iter().copied()))
        .await
        .expect("enqueue");
    let session = db.session().await;
    let claim = LeaseClaim {
        session: session.id,
        process: process.into(),
        max: 1,
        trace_links: false,
    };
    let leases = db.store.lease_claim(claim).await.expect("claim").leases;
    let outcome = Outcome::Permanent(error.into());
    let done = LeaseComplete {
        lease: &leases[0],
        outcome: &outcome,
        trace_id: None,
    };
    db.store.lease_complete(done).await.expect("complete");
}

/// The `href` of the first link whose text is `text` on `page`, unescaped.
fn link_to(page: &str, text: &str) -> Option<String> {
    page.split("<a ").skip(1).find_map(|a| {
        let href = a.split("href=\"").nth(1)?.split('"').next()?;
        let shown = a.split_once('>')?.1.split("</a").next()?;
        let shown = shown.replace("<bdi>", "").replace("</bdi>", "");
        (shown == text).then(|| href.replace("&amp;", "&"))
    })
}

/// The `value` of the form field `name` on `page`, unescaped.
fn field(page: &str, name: &str) -> Option<String> {
    let rest = page.split(&format!("name=\"{name}\" value=\"")).nth(1)?;
    Some(rest.split('"').next()?.replace("&amp;", "&"))
}

#[tokio::test]
async fn a_process_named_dot_or_dot_dot_is_reached_by_its_dashboard_links_and_buttons() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        for process in [".", ".."] {
            one_parked(&db, process, &["a", "b"], "disk\nfull").await;
            let overview = api.call(GET, "/", None).await;
            let href = link_to(&overview.text, process)
                .unwrap_or_else(|| panic!("a link to {process:?} on {}", overview.text));
            let page_path = resolved("/", &href);
            let page = api.call(GET, &page_path, None).await;
            assert_eq!(
                page.status,
                StatusCode::OK,
                "process {process:?}: its link {href:?} reaches {page_path:?}: {}",
                page.text
            );
            assert!(
                page.text
                    .contains("<bdi>a</bdi></a></td><td class=\"state\">parked"),
                "process {process:?}: {page_path:?} is not its page: {}",
                page.text
            );
            // The key search without a key leads to the same page.
            let search = format!("/ui/search?process={}&key=", segment(process));
            let found = api.call(GET, &search, None).await;
            let to = found.headers["location"].to_str().expect("location");
            assert_eq!(resolved(&search, to), page_path, "process {process:?}");
            // The next page of a page of one.
            let one = api.call(GET, &format!("{page_path}&limit=1"), None).await;
            let next = links(&one.text)
                .into_iter()
                .find(|l| l.contains("after="))
                .unwrap_or_else(|| panic!("a next link on {}", one.text));
            let rest = api.call(GET, &resolved(&page_path, &next), None).await;
            assert_eq!(rest.status, StatusCode::OK, "process {process:?}: {next:?}");
            assert!(rest.text.contains("<bdi>b</bdi></a></td>"), "{}", rest.text);
            // The filter form, as a browser sends a GET form: its fields
            // replace the query of its action.
            let action = field_action(&page.text, "filters");
            let named = field(&page.text, "process");
            let filter = match named {
                Some(named) => format!("process={}&state=pending", segment(&named)),
                None => "state=pending".to_owned(),
            };
            let target = resolved(&page_path, &format!("{action}?{filter}"));
            let filtered = api.call(GET, &target, None).await;
            assert_eq!(
                filtered.status,
                StatusCode::OK,
                "process {process:?}: {target:?}"
            );
            assert!(
                filtered.text.contains("<bdi>b</bdi></a></td>")
                    && !filtered.text.contains("<bdi>a</bdi></a></td>"),
                "process {process:?}: the filter form reaches {target:?}: {}",
                filtered.text
            );
            // Its buttons: retry all of the error group, then pause.
            let retry = links(&page.text)
                .into_iter()
                .find(|l| l.contains("errors/retry"))
                .unwrap_or_else(|| panic!("a retry-all button on {}", page.text));
            let signature = field(&page.text, "signature_encoded").expect("signature");
            let post = axum::http::Request::post(resolved(&page_path, &retry))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(format!(
                    "signature_encoded={signature}"
                )))
                .expect("request");
            let retried = api.request(post).await;
            assert_eq!(
                retried.status,
                StatusCode::SEE_OTHER,
                "process {process:?}: retry all posts to {retry:?}: {}",
                retried.text
            );
            let back = retried.headers["location"].to_str().expect("location");
            assert_eq!(resolved(&retry, back), page_path, "process {process:?}");
            let pause = links(&page.text)
                .into_iter()
                .find(|l| l.ends_with("pause") || l.contains("pause?"))
                .unwrap_or_else(|| panic!("a pause button on {}", page.text));
            let paused = api.call(POST, &resolved(&page_path, &pause), None).await;
            assert_eq!(
                paused.status,
                StatusCode::SEE_OTHER,
                "process {process:?}: pause posts to {pause:?}: {}",
                paused.text
            );
            let listed = db.store.process_list().await.expect("list");
            let settings = listed.iter().find(|s| s.process == process);
            assert!(
                settings.is_some_and(|s| s.limits.paused),
                "process {process:?} paused by its button"
            );
            let counts = api.counts(process).await.expect("counts");
            assert_eq!(
                (&counts["pending"], &counts["parked"]),
                (&json!(2), &json!(0)),
                "process {process:?}: its group retried"
            );
        }
    })
    .await;
}

/// The `action` of the form `id` on `page`, unescaped.
fn field_action(page: &str, id: &str) -> String {
    let form = page
        .split(&format!("<form id=\"{id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("a form {id} on {page}"));
    let action = form.split("action=\"").nth(1).expect("an action");
    action
        .split('"')
        .next()
        .expect("a quote")
        .replace("&amp;", "&")
}

/// Where `page` shows U+202E RIGHT-TO-LEFT OVERRIDE outside an isolate (a
/// `<bdi>`, or FSI/LRI/RLI … PDI in text): the byte offsets, with what
/// surrounds them. Attribute values are not shown text, so they are skipped.
fn overrides_outside_an_isolate(page: &str) -> Vec<String> {
    let (mut bdi, mut isolates) = (0_usize, 0_usize);
    // Quotes still to pass before the text goes on: 2 at `="`, 1 inside.
    let mut quotes = 0;
    let mut found = Vec::new();
    for (at, c) in page.char_indices() {
        if quotes > 0 {
            quotes -= usize::from(c == '"');
            continue;
        }
        let rest = &page[at..];
        if rest.starts_with("=\"") {
            quotes = 2;
        } else if rest.starts_with("<bdi>") {
            bdi += 1;
        } else if rest.starts_with("</bdi>") {
            bdi = bdi.saturating_sub(1);
        }
        match c {
            '\u{2066}'..='\u{2068}' => isolates += 1,
            '\u{2069}' => isolates = isolates.saturating_sub(1),
            '\u{202E}' if bdi == 0 && isolates == 0 => {
                let before: String = page[..at].chars().rev().take(60).collect();
                let after: String = page[at..].chars().take(40).collect();
                let before: String = before.chars().rev().collect();
                found.push(format!("{at}: …{before}{after}…"));
            }
            _ => {}
        }
    }
    found
}

#[tokio::test]
async fn every_name_a_caller_chose_is_bidi_isolated_on_the_dashboard() {
    each_engine(|db| async move {
        let process = "p\u{202E}rocess";
        one_parked(
            &db,
            process,
            &["k\u{202E}ey", "held\u{202E}"],
            "e\u{202E}rror",
        )
        .await;
        let mut start = SessionStart::new("c\u{202E}omponent", Duration::from_secs(600));
        start.identity.host = Some("h\u{202E}ost".into());
        start.identity.version = Some("v\u{202E}1".into());
        let worker = db.store.session_start(start).await.expect("session");
        let claim = LeaseClaim {
            session: worker.id,
            process: process.into(),
            max: 1,
            trace_links: false,
        };
        assert_eq!(
            db.store
                .lease_claim(claim)
                .await
                .expect("claim")
                .leases
                .len(),
            1
        );
        let api = Api::new(&db.store);
        let p = segment(process);
        for path in [
            "/".to_owned(),
            "/ui/workers".to_owned(),
            format!("/ui/processes/{p}"),
            format!("/ui/processes/{p}/items/{}", segment("k\u{202E}ey")),
            format!("/ui/processes/{p}/items/{}", segment("held\u{202E}")),
        ] {
            let page = api.call(GET, &path, None).await;
            assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.text);
            assert!(page.text.contains('\u{202E}'), "{path} shows the names");
            let raw = overrides_outside_an_isolate(&page.text);
            assert!(raw.is_empty(), "{path}: names not isolated at {raw:#?}");
        }
    })
    .await;
}

/// A claim whose commit the server cannot know (its link to the database cut
/// at the commit) is answered 503 `commit_unknown`, and the server leaves the
/// session as it is: the worker's runs under it may still be going (here
/// `held`'s), and closed at once, their keys could start elsewhere beside
/// them. The worker gives the session up itself, once its runs have stopped,
/// and the close hands back every key, the ones the lost answer leased too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_commit_is_unknown_leaves_the_session_to_its_worker() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let (proxy, proxied) = support::commit_cut::CommitCut::in_front_of(&base, &db.url).await;
    let api = Api::new(&proxied);
    let session = api.session(600_000).await;
    api.enqueue(P, &["held"]).await;
    assert_eq!(api.claim(session, P, 10).await.len(), 1);
    api.enqueue(P, &["a", "b"]).await;
    proxy.arm();
    let uri = format!("/v1/sessions/{session}/claim");
    let unknown = api
        .post(
            &uri,
            json!({ "process": P, "max": 10 }),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
    assert_eq!(unknown["error"], "commit_unknown", "{unknown}");
    tokio::time::timeout(Duration::from_secs(5), proxy.cut())
        .await
        .expect("the claim's commit was the one cut");
    // The claim did commit: both keys were started, and nothing was handed
    // back, held's lease included.
    let counts = api.counts(P).await.expect("process listed");
    assert_eq!(
        (&counts["pending"], &counts["running"]),
        (&json!(0), &json!(3))
    );
    let closed = api
        .call(DELETE, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{:?}", closed.json());
    assert_eq!(closed.json()["released"], 3, "{:?}", closed.json());
    let fresh = api.session(600_000).await;
    assert_eq!(api.claim(fresh, P, 10).await.len(), 3);
    drop(api);
    proxied.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// The item `key` of [`P`] as the API shows it.
async fn item(api: &Api, key: &str) -> Value {
    api.get_ok(&format!("/v1/processes/{P}/items/{key}")).await["item"].clone()
}

#[tokio::test]
async fn outcomes_with_a_nul_byte_or_a_megabyte_of_error_are_stored_cleaned_never_a_5xx() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["nul", "big", "batch-nul", "batch-big", "over"])
            .await;
        let session = api.session(30_000).await;
        let leases = api.claim(session, P, 5).await;
        let lease = |key: &str| leases.iter().find(|l| l["key"] == key).unwrap();
        let permanent = |error: &str| json!({ "type": "permanent", "error": error });
        let nul = "bad\0byte";
        // A million bytes of two-byte characters: within the 1 MiB body limit.
        let big = "é".repeat(500_000);
        for (key, error) in [("nul", nul), ("big", &big)] {
            let body = complete_body(lease(key), permanent(error));
            api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT)
                .await;
        }
        let batch = json!({ "completions": [
            complete_body(lease("batch-nul"), permanent(nul)),
            complete_body(lease("batch-big"), permanent(&big[..400_000])),
        ] });
        let results = api
            .post("/v1/leases/complete-batch", batch, StatusCode::OK)
            .await;
        for result in results["results"].as_array().unwrap() {
            assert!(result["error"].is_null(), "{result}");
        }
        for key in ["nul", "batch-nul"] {
            let item = item(&api, key).await;
            assert_eq!(item["state"], "parked", "{key}");
            assert_eq!(item["last_error"], "bad\u{FFFD}byte", "{key}");
        }
        for key in ["big", "batch-big"] {
            let item = item(&api, key).await;
            assert_eq!(item["state"], "parked", "{key}");
            let error = item["last_error"].as_str().unwrap();
            assert!(
                error.len() <= drover::store::MAX_TEXT_BYTES,
                "{key}: {}",
                error.len()
            );
            assert!(
                error.starts_with("éé") && error.ends_with(" bytes cut]"),
                "{key}"
            );
        }
        // A full mebibyte of error does not fit the body: 413, and the lease
        // is still held (the worker may send a shorter error).
        let body = complete_body(lease("over"), permanent(&"x".repeat(1 << 20)));
        api.post("/v1/leases/complete", body, StatusCode::PAYLOAD_TOO_LARGE)
            .await;
        assert_eq!(item(&api, "over").await["state"], "running");
    })
    .await;
}

/// Runs every ready key of `P` once over the API, failing it permanently with
/// the error `error` gives for its key.
async fn fail_all(api: &Api, error: impl Fn(&str) -> String) {
    let session = api.session(30_000).await;
    for lease in api.claim(session, P, 100).await {
        let key = lease["key"].as_str().expect("key").to_owned();
        let outcome = json!({ "type": "permanent", "error": error(&key) });
        let body = complete_body(&lease, outcome);
        api.post("/v1/leases/complete", body, StatusCode::NO_CONTENT)
            .await;
    }
}

#[tokio::test]
async fn error_groups_are_listed_and_acted_on_by_filter() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["vm-1", "vm-22"]).await;
        fail_all(&api, |k| format!("{k}: timeout after {}s", k.len())).await;
        api.enqueue(P, &["db-1"]).await;
        fail_all(&api, |_| "connection refused".into()).await;
        let groups = api.get_ok(&format!("/v1/processes/{P}/error-groups")).await;
        let first = &groups["groups"][0];
        assert_eq!(first["signature"], "<key>: timeout after <n>s", "{groups}");
        assert_eq!(
            (&first["count"], &first["states"]),
            (&json!(2), &json!(["parked"]))
        );
        assert_eq!(groups["groups"][1]["sample"], "connection refused");
        let one = api
            .get_ok(&format!("/v1/processes/{P}/error-groups?limit=1"))
            .await;
        assert_eq!(one["groups"].as_array().expect("groups").len(), 1);

        let retry = json!({ "error": first["signature"] });
        let done = api
            .post(
                &format!("/v1/processes/{P}/items:retry"),
                retry,
                StatusCode::OK,
            )
            .await;
        assert_eq!(done, json!({ "changed": 2 }));
        let detail = api.get_ok(&format!("/v1/processes/{P}/items/vm-1")).await;
        assert_eq!(detail["item"]["state"], "pending");
        assert_eq!(
            (&detail["runs"][0]["outcome"], &detail["runs"][0]["actor"]),
            (&json!("retried"), &json!("admin"))
        );
        let db_item = api.get_ok(&format!("/v1/processes/{P}/items/db-1")).await;
        assert_eq!(
            db_item["item"]["state"], "parked",
            "another group is untouched"
        );

        let park = json!({ "key_prefix": "vm-", "reason": "maintenance" });
        let parked = api
            .post(
                &format!("/v1/processes/{P}/items:park"),
                park,
                StatusCode::OK,
            )
            .await;
        assert_eq!(parked["changed"], 2);
        let deleted = api
            .post(
                &format!("/v1/processes/{P}/items:delete"),
                json!({ "state": "parked" }),
                StatusCode::OK,
            )
            .await;
        assert_eq!(deleted["changed"], 3);
        assert_eq!(api.counts(P).await.expect("counts")["parked"], 0);
    })
    .await;
}

#[tokio::test]
async fn bulk_actions_refuse_filters_that_could_act_on_everything_or_on_running_keys() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let uri = |action: &str| format!("/v1/processes/{P}/items:{action}");
        for (action, body) in [
            ("delete", json!({})),
            ("retry", json!({ "key_prefix": "", "error": "" })),
            ("park", json!({ "state": "running" })),
            (
                "retry",
                json!({ "state": "parked", "reason": "only for park" }),
            ),
            ("delete", json!({ "key_prefix": "a\u{0}" })),
            ("delete", json!({ "everything": true })),
        ] {
            let refused = api
                .post(&uri(action), body.clone(), StatusCode::BAD_REQUEST)
                .await;
            assert_eq!(
                refused["error"], "bad_request",
                "{action} {body}: {refused}"
            );
        }
        assert_eq!(api.counts(P).await.expect("counts")["pending"], 1);
        let unknown = api
            .call(
                POST,
                "/v1/processes/nope/items:retry",
                Some(json!({ "state": "parked" })),
            )
            .await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
        let missing = api.call(GET, "/v1/processes/nope/error-groups", None).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        let bad = api
            .call(
                GET,
                &format!("/v1/processes/{P}/error-groups?limit=0"),
                None,
            )
            .await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    })
    .await;
}

/// Keys that failed with an empty error form a group whose signature is
/// empty; a bulk action by an empty signature is refused (it names no keys),
/// so the dashboard offers no buttons for that group. Before, it showed
/// "retry all", "park all" and "delete all", each answered with a refusal.
#[tokio::test]
async fn an_empty_errors_group_has_no_bulk_buttons() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "b"]).await;
        fail_all(&api, |_| String::new()).await;
        let page = api.call(GET, &format!("/ui/processes/{P}"), None).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(page.text.contains("id=\"errors\""), "{}", page.text);
        assert!(page.text.contains("an empty error"), "{}", page.text);
        assert!(!page.text.contains("retry all"), "{}", page.text);
    })
    .await;
}

#[tokio::test]
async fn dashboard_lists_error_groups_and_its_buttons_act_on_a_whole_group() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["<b>x1</b>", "y-2", "z"]).await;
        fail_all(&api, |k| {
            if k == "z" {
                "other".into()
            } else {
                format!("{k} broke <i>7</i> times")
            }
        })
        .await;
        let page = api.call(GET, &format!("/ui/processes/{P}"), None).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(page.text.contains("id=\"errors\""), "{}", page.text);
        assert!(
            page.text
                .contains("&lt;key&gt; broke &lt;i&gt;&lt;n&gt;&lt;/i&gt; times")
        );
        assert!(!page.text.contains("<i>7</i>"), "every value is escaped");
        assert!(page.text.contains("retry all") && page.text.contains("delete all"));

        let form = |signature: &str| {
            axum::http::Request::post(format!("/ui/processes/{P}/errors/retry"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(format!(
                    "signature={}",
                    segment(signature)
                )))
                .expect("request")
        };
        let retried = api.request(form("<key> broke <i><n></i> times")).await;
        assert_eq!(retried.status, StatusCode::SEE_OTHER, "{}", retried.text);
        assert_eq!(
            retried.headers["location"],
            format!("/ui/processes/{P}").as_str()
        );
        let counts = api.counts(P).await.expect("counts");
        assert_eq!(
            (&counts["pending"], &counts["parked"]),
            (&json!(2), &json!(1))
        );
        let delete = axum::http::Request::post(format!("/ui/processes/{P}/errors/delete"))
            .body(axum::body::Body::from("signature=other"))
            .expect("request");
        assert_eq!(api.request(delete).await.status, StatusCode::SEE_OTHER);
        assert_eq!(api.counts(P).await.expect("counts")["parked"], 0);
        let gone = api
            .call(GET, &format!("/v1/processes/{P}/items/z"), None)
            .await;
        assert_eq!(gone.status, StatusCode::NOT_FOUND, "deleted");
    })
    .await;
}

#[tokio::test]
async fn triage_lists_parked_first_pages_by_cursor_and_filters_by_prefix() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["<script>x"]).await;
        db.store.clock().advance(Duration::from_millis(5));
        api.enqueue(P, &["a1", "a2", "b1"]).await;
        let path = format!("/v1/processes/{P}/items/b1/park");
        let parked = api.call(POST, &path, None).await;
        assert_eq!(parked.status, StatusCode::OK, "{}", parked.text);
        let first = api
            .get_ok(&format!("/v1/processes/{P}/triage?limit=2"))
            .await;
        let keys = |page: &Value| -> Vec<String> {
            let items = page["items"].as_array().expect("items");
            items
                .iter()
                .map(|i| i["key"].as_str().expect("key").to_owned())
                .collect()
        };
        assert_eq!(
            keys(&first),
            ["b1", "<script>x"],
            "parked first, then claim order"
        );
        let next = first["next"].as_str().expect("a next page").to_owned();
        let rest = api
            .get_ok(&format!(
                "/v1/processes/{P}/triage?limit=2&after={}",
                segment(&next)
            ))
            .await;
        let mut rest_keys = keys(&rest);
        rest_keys.sort();
        assert_eq!(rest_keys, ["a1", "a2"], "one batch: ready together");
        assert_eq!(rest["next"], Value::Null);
        let a = api
            .get_ok(&format!("/v1/processes/{P}/triage?prefix=a&state=pending"))
            .await;
        assert_eq!(keys(&a), ["a1", "a2"]);
        let bad = api
            .call(
                GET,
                &format!("/v1/processes/{P}/triage?after=nonsense"),
                None,
            )
            .await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
        // The dashboard's page: the filter's value and the keys stay text.
        let hostile = segment("<script>");
        let page = api
            .call(
                GET,
                &format!("/ui/processes/{P}?prefix={hostile}&limit=1"),
                None,
            )
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        assert!(
            page.text.contains("value=\"&lt;script&gt;\""),
            "{}",
            page.text
        );
        assert!(!page.text.contains("<script>"), "{}", page.text);
        let all = api
            .call(GET, &format!("/ui/processes/{P}?limit=1"), None)
            .await;
        assert!(all.text.contains("id=\"next\""), "{}", all.text);
    })
    .await;
}

#[tokio::test]
async fn workers_are_listed_with_their_identity_leases_and_expiry() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "<b>"]).await;
        let body = json!({ "component": "<script>w</script>", "ttl_ms": 60_000,
                           "host": "node-7", "pid": 4242, "version": "9.9.9" });
        let new = api.post("/v1/sessions", body, StatusCode::CREATED).await;
        let new = new["id"].as_i64().expect("id");
        let leases = api.claim(new, P, 2).await;
        assert_eq!(leases.len(), 2);
        // A client older than the identity fields still starts a session.
        let old = api.session(1_000).await;
        db.store.clock().advance(Duration::from_secs(2));
        let list = api.get_ok("/v1/sessions").await;
        let sessions = list["sessions"].as_array().expect("sessions");
        assert_eq!(sessions.len(), 2, "{list}");
        let (first, second) = (&sessions[0], &sessions[1]);
        assert_eq!(first["id"], new);
        assert_eq!(
            (&first["host"], &first["pid"], &first["version"]),
            (&json!("node-7"), &json!(4242), &json!("9.9.9"))
        );
        assert_eq!(
            (&first["expired"], &first["lease_count"]),
            (&json!(false), &json!(2))
        );
        let mut held: Vec<_> = first["leases"]
            .as_array()
            .expect("leases")
            .iter()
            .map(|l| {
                (
                    l["key"].as_str().expect("key").to_owned(),
                    l["token"].as_i64().expect("token"),
                )
            })
            .collect();
        held.sort();
        let mut claimed: Vec<_> = leases
            .iter()
            .map(|l| {
                (
                    l["key"].as_str().expect("key").to_owned(),
                    l["token"].as_i64().expect("token"),
                )
            })
            .collect();
        claimed.sort();
        assert_eq!(held, claimed, "each lease with its fencing token");
        assert_eq!(second["id"], old);
        assert_eq!(
            (&second["host"], &second["expired"]),
            (&Value::Null, &json!(true))
        );
        let page = api.call(GET, "/ui/workers", None).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            page.text.contains("node-7") && page.text.contains("4242"),
            "{}",
            page.text
        );
        assert!(
            page.text.contains("expired, awaiting reclaim"),
            "{}",
            page.text
        );
        assert!(page.text.contains("&lt;script&gt;w&lt;/script&gt;"));
        assert!(
            !page.text.contains("<script>") && !page.text.contains("<b>"),
            "{}",
            page.text
        );
        // The key page names its run's worker.
        let item = api
            .call(GET, &format!("/ui/processes/{P}/items/a"), None)
            .await;
        assert!(
            item.text.contains("on <bdi>node-7</bdi>, pid 4242"),
            "{}",
            item.text
        );
        let long = json!({ "component": "w", "ttl_ms": 1000, "host": "h".repeat(2000) });
        let refused = api.call(POST, "/v1/sessions", Some(long)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text);
    })
    .await;
}

#[tokio::test]
async fn charts_and_series_show_runs_per_minute_and_the_sampled_depth() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "b", "c"]).await;
        let sample = DepthSample {
            keep: Duration::from_secs(3600),
            min_gap: Duration::from_secs(30),
        };
        assert_eq!(db.store.depth_sample(sample).await.expect("sample"), 1);
        assert_eq!(
            db.store.depth_sample(sample).await.expect("sample"),
            0,
            "one per min_gap"
        );
        let session = api.session(60_000).await;
        for lease in api.claim(session, P, 2).await {
            let outcome = if lease["key"] == "a" {
                json!({ "type": "done" })
            } else {
                json!({ "type": "transient", "error": "<i>flaky</i>" })
            };
            api.post(
                "/v1/leases/complete",
                json!({ "lease": lease, "outcome": outcome }),
                StatusCode::NO_CONTENT,
            )
            .await;
        }
        db.store.clock().advance(Duration::from_secs(90));
        assert_eq!(db.store.depth_sample(sample).await.expect("sample"), 1);
        let series = api.get_ok(&format!("/v1/processes/{P}/series")).await;
        let runs = series["runs"].as_array().expect("runs");
        let total: u64 = runs
            .iter()
            .map(|r| r["count"].as_u64().expect("count"))
            .sum();
        assert_eq!(total, 2, "{series}");
        let outcomes: Vec<_> = runs
            .iter()
            .map(|r| r["outcome"].as_str().expect("outcome"))
            .collect();
        assert!(
            outcomes.contains(&"done") && outcomes.contains(&"retry"),
            "{series}"
        );
        let depth = series["depth"].as_array().expect("depth");
        assert_eq!(depth.len(), 2, "{series}");
        assert_eq!(
            (&depth[0]["pending"], &depth[1]["pending"]),
            (&json!(3), &json!(2)),
            "{series}"
        );
        // a converged; the failed key's 1 s backoff is long over.
        let page = api.call(GET, &format!("/ui/processes/{P}"), None).await;
        assert!(
            page.text.contains("id=\"runs-chart\"") && page.text.contains("<svg"),
            "{}",
            page.text
        );
        assert!(page.text.contains("<polyline"), "{}", page.text);
        // Samples older than `keep` go.
        db.store.clock().advance(Duration::from_secs(7200));
        db.store.depth_sample(sample).await.expect("sample");
        let later = api.get_ok(&format!("/v1/processes/{P}/series")).await;
        assert_eq!(
            later["depth"].as_array().expect("depth").len(),
            1,
            "{later}"
        );
        assert_eq!(
            later["runs"],
            json!([]),
            "an hour later no run is in the window"
        );
        let unknown = api.call(GET, "/v1/processes/nope/series", None).await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    })
    .await;
}
