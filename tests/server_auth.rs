//! The auth matrix: every role (none, unknown, viewer, worker, admin) against
//! every route, on every engine; a refused request changes nothing. And the CLI
//! refusing an open server on a non-loopback address.

mod server_support;
mod support;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use drover::server::{Role, ServerOptions, Tokens};
use serde_json::json;
use server_support::{Api, DELETE, GET, POST};
use support::each_engine;

const P: &str = "provision";

/// Every route with a body that would succeed, and the least role it needs
/// (`None` = open to all).
fn routes() -> Vec<(Method, String, Option<String>, Option<Role>)> {
    let item = format!("/v1/processes/{P}/items/a");
    let lease = json!({ "session": 1, "process": P, "key": "a", "token": 1, "attempt": 1 });
    let body = |v: serde_json::Value| Some(v.to_string());
    vec![
        (GET, "/healthz".into(), None, None),
        (GET, "/readyz".into(), None, None),
        (GET, "/openapi.json".into(), None, None),
        (GET, "/metrics".into(), None, Some(Role::Viewer)),
        (GET, "/v1/processes".into(), None, Some(Role::Viewer)),
        (
            GET,
            format!("/v1/processes/{P}/items"),
            None,
            Some(Role::Viewer),
        ),
        (GET, item.clone(), None, Some(Role::Viewer)),
        (GET, "/".into(), None, Some(Role::Viewer)),
        (GET, "/ui/workers".into(), None, Some(Role::Viewer)),
        (
            GET,
            format!("/v1/processes/{P}/series"),
            None,
            Some(Role::Viewer),
        ),
        (GET, "/v1/sessions".into(), None, Some(Role::Viewer)),
        (
            GET,
            format!("/v1/processes/{P}/triage"),
            None,
            Some(Role::Viewer),
        ),
        (GET, format!("/ui/processes/{P}"), None, Some(Role::Viewer)),
        (
            GET,
            format!("/ui/processes/{P}/items/a"),
            None,
            Some(Role::Viewer),
        ),
        (
            POST,
            format!("/v1/processes/{P}/items"),
            body(json!({ "keys": ["b"] })),
            Some(Role::Worker),
        ),
        (
            POST,
            "/v1/sessions".into(),
            body(json!({ "component": "t", "ttl_ms": 1000 })),
            Some(Role::Worker),
        ),
        (
            POST,
            "/v1/sessions/1/heartbeat".into(),
            None,
            Some(Role::Worker),
        ),
        (
            POST,
            "/v1/sessions/1/claim".into(),
            body(json!({ "process": P })),
            Some(Role::Worker),
        ),
        (
            POST,
            "/v1/leases/complete".into(),
            body(json!({ "lease": lease, "outcome": { "type": "done" } })),
            Some(Role::Worker),
        ),
        (
            POST,
            "/v1/leases/release".into(),
            body(json!({ "lease": lease })),
            Some(Role::Worker),
        ),
        (DELETE, "/v1/sessions/1".into(), None, Some(Role::Worker)),
        (POST, format!("{item}/park"), None, Some(Role::Admin)),
        (POST, format!("{item}/retry"), None, Some(Role::Admin)),
        (
            POST,
            format!("/ui/processes/{P}/items/a/park"),
            None,
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/ui/processes/{P}/items/a/retry"),
            None,
            Some(Role::Admin),
        ),
        (DELETE, item, None, Some(Role::Admin)),
        (
            GET,
            format!("/v1/processes/{P}/error-groups"),
            None,
            Some(Role::Viewer),
        ),
        (
            POST,
            format!("/v1/processes/{P}/items:retry"),
            body(json!({ "key_prefix": "a" })),
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/v1/processes/{P}/items:park"),
            body(json!({ "key_prefix": "a" })),
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/v1/processes/{P}/items:delete"),
            body(json!({ "key_prefix": "a" })),
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/ui/processes/{P}/errors/retry"),
            Some("signature=x".to_owned()),
            Some(Role::Admin),
        ),
        (
            GET,
            format!("/v1/processes/{P}/settings"),
            None,
            Some(Role::Viewer),
        ),
        (
            Method::PATCH,
            format!("/v1/processes/{P}/settings"),
            body(json!({ "concurrency": 3 })),
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/v1/processes/{P}/pause"),
            None,
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/v1/processes/{P}/resume"),
            None,
            Some(Role::Admin),
        ),
        (
            POST,
            format!("/ui/processes/{P}/pause"),
            None,
            Some(Role::Admin),
        ),
    ]
}

fn tokens() -> Tokens {
    Tokens::parse("viewer:v-token\nworker:w-token\nadmin:a-token").expect("tokens")
}

#[tokio::test]
async fn every_role_reaches_exactly_the_routes_of_its_class() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        let callers = [
            (None, None),
            (Some("wrong"), None),
            (Some("v-token"), Some(Role::Viewer)),
            (Some("w-token"), Some(Role::Worker)),
            (Some("a-token"), Some(Role::Admin)),
        ];
        for (method, uri, body, needs) in routes() {
            for (token, role) in callers {
                // A fresh item each time, so admin actions have something to act on.
                api.send(
                    POST,
                    &format!("/v1/processes/{P}/items"),
                    Some(json!({ "keys": ["a"] }).to_string()),
                    Some("a-token"),
                )
                .await;
                let reply = api.send(method.clone(), &uri, body.clone(), token).await;
                // Session 1 is the worker token's (it started it first):
                // the admin token may not act on it (tests/server_owner.rs).
                let on_session_1 = uri.starts_with("/v1/sessions/1/")
                    || uri == "/v1/sessions/1"
                    || uri == "/v1/leases/complete"
                    || uri == "/v1/leases/release";
                let not_yours = token == Some("a-token") && on_session_1;
                let expected = match (needs, role) {
                    (None, _) => None,
                    (Some(_), None) => Some(StatusCode::UNAUTHORIZED),
                    (Some(needs), Some(role)) if role < needs => Some(StatusCode::FORBIDDEN),
                    _ if not_yours => Some(StatusCode::FORBIDDEN),
                    _ => None,
                };
                let what = format!(
                    "{method} {uri} as {token:?}: {} {}",
                    reply.status, reply.text
                );
                if not_yours {
                    assert_eq!(reply.json()["error"], "not_your_session", "{what}");
                }
                match expected {
                    Some(status) => assert_eq!(reply.status, status, "{what}"),
                    None => assert!(
                        reply.status != StatusCode::UNAUTHORIZED
                            && reply.status != StatusCode::FORBIDDEN
                            && !reply.status.is_server_error(),
                        "{what}"
                    ),
                }
            }
        }
    })
    .await;
}

#[tokio::test]
async fn refused_requests_change_nothing() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        let enqueue = Some(json!({ "keys": ["x"] }).to_string());
        let uri = format!("/v1/processes/{P}/items");
        assert_eq!(
            api.send(POST, &uri, enqueue.clone(), Some("v-token"))
                .await
                .status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            api.send(POST, &uri, enqueue, None).await.status,
            StatusCode::UNAUTHORIZED
        );
        let list = api.send(GET, "/v1/processes", None, Some("v-token")).await;
        assert_eq!(
            list.json()["processes"],
            json!([]),
            "no process was created"
        );
        api.send(
            POST,
            &uri,
            Some(json!({ "keys": ["x"] }).to_string()),
            Some("w-token"),
        )
        .await;
        let park = format!("/v1/processes/{P}/items/x/park");
        assert_eq!(
            api.send(POST, &park, None, Some("w-token")).await.status,
            StatusCode::FORBIDDEN
        );
        let item = api
            .send(
                GET,
                &format!("/v1/processes/{P}/items/x"),
                None,
                Some("v-token"),
            )
            .await;
        assert_eq!(item.json()["item"]["state"], "pending");
    })
    .await;
}

#[tokio::test]
async fn errors_401_and_403_are_json_and_401_challenges_for_a_token() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        let missing = api.send(GET, "/v1/processes", None, None).await;
        assert_eq!(missing.json()["error"], "unauthorized");
        let challenges: Vec<_> = missing.headers.get_all("www-authenticate").iter().collect();
        assert!(
            challenges
                .iter()
                .any(|c| c.to_str().is_ok_and(|c| c.starts_with("Bearer")))
        );
        let forbidden = api
            .send(POST, "/v1/sessions", Some("{}".into()), Some("v-token"))
            .await;
        assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
        assert_eq!(forbidden.json()["error"], "forbidden");
        let page = api.send(GET, "/", None, None).await;
        assert_eq!(page.status, StatusCode::UNAUTHORIZED);
        let basic = page
            .headers
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok());
        assert_eq!(
            basic,
            Some(r#"Basic realm="drover""#),
            "browsers prompt for the token"
        );
        // The document this server serves (without a token) says what it checks.
        let document = api.send(GET, "/openapi.json", None, None).await.json();
        let claim = &document["paths"]["/v1/sessions/{session}/claim"]["post"];
        assert_eq!(
            claim["security"],
            serde_json::json!([{ "bearer": [] }]),
            "{claim}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_browser_sends_the_token_as_the_basic_auth_password() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        let credentials = base64::engine::general_purpose::STANDARD.encode("anyone:v-token");
        let request = axum::http::Request::get("/")
            .header("authorization", format!("Basic {credentials}"))
            .body(axum::body::Body::empty())
            .expect("request");
        let page = api.request(request).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    })
    .await;
}

#[test]
fn serve_refuses_an_open_non_loopback_address_unless_insecure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--listen", "0.0.0.0:0", "--db", &db])
        .env_remove("DROVER_TOKENS")
        .output()
        .expect("run drover");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without tokens"), "{stderr}");
    assert!(
        !dir.path().join("d.db").exists(),
        "refused before touching the database"
    );
}

/// A refused caller is answered before its body is read: every route that
/// takes a body, the dashboard's forms included, answers 401 to a request
/// without a token whose body never comes. A dashboard form read its body
/// first (up to the body limit), so such a caller held a connection and a
/// task for as long as it liked.
#[tokio::test]
async fn a_refused_caller_is_answered_before_its_body_is_read() {
    each_engine(|db| async move {
        let api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
        for (method, uri, body, least) in routes() {
            if body.is_none() || least.is_none() {
                continue;
            }
            let never =
                futures_util::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
            let request = axum::http::Request::builder()
                .method(method.clone())
                .uri(&uri)
                .header("content-type", "application/json")
                .header("content-length", "1000000")
                .body(axum::body::Body::from_stream(never))
                .expect("a request");
            let reply = tokio::time::timeout(Duration::from_secs(5), api.request(request))
                .await
                .unwrap_or_else(|_| panic!("{method} {uri} waited for a body it would refuse"));
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
        }
    })
    .await;
}
