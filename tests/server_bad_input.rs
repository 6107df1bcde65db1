//! Bad input, case by case, on every engine: the status (400 naming the field,
//! 422 invalid key, 409 stale lease, 413 too large, 404 unknown), a JSON error
//! body, never a 5xx, and never a change of state.

mod server_support;
mod support;

use axum::http::StatusCode;
use drover::server::ServerOptions;
use drover::store::StoreEngine as _;
use serde_json::{Value, json};
use server_support::{Api, GET, POST, Reply};
use support::each_engine;

const P: &str = "provision";

/// Asserts `reply` is a JSON error with `status` and, if given, naming `field`.
fn rejected(reply: &Reply, status: StatusCode, field: Option<&str>) -> Value {
    assert_eq!(reply.status, status, "{}", reply.text);
    let body = reply.json();
    assert!(
        body["error"].is_string() && body["message"].is_string(),
        "{body}"
    );
    if let Some(field) = field {
        assert_eq!(body["field"], field, "{body}");
    }
    body
}

/// The item counts (without the ever-growing age), to prove a rejected request
/// changed nothing.
async fn snapshot(api: &Api) -> Value {
    let mut list = api.get_ok("/v1/processes").await;
    for process in list["processes"].as_array_mut().expect("processes") {
        process["oldest_pending_age_ms"] = Value::Null;
    }
    list
}

#[tokio::test]
async fn malformed_json_and_wrong_types_are_400_naming_the_field() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let before = snapshot(&api).await;
        let uri = format!("/v1/processes/{P}/items");
        let cases: [(&str, Option<&str>); 7] = [
            ("{\"keys\": [", None),
            ("", None),
            ("{\"keys\": [\"ok\", 7]}", Some("keys[1]")),
            ("{\"keys\": \"a\"}", Some("keys")),
            ("{\"keys\": [\"b\"], \"priority\": \"high\"}", Some("priority")),
            ("{\"keys\": [\"b\"], \"after_ms\": -1}", Some("after_ms")),
            ("{}", Some("keys")),
        ];
        for (body, field) in cases {
            let reply = api.send(POST, &uri, Some(body.into()), None).await;
            rejected(&reply, StatusCode::BAD_REQUEST, field);
        }
        let unknown = api.send(POST, &uri, Some(r#"{"keys":["b"],"prio":1}"#.into()), None).await;
        rejected(&unknown, StatusCode::BAD_REQUEST, None);
        let session = api.send(POST, "/v1/sessions", Some(r#"{"component":"c","ttl_ms":0}"#.into()), None).await;
        rejected(&session, StatusCode::BAD_REQUEST, Some("ttl_ms"));
        let outcome = json!({ "lease": { "session": 1, "process": P, "key": "a", "token": 1, "attempt": 1 }, "outcome": { "type": "maybe" } });
        let reply = api.send(POST, "/v1/leases/complete", Some(outcome.to_string()), None).await;
        rejected(&reply, StatusCode::BAD_REQUEST, Some("outcome.type"));
        assert_eq!(snapshot(&api).await, before);
    })
    .await;
}

#[tokio::test]
async fn bad_query_and_path_parameters_are_400_naming_them() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let cases = [
            (format!("/v1/processes/{P}/items?limit=0"), "limit"),
            (format!("/v1/processes/{P}/items?limit=many"), "limit"),
            (format!("/v1/processes/{P}/items?state=sleeping"), "state"),
            (
                format!("/v1/processes/{P}/items/a?runs_limit=5000"),
                "runs_limit",
            ),
        ];
        for (uri, field) in cases {
            rejected(
                &api.call(GET, &uri, None).await,
                StatusCode::BAD_REQUEST,
                Some(field),
            );
        }
        let heartbeat = api.call(POST, "/v1/sessions/abc/heartbeat", None).await;
        rejected(&heartbeat, StatusCode::BAD_REQUEST, Some("session"));
        let claim = api
            .send(
                POST,
                "/v1/sessions/1/claim",
                Some(json!({ "process": P, "max": 0 }).to_string()),
                None,
            )
            .await;
        rejected(&claim, StatusCode::BAD_REQUEST, Some("max"));
        let bad_utf8 = api
            .call(GET, &format!("/v1/processes/{P}/items/%FF"), None)
            .await;
        rejected(&bad_utf8, StatusCode::BAD_REQUEST, Some("path"));
    })
    .await;
}

#[tokio::test]
async fn invalid_keys_are_422_and_nothing_of_the_batch_is_written() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let before = snapshot(&api).await;
        let uri = format!("/v1/processes/{P}/items");
        for bad in [String::new(), "k".repeat(1025), "a\0b".into()] {
            let body = json!({ "keys": ["fine", bad] }).to_string();
            let reply = api.send(POST, &uri, Some(body), None).await;
            let error = rejected(&reply, StatusCode::UNPROCESSABLE_ENTITY, Some("keys"));
            assert_eq!(error["error"], "invalid_key");
        }
        let nul = api
            .call(GET, &format!("/v1/processes/{P}/items/a%00b"), None)
            .await;
        rejected(&nul, StatusCode::UNPROCESSABLE_ENTITY, Some("key"));
        let long_process = format!("/v1/processes/{}/items", "p".repeat(1025));
        let reply = api
            .send(
                POST,
                &long_process,
                Some(json!({ "keys": ["a"] }).to_string()),
                None,
            )
            .await;
        rejected(&reply, StatusCode::UNPROCESSABLE_ENTITY, Some("process"));
        assert_eq!(snapshot(&api).await, before);
    })
    .await;
}

#[tokio::test]
async fn unknown_leases_and_stale_fencing_tokens_are_409_and_change_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(30_000).await;
        let mut lease = api.claim(session, P, 1).await.remove(0);
        let before = snapshot(&api).await;
        let token = lease["token"].as_i64().expect("token");
        lease["token"] = json!(token + 1000);
        let stale = json!({ "lease": lease, "outcome": { "type": "done" } });
        let reply = api.send(POST, "/v1/leases/complete", Some(stale.to_string()), None).await;
        assert_eq!(rejected(&reply, StatusCode::CONFLICT, None)["error"], "lease_lost");
        let unknown = json!({ "lease": { "session": session, "process": P, "key": "zzz", "token": token, "attempt": 1 } });
        let reply = api.send(POST, "/v1/leases/release", Some(unknown.to_string()), None).await;
        rejected(&reply, StatusCode::CONFLICT, None);
        let no_session = api.send(POST, "/v1/sessions/999999/claim", Some(json!({ "process": P }).to_string()), None).await;
        assert_eq!(rejected(&no_session, StatusCode::CONFLICT, None)["error"], "session_expired");
        assert_eq!(snapshot(&api).await, before);
    })
    .await;
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().body_limit(4096));
        let keys: Vec<String> = (0..1000).map(|i| format!("key-{i}")).collect();
        let body = json!({ "keys": keys }).to_string();
        assert!(body.len() > 4096);
        let reply = api
            .send(POST, &format!("/v1/processes/{P}/items"), Some(body), None)
            .await;
        rejected(&reply, StatusCode::PAYLOAD_TOO_LARGE, None);
        assert_eq!(snapshot(&api).await["processes"], json!([]));
    })
    .await;
}

#[tokio::test]
async fn unknown_routes_processes_and_items_are_404() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        rejected(
            &api.call(GET, "/v2/nothing", None).await,
            StatusCode::NOT_FOUND,
            None,
        );
        let unknown_process = api.call(GET, "/v1/processes/nope/items", None).await;
        rejected(&unknown_process, StatusCode::NOT_FOUND, None);
        let park = api
            .call(POST, "/v1/processes/nope/items/a/park", None)
            .await;
        rejected(&park, StatusCode::NOT_FOUND, None);
        assert_eq!(snapshot(&api).await["processes"], json!([]));
    })
    .await;
}

#[tokio::test]
async fn triage_refuses_a_nul_in_its_prefix_or_cursor_with_400() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        for query in ["prefix=a%00b", "after=parked%3Ak%3Aa%00"] {
            let reply = api
                .call(GET, &format!("/v1/processes/{P}/triage?{query}"), None)
                .await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{query}: {}",
                reply.text
            );
        }
    })
    .await;
}

/// A query parameter whose percent-encoding is not UTF-8 is refused (400
/// naming it), as such a path segment is, never read as another name: decoded
/// lossily, `%FF` became U+FFFD, so a pause by query paused (and created) a
/// process `\u{FFFD}`, and a listing answered for a key nobody asked about.
#[tokio::test]
async fn a_query_parameter_not_valid_utf8_is_400_naming_it_and_changes_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let before = snapshot(&api).await;
        let cases = [
            (
                GET,
                format!("/v1/processes/{P}/items?after_key=%FF"),
                "after_key",
            ),
            (GET, format!("/v1/processes/{P}/runs?key=a%C3"), "key"),
            (
                GET,
                format!("/v1/processes/{P}/triage?prefix=%E2%82"),
                "prefix",
            ),
            (GET, "/v1/processes?after=%FF".to_owned(), "after"),
            (POST, "/v1/process/pause?process=%FF".to_owned(), "process"),
            (
                POST,
                "/v1/process/pause?process=ok&%FF=1".to_owned(),
                "query",
            ),
        ];
        for (method, uri, field) in cases {
            let reply = api.call(method, &uri, None).await;
            let body = rejected(&reply, StatusCode::BAD_REQUEST, Some(field));
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("UTF-8")),
                "{uri}: {body}"
            );
        }
        assert_eq!(snapshot(&api).await, before);
        // A U+FFFD sent as UTF-8 is a name like any other.
        let runs = api
            .call(GET, &format!("/v1/processes/{P}/runs?key=%EF%BF%BD"), None)
            .await;
        assert_eq!(runs.status, StatusCode::OK, "{}", runs.text);
    })
    .await;
}

/// A parameter or body field given twice is a 400 naming it, as a missing
/// one is (`field` was null: only the message named it).
#[tokio::test]
async fn a_parameter_given_twice_is_400_naming_it_and_changes_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let before = snapshot(&api).await;
        for (uri, field) in [
            (format!("/v1/processes/{P}/items?limit=5&limit=6"), "limit"),
            (format!("/v1/processes/{P}/runs?key=a&key=b"), "key"),
        ] {
            rejected(
                &api.call(GET, &uri, None).await,
                StatusCode::BAD_REQUEST,
                Some(field),
            );
        }
        let pause = api
            .call(POST, "/v1/process/pause?process=a&process=b", None)
            .await;
        rejected(&pause, StatusCode::BAD_REQUEST, Some("process"));
        let twice = r#"{"keys": ["b"], "keys": ["c"]}"#;
        let uri = format!("/v1/processes/{P}/items");
        let reply = api.send(POST, &uri, Some(twice.into()), None).await;
        rejected(&reply, StatusCode::BAD_REQUEST, Some("keys"));
        assert_eq!(snapshot(&api).await, before);
    })
    .await;
}

#[tokio::test]
async fn a_session_label_over_1024_bytes_is_400_naming_it_and_starts_no_session() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let long = "w".repeat(1025);
        for field in ["component", "host", "version"] {
            let mut body = json!({ "component": "c", "ttl_ms": 30_000 });
            body[field] = json!(long);
            let reply = api
                .send(POST, "/v1/sessions", Some(body.to_string()), None)
                .await;
            let refused = rejected(&reply, StatusCode::BAD_REQUEST, Some(field));
            assert!(
                refused["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("1024 bytes")),
                "{refused}"
            );
        }
        let sessions = api.get_ok("/v1/sessions").await;
        assert_eq!(sessions["sessions"], json!([]), "{sessions}");
        let fits = json!({ "component": "w".repeat(1024), "ttl_ms": 30_000 });
        let reply = api
            .send(POST, "/v1/sessions", Some(fits.to_string()), None)
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    })
    .await;
}

/// A worker token cannot grow the server without bound: once the database
/// holds `max_processes`, an enqueue to a new process name is refused with
/// 422 `too_many_processes` (no row, no `/metrics` label for it), while
/// enqueues to the processes it holds go on; an admin may still create one
/// through its settings.
#[tokio::test]
async fn enqueues_to_new_processes_over_the_cap_are_refused_and_the_known_ones_go_on() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().max_processes(3));
        for process in ["p1", "p2", "p3"] {
            api.enqueue(process, &["k"]).await;
        }
        let reply = api
            .call(
                POST,
                "/v1/processes/p4-spam/items",
                Some(json!({ "keys": ["k"] })),
            )
            .await;
        let body = rejected(&reply, StatusCode::UNPROCESSABLE_ENTITY, None);
        assert_eq!(body["error"], "too_many_processes", "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("3 processes")),
            "{body}"
        );
        api.enqueue("p1", &["again"]).await;
        let processes = api.get_ok("/v1/processes").await;
        let text = processes.to_string();
        assert!(!text.contains("p4-spam"), "{text}");
        let metrics = api.call(GET, "/metrics", None).await.text;
        assert!(!metrics.contains("p4-spam"), "no label for a refused name");
        assert!(
            metrics.contains("drover_enqueues_refused_total 1"),
            "the refusal is counted"
        );
        // The operator's own creation is not a worker's enqueue.
        let reply = api
            .call(
                axum::http::Method::PATCH,
                "/v1/processes/p5-ops/settings",
                Some(json!({ "concurrency": 2 })),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    })
    .await;
}

/// A database filled past the server's cap by other writers (`drover
/// enqueue`, a library) keeps its processes usable through the server: the
/// server reads only the first `max_processes` names (not every process,
/// 6 MB of settings a read at 100,000), and a held name past them is looked
/// up by name, so an enqueue to it goes through while a new name is refused.
#[tokio::test]
async fn a_database_past_the_cap_keeps_every_held_process_open_to_enqueues() {
    each_engine(|db| async move {
        for i in 1..=40 {
            db.store
                .item_enqueue(drover::store::ItemEnqueue::new(format!("p-{i:02}"), ["k"]))
                .await
                .expect("enqueue through the store");
        }
        let api = Api::with(&db.store, ServerOptions::default().max_processes(3));
        api.enqueue("p-37", &["again"]).await;
        api.enqueue("p-02", &["again"]).await;
        let reply = api
            .call(
                POST,
                "/v1/processes/spam/items",
                Some(json!({ "keys": ["k"] })),
            )
            .await;
        let body = rejected(&reply, StatusCode::UNPROCESSABLE_ENTITY, None);
        assert_eq!(body["error"], "too_many_processes", "{body}");
        api.enqueue("p-38", &["again"]).await;
    })
    .await;
}

/// `/metrics` stays bounded whatever the database holds (DESIGN.md rule 13):
/// other writers (a library, `drover enqueue`) are not held to
/// `max_processes`, and each process cost a scrape a database read and 35
/// series (4.8 MB at 2,000 processes, about 240 MB at 100,000). A scrape now
/// gives series to the first `metrics_max_processes` in name order and says
/// when it left some out.
#[tokio::test]
async fn metrics_give_series_to_at_most_metrics_max_processes() {
    each_engine(|db| async move {
        let name = if db.engine == "postgres" {
            "'p-' || lpad(i::text, 5, '0'), now()"
        } else {
            "printf('p-%05d', i), 0"
        };
        db.execute(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50) \
             INSERT INTO drover_processes (process, created_at) SELECT {name} FROM n"
        ))
        .await;
        let labelled = |text: &str, family: &str| {
            let mut names: Vec<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{family}{{process=\"")))
                .filter_map(|l| l.split('"').next().map(str::to_owned))
                .collect();
            names.sort();
            names.dedup();
            names
        };
        let capped = Api::with(
            &db.store,
            ServerOptions::default().metrics_max_processes(20),
        );
        let text = capped.call(GET, "/metrics", None).await.text;
        let first: Vec<String> = (1..=20).map(|i| format!("p-{i:05}")).collect();
        assert_eq!(
            labelled(&text, "drover_items"),
            first,
            "the first 20 by name"
        );
        assert_eq!(labelled(&text, "drover_process_paused"), first);
        assert!(
            text.contains("drover_metrics_processes_truncated 1"),
            "the scrape says it left processes out"
        );
        let all = Api::with(
            &db.store,
            ServerOptions::default().metrics_max_processes(50),
        );
        let text = all.call(GET, "/metrics", None).await.text;
        assert_eq!(labelled(&text, "drover_items").len(), 50);
        assert!(
            text.contains("drover_metrics_processes_truncated 0"),
            "50 of 50: nothing left out"
        );
    })
    .await;
}

/// An enqueue of no keys creates nothing, so it takes none of the room
/// `max_processes` leaves: empty enqueues to new names (a watcher flushing
/// an empty batch, or a caller on purpose) do not get a later enqueue that
/// would create a real process refused. Before, each one was counted as a
/// process the database held, and the next new process was refused 422
/// `too_many_processes` while the database held one.
#[tokio::test]
async fn empty_enqueues_to_new_names_take_no_room_under_the_process_cap() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().max_processes(3));
        api.enqueue("p1", &["k"]).await;
        for ghost in ["ghost-1", "ghost-2"] {
            let reply = api
                .call(
                    POST,
                    &format!("/v1/processes/{ghost}/items"),
                    Some(json!({ "keys": [] })),
                )
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{ghost}: {}", reply.text);
        }
        let reply = api
            .call(
                POST,
                "/v1/processes/p2/items",
                Some(json!({ "keys": ["k"] })),
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "the database holds one process of 3: {}",
            reply.text
        );
        let names: Vec<Value> = api
            .every_page("/v1/processes", "processes")
            .await
            .into_iter()
            .map(|p| p["process"].clone())
            .collect();
        assert_eq!(names, vec![json!("p1"), json!("p2")]);
    })
    .await;
}

/// A lease naming a key or a process no lease can have (a NUL, 1,025 bytes)
/// is 422 on every route that takes a lease, and a list's cursor naming one
/// is a bad query parameter (400), as triage's is:
/// PostgreSQL refused the NUL itself, and the caller's mistake came back as
/// a 500 (in a batch, an `internal` result the client sent again).
#[tokio::test]
async fn a_lease_or_cursor_no_key_can_match_is_422_never_a_5xx() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = api.session(30_000).await;
        let lease = api.claim(session, P, 1).await.remove(0);
        let before = snapshot(&api).await;
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        for (field, bad) in [
            ("key", "a\0b".to_owned()),
            ("key", "k".repeat(1025)),
            ("process", "p\0".to_owned()),
        ] {
            let mut named = lease.clone();
            named[field] = json!(bad);
            let done = json!({ "lease": named, "outcome": { "type": "done" } });
            for (uri, body) in [
                ("/v1/leases/complete", done.clone()),
                (
                    "/v1/leases/complete-batch",
                    json!({ "completions": [done.clone()] }),
                ),
                ("/v1/leases/release", json!({ "lease": named })),
                (
                    "/v1/leases/trace-link",
                    json!({ "lease": named, "context": { "traceparent": traceparent } }),
                ),
            ] {
                let reply = api.send(POST, uri, Some(body.to_string()), None).await;
                rejected(&reply, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
            }
        }
        let cursor = api
            .call(
                GET,
                &format!("/v1/processes/{P}/items?after_key=a%00b"),
                None,
            )
            .await;
        rejected(&cursor, StatusCode::BAD_REQUEST, Some("after_key"));
        assert_eq!(snapshot(&api).await, before);
    })
    .await;
}

/// The value of the metric line `name{labels}` on the `/metrics` page, 0
/// when the page has no such line.
async fn metric(api: &Api, series: &str) -> f64 {
    let page = api.call(GET, "/metrics", None).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    page.text
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().expect("a number"))
}

#[tokio::test]
async fn a_completion_sent_again_after_its_answer_was_lost_is_counted_once() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        // The metric families are the process's: a name of this test's own.
        let p = format!("resent-{}", db.engine);
        api.enqueue(&p, &["a", "b"]).await;
        let session = api.session(30_000).await;
        let leases = api.claim(session, &p, 2).await;
        assert_eq!(leases.len(), 2);
        let done = json!({ "lease": leases[0], "outcome": { "type": "done" } });
        let failed = json!({ "completions": [
            { "lease": leases[1], "outcome": { "type": "transient", "error": "boom" } },
        ] });
        for _ in 0..2 {
            // The second of each is what a worker sends when the first
            // answer was lost on the link: the store answers it as written.
            api.post("/v1/leases/complete", done.clone(), StatusCode::NO_CONTENT)
                .await;
            let answer = api
                .post("/v1/leases/complete-batch", failed.clone(), StatusCode::OK)
                .await;
            assert_eq!(answer["results"][0]["error"], Value::Null, "{answer}");
        }
        let outcomes = |outcome: &str| {
            format!("drover_outcomes_total{{process=\"{p}\",outcome=\"{outcome}\"}}")
        };
        assert_eq!(metric(&api, &outcomes("done")).await, 1.0);
        assert_eq!(metric(&api, &outcomes("transient")).await, 1.0);
        let retries = format!("workqueue_retries_total{{name=\"{p}\"}}");
        assert_eq!(metric(&api, &retries).await, 1.0);
        let runs = format!("workqueue_work_duration_seconds_count{{name=\"{p}\"}}");
        assert_eq!(metric(&api, &runs).await, 2.0);
    })
    .await;
}

/// An enqueue counts each key it wrote once in `workqueue_adds_total`, as
/// its answer does: a key given twice in one request counted twice (the
/// request's length), though the store wrote it once.
#[tokio::test]
async fn a_key_given_twice_in_one_enqueue_is_counted_once() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        // The metric families are the process's: a name of this test's own.
        let p = format!("twice-{}", db.engine);
        let answer = api.enqueue(&p, &["a", "a", "b", "a"]).await;
        assert_eq!(
            (answer["pending"].as_u64(), answer["dirty"].as_u64()),
            (Some(2), Some(0))
        );
        let adds = format!("workqueue_adds_total{{name=\"{p}\"}}");
        assert_eq!(metric(&api, &adds).await, 2.0);
    })
    .await;
}

/// An enqueue of more keys than the document's `maxItems`
/// ([`MAX_ENQUEUE_KEYS`](drover::api::MAX_ENQUEUE_KEYS)) is a 400 naming
/// `keys` that writes nothing: only the body's size bounded it, and
/// `--max-body` can raise that.
#[tokio::test]
async fn an_enqueue_of_more_keys_than_documented_is_400_and_writes_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let most = drover::api::MAX_ENQUEUE_KEYS;
        let keys: Vec<String> = (0..=most).map(|i| format!("{i:x}")).collect();
        let answer = api
            .post(
                "/v1/processes/many/items",
                serde_json::json!({ "keys": keys }),
                StatusCode::BAD_REQUEST,
            )
            .await;
        assert_eq!(answer["field"], "keys", "{answer}");
        let status = db.store.process_counts_all().await.expect("counts");
        assert!(status.iter().all(|c| c.process != "many"), "{status:?}");
        let answer = api
            .post(
                "/v1/processes/many/items",
                serde_json::json!({ "keys": keys[..most] }),
                StatusCode::OK,
            )
            .await;
        assert_eq!(answer["pending"].as_u64(), Some(most as u64));
    })
    .await;
}

#[tokio::test]
async fn a_start_time_made_up_by_the_worker_does_not_reach_the_work_duration() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let p = format!("made-up-start-{}", db.engine);
        api.enqueue(&p, &["a", "b"]).await;
        let session = api.session(30_000).await;
        let mut leases = api.claim(session, &p, 2).await;
        assert_eq!(leases.len(), 2);
        // A run of a few seconds at most, said to have started in year 1.
        leases[0]["started_at"] = json!("0001-01-01T00:00:00Z");
        leases[1]["started_at"] = json!("1970-01-01T00:00:00Z");
        let done = json!({ "lease": leases[0], "outcome": { "type": "done" } });
        api.post("/v1/leases/complete", done, StatusCode::NO_CONTENT)
            .await;
        let batch =
            json!({ "completions": [{ "lease": leases[1], "outcome": { "type": "done" } }] });
        api.post("/v1/leases/complete-batch", batch, StatusCode::OK)
            .await;
        let runs = format!("workqueue_work_duration_seconds_count{{name=\"{p}\"}}");
        assert_eq!(metric(&api, &runs).await, 2.0, "both runs are timed");
        let sum = format!("workqueue_work_duration_seconds_sum{{name=\"{p}\"}}");
        let took = metric(&api, &sum).await;
        // What the server saw: from its claim's answer to the completions.
        assert!(took < 600.0, "two runs of seconds took {took} s in all");
    })
    .await;
}

/// A lease another server over the same database handed out (a worker's
/// requests spread over nodes) is timed from the start its worker sent only
/// when that is plausible: one said to have started in year 1 is counted but
/// not timed, one that started a moment ago is timed.
#[tokio::test]
async fn a_lease_another_server_handed_out_is_timed_only_from_a_plausible_start() {
    each_engine(|db| async move {
        let (claimer, completer) = (Api::new(&db.store), Api::new(&db.store));
        let p = format!("foreign-start-{}", db.engine);
        claimer.enqueue(&p, &["a", "b"]).await;
        let session = claimer.session(30_000).await;
        let mut leases = claimer.claim(session, &p, 2).await;
        assert_eq!(leases.len(), 2);
        leases[0]["started_at"] = json!("0001-01-01T00:00:00Z");
        for lease in &leases {
            let done = json!({ "lease": lease, "outcome": { "type": "done" } });
            completer
                .post("/v1/leases/complete", done, StatusCode::NO_CONTENT)
                .await;
        }
        let done = format!("drover_outcomes_total{{process=\"{p}\",outcome=\"done\"}}");
        assert_eq!(metric(&completer, &done).await, 2.0, "both are counted");
        let runs = format!("workqueue_work_duration_seconds_count{{name=\"{p}\"}}");
        assert_eq!(
            metric(&completer, &runs).await,
            1.0,
            "only the plausible start is timed"
        );
        let sum = format!("workqueue_work_duration_seconds_sum{{name=\"{p}\"}}");
        let took = metric(&completer, &sum).await;
        assert!(took < 600.0, "a run of seconds took {took} s");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_outcome_whose_first_commit_was_unknown_is_counted_on_its_resend() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let (proxy, proxied) = support::commit_cut::CommitCut::in_front_of(&base, &db.url).await;
    let api = Api::new(&proxied);
    let p = "commit-unknown-resent";
    api.enqueue(p, &["a"]).await;
    let session = api.session(600_000).await;
    let lease = api.claim(session, p, 1).await.remove(0);
    let done = json!({ "lease": lease, "outcome": { "type": "done" } });
    proxy.arm_for("INSERT INTO drover_runs");
    let unknown = api
        .post(
            "/v1/leases/complete",
            done.clone(),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
    assert_eq!(unknown["error"], "commit_unknown", "{unknown}");
    tokio::time::timeout(std::time::Duration::from_secs(5), proxy.cut())
        .await
        .expect("the completion's commit was the one cut");
    // Written by the first try, which counted nothing: the resend counts it.
    api.post("/v1/leases/complete", done.clone(), StatusCode::NO_CONTENT)
        .await;
    api.post("/v1/leases/complete", done, StatusCode::NO_CONTENT)
        .await;
    let outcomes = format!("drover_outcomes_total{{process=\"{p}\",outcome=\"done\"}}");
    assert_eq!(metric(&api, &outcomes).await, 1.0);
    let runs = format!("workqueue_work_duration_seconds_count{{name=\"{p}\"}}");
    assert_eq!(metric(&api, &runs).await, 1.0);
    drop(api);
    proxied.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}
