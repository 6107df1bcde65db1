//! A session belongs to the token that started it (DESIGN.md rule 13): no
//! other token (admin included) may heartbeat, claim, complete, release or
//! close on it, on this server or on another over the same database; a
//! session started on the database directly belongs to no token; and a
//! viewer sees no fencing tokens, in the API or on the dashboard. On every
//! engine.

mod server_support;
mod support;

use axum::http::{Method, StatusCode};
use drover::server::{ServerOptions, Tokens};
use drover::store::{SessionStart, StoreEngine as _};
use serde_json::{Value, json};
use server_support::{Api, DELETE, GET, POST};
use support::each_engine;

const P: &str = "provision";

fn tokens() -> Tokens {
    Tokens::parse("viewer:v\nworker:w1\nworker:w2\nadmin:a").expect("tokens")
}

/// Every act on `session` (with `lease`, one of its leases), as
/// (method, uri, body).
fn acts(session: i64, lease: &Value) -> Vec<(Method, String, Option<String>)> {
    let done = json!({ "lease": lease, "outcome": { "type": "done" } });
    vec![
        (POST, format!("/v1/sessions/{session}/heartbeat"), None),
        (
            POST,
            format!("/v1/sessions/{session}/claim"),
            Some(json!({ "process": P, "max": 1 }).to_string()),
        ),
        (POST, "/v1/leases/complete".into(), Some(done.to_string())),
        (
            POST,
            "/v1/leases/complete-batch".into(),
            Some(json!({ "completions": [done] }).to_string()),
        ),
        (
            POST,
            "/v1/leases/release".into(),
            Some(json!({ "lease": lease }).to_string()),
        ),
        (DELETE, format!("/v1/sessions/{session}"), None),
    ]
}

/// Asserts that every act of [`acts`] by `token` is refused with 403
/// `not_your_session`, and that the session and its lease are untouched.
async fn refused(api: &Api, token: &str, session: i64, lease: &Value) {
    for (method, uri, body) in acts(session, lease) {
        let reply = api.send(method.clone(), &uri, body, Some(token)).await;
        assert_eq!(
            reply.status,
            StatusCode::FORBIDDEN,
            "{method} {uri} as {token}: {}",
            reply.text
        );
        assert_eq!(reply.json()["error"], "not_your_session", "{}", reply.text);
    }
    let item = api
        .send(GET, &format!("/v1/processes/{P}/items/a"), None, Some("a"))
        .await
        .json();
    assert_eq!(
        item["item"]["state"], "running",
        "the lease still holds: {item}"
    );
    assert_eq!(item["item"]["lease_session"], session, "{item}");
}

/// A server with [`tokens`], calling as `w1`, whose session holds key `a`:
/// the API, the session and its lease.
async fn w1_holding_a(store: &drover::store::Store) -> (Api, i64, Value) {
    let mut api = Api::with(store, ServerOptions::default().tokens(tokens()));
    api.token = Some("w1".into());
    api.enqueue(P, &["a"]).await;
    let session = api.session(30_000).await;
    let lease = api.claim(session, P, 1).await.remove(0);
    (api, session, lease)
}

#[tokio::test]
async fn only_the_token_that_started_a_session_may_act_on_it() {
    each_engine(|db| async move {
        let (api, session, lease) = w1_holding_a(&db.store).await;
        for token in ["w2", "a"] {
            refused(&api, token, session, &lease).await;
        }
        // Another server over the same database knows the owner too.
        let other = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        refused(&other, "w2", session, &lease).await;
        // The owner may do everything, on either server.
        let reply = other
            .send(
                POST,
                &format!("/v1/sessions/{session}/heartbeat"),
                None,
                Some("w1"),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let done = json!({ "lease": lease, "outcome": { "type": "done" } });
        let reply = api
            .send(
                POST,
                "/v1/leases/complete",
                Some(done.to_string()),
                Some("w1"),
            )
            .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text);
        let reply = api
            .send(DELETE, &format!("/v1/sessions/{session}"), None, Some("w1"))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    })
    .await;
}

/// A session started on the database directly, as a library worker does.
async fn library_session(db: &support::TestDb) -> drover::store::Session {
    db.store
        .session_start(SessionStart::new(
            "library",
            std::time::Duration::from_secs(30),
        ))
        .await
        .expect("session")
}

#[tokio::test]
async fn a_session_started_on_the_database_belongs_to_no_token() {
    each_engine(|db| async move {
        let mut api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        api.token = Some("w1".into());
        api.enqueue(P, &["a"]).await;
        let session = library_session(&db).await;
        let lease = support::store::claim(&db.store, session.id, 1)
            .await
            .remove(0);
        let lease = json!({
            "session": session.id.0, "process": P, "key": "a",
            "token": lease.token.0, "attempt": 1,
        });
        refused(&api, "w1", session.id.0, &lease).await;
    })
    .await;
}

#[tokio::test]
async fn an_open_server_checks_no_owner() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        let session = library_session(&db).await;
        let reply = api
            .send(
                POST,
                &format!("/v1/sessions/{}/heartbeat", session.id.0),
                None,
                None,
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    })
    .await;
}

#[tokio::test]
async fn a_viewer_sees_no_fencing_tokens() {
    each_engine(|db| async move {
        let mut api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        api.token = Some("w1".into());
        api.enqueue(P, &["a", "b"]).await;
        let session = api.session(30_000).await;
        let leases = api.claim(session, P, 2).await;
        let done = json!({ "lease": leases[1], "outcome": { "type": "done" } });
        api.post("/v1/leases/complete", done, StatusCode::NO_CONTENT)
            .await;
        let token = leases[0]["token"].as_i64().expect("a token");
        let finished = leases[1]["token"].as_i64().expect("a token");
        let key = leases[0]["key"].as_str().expect("a key").to_owned();
        let done_key = leases[1]["key"].as_str().expect("a key").to_owned();
        let reads = [
            "/v1/sessions".to_owned(),
            format!("/v1/processes/{P}/items/{key}"),
            format!("/v1/processes/{P}/items/{done_key}"),
            format!("/v1/processes/{P}/runs"),
            // The item list and triage showed a running key's token to
            // viewers until session 40 (found in review).
            format!("/v1/processes/{P}/items?state=running"),
            format!("/v1/processes/{P}/triage?state=running"),
            "/ui/workers".to_owned(),
            format!("/ui/processes/{P}/items/{key}"),
            format!("/ui/processes/{P}/items/{done_key}"),
        ];
        let shows = |text: &str, t: i64| {
            text.contains(&format!("\"token\":{t}"))
                || text.contains(&format!("\"lease_token\":{t}"))
                || text.contains(&format!("token\">{t}<"))
        };
        let mut seen_by_worker = 0;
        for uri in &reads {
            let viewer = api.send(GET, uri, None, Some("v")).await;
            assert_eq!(viewer.status, StatusCode::OK, "{uri}: {}", viewer.text);
            for t in [token, finished] {
                assert!(
                    !shows(&viewer.text, t),
                    "{uri} shows token {t} to a viewer: {}",
                    viewer.text
                );
            }
            let worker = api.send(GET, uri, None, Some("w1")).await;
            if shows(&worker.text, token) || shows(&worker.text, finished) {
                seen_by_worker += 1;
            }
        }
        assert_eq!(
            seen_by_worker,
            reads.len(),
            "a worker sees the tokens on every read"
        );
    })
    .await;
}

/// Rounds of [`an_act_on_a_session_not_started_yet_reaches_nothing_once_it_starts`].
const ROUNDS: usize = 40;

/// A token acting on a session id no session has yet (ids are sequential,
/// so the next one is easy to guess) is answered as for an expired session
/// and reaches nothing: the session another token then starts under that id
/// is untouched. Passed on by the owner check, such an act raced the start
/// it named, and on SQLite closed the new session, or claimed under it, in
/// nearly every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_act_on_a_session_not_started_yet_reaches_nothing_once_it_starts() {
    each_engine(|db| async move {
        let mut api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        api.token = Some("w1".into());
        let keys: Vec<String> = (0..ROUNDS * 50).map(|k| format!("k{k}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        api.enqueue(P, &keys).await;
        let api = std::sync::Arc::new(api);
        let mut last = api.session(600_000).await;
        for round in 0..ROUNDS {
            let next = last + 1;
            let attacker = {
                let api = std::sync::Arc::clone(&api);
                tokio::spawn(async move {
                    let claim = json!({ "process": P, "max": 1 }).to_string();
                    let mut reached = Vec::new();
                    for _ in 0..20 {
                        let closed = api
                            .send(DELETE, &format!("/v1/sessions/{next}"), None, Some("w2"))
                            .await;
                        if closed.status == StatusCode::OK && closed.json()["released"] != 0 {
                            reached.push(closed.text);
                        }
                        let claimed = api
                            .send(
                                POST,
                                &format!("/v1/sessions/{next}/claim"),
                                Some(claim.clone()),
                                Some("w2"),
                            )
                            .await;
                        if claimed.status == StatusCode::OK {
                            reached.push(claimed.text);
                        }
                        tokio::task::yield_now().await;
                    }
                    reached
                })
            };
            let victim = api.session(600_000).await;
            let reached = attacker.await.expect("the attacker's task");
            assert!(reached.is_empty(), "round {round}: {reached:?}");
            let beat = api
                .call(POST, &format!("/v1/sessions/{victim}/heartbeat"), None)
                .await;
            assert_eq!(
                beat.status,
                StatusCode::OK,
                "round {round}: session {victim} was closed by another token: {}",
                beat.text
            );
            last = victim;
        }
        let running = api.counts(P).await.expect("counts")["running"].clone();
        assert_eq!(running, 0, "no key was leased under another's session");
    })
    .await;
}

/// A completion batch naming a session the database does not know answers
/// that lease as expired, without reaching the store, and writes the rest.
#[tokio::test]
async fn a_batch_lease_of_an_unknown_session_is_expired_and_the_rest_is_written() {
    each_engine(|db| async move {
        let (api, session, lease) = w1_holding_a(&db.store).await;
        let mut stranger = lease.clone();
        stranger["session"] = json!(session + 1000);
        let done = |lease: &Value| json!({ "lease": lease, "outcome": { "type": "done" } });
        let reply = api
            .post(
                "/v1/leases/complete-batch",
                json!({ "completions": [done(&stranger), done(&lease)] }),
                StatusCode::OK,
            )
            .await;
        let errors: Vec<&Value> = reply["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| &r["error"])
            .collect();
        assert_eq!(errors, [&json!("session_expired"), &Value::Null], "{reply}");
        let item = api.get_ok(&format!("/v1/processes/{P}/items/a")).await;
        assert_eq!(item["item"]["state"], "idle", "{item}");
    })
    .await;
}

/// The SQL statements sqlx runs on this thread while it lives (its
/// `sqlx::query` events), for a test that counts a request's reads.
struct Statements {
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _default: tracing::subscriber::DefaultGuard,
}

impl Statements {
    /// Starts listening on this thread (a current-thread runtime's tasks
    /// all run on it).
    fn listen() -> Self {
        let seen = std::sync::Arc::default();
        let recorder = Recorder {
            seen: std::sync::Arc::clone(&seen),
        };
        Self {
            seen,
            _default: tracing::subscriber::set_default(recorder),
        }
    }

    /// How many statements seen so far contain `text`.
    fn containing(&self, text: &str) -> usize {
        let seen = self.seen.lock().expect("statements");
        seen.iter().filter(|s| s.contains(text)).count()
    }
}

/// A subscriber that keeps every `sqlx::query` event's fields as text.
struct Recorder {
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        self.seen.lock().expect("statements").push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A completion batch may name up to 4,096 sessions this server has never
/// seen (made up, or started through another server): their owners are read
/// in one query, so one request cannot make the server read the database
/// thousands of times. The made-up ones are answered as expired, the
/// caller's own lease commits.
#[tokio::test]
async fn a_batch_naming_thousands_of_unseen_sessions_reads_their_owners_once() {
    each_engine(|db| async move {
        let (api, session, lease) = w1_holding_a(&db.store).await;
        let mut completions = vec![json!({ "lease": lease, "outcome": { "type": "done" } })];
        for made_up in 1..4096 {
            let mut other = lease.clone();
            other["session"] = json!(session + 1_000_000 + made_up);
            completions.push(json!({ "lease": other, "outcome": { "type": "done" } }));
        }
        let statements = Statements::listen();
        let reply = api
            .send(
                POST,
                "/v1/leases/complete-batch",
                Some(json!({ "completions": completions }).to_string()),
                Some("w1"),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let results = reply.json()["results"].as_array().expect("results").clone();
        assert_eq!(results.len(), 4096);
        assert!(results[0]["error"].is_null(), "{}", results[0]);
        assert!(
            results[1..].iter().all(|r| r["error"] == "session_expired"),
            "{}",
            results[1]
        );
        // sqlx reports SQLite's statements from its own worker thread, where
        // this listener does not hear them: the count is PostgreSQL's.
        if db.engine == "postgres" {
            assert_eq!(
                statements.containing("FROM drover_sessions WHERE id"),
                1,
                "the unseen sessions' owners are read in one statement"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_token_holding_its_limit_of_live_sessions_starts_no_more_until_one_ends() {
    each_engine(|db| async move {
        let options = ServerOptions::default()
            .tokens(tokens())
            .max_sessions_per_token(3);
        let mut api = Api::with(&db.store, options);
        api.token = Some("w1".into());
        let start = json!({ "component": "script", "ttl_ms": 60_000 }).to_string();
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(api.session(60_000).await);
        }
        let over = api
            .send(POST, "/v1/sessions", Some(start.clone()), Some("w1"))
            .await;
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.text);
        assert_eq!(over.json()["error"], "too_many_sessions", "{}", over.text);
        // Another token's sessions are its own.
        let other = api
            .send(POST, "/v1/sessions", Some(start.clone()), Some("w2"))
            .await;
        assert_eq!(other.status, StatusCode::CREATED, "{}", other.text);
        // A closed session makes room.
        let closed = api
            .send(
                DELETE,
                &format!("/v1/sessions/{}", held[0]),
                None,
                Some("w1"),
            )
            .await;
        assert_eq!(closed.status, StatusCode::OK, "{}", closed.text);
        let again = api
            .send(POST, "/v1/sessions", Some(start.clone()), Some("w1"))
            .await;
        assert_eq!(again.status, StatusCode::CREATED, "{}", again.text);
        // So does an expired one, even before it is reclaimed.
        db.store
            .clock()
            .advance(std::time::Duration::from_secs(120));
        for _ in 0..3 {
            let fresh = api
                .send(POST, "/v1/sessions", Some(start.clone()), Some("w1"))
                .await;
            assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.text);
        }
        let over = api
            .send(POST, "/v1/sessions", Some(start), Some("w1"))
            .await;
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.text);
    })
    .await;
}
