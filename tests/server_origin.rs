//! Cross-origin protection through the real router, on every engine: a
//! browser's state-changing request for another site's page is refused with
//! 403 `cross_origin` and changes nothing, even with an admin's Basic
//! credentials; same-origin requests, reads and programs that send no browser
//! headers pass.

mod server_support;
mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use base64::Engine as _;
use drover::server::{ServerOptions, Tokens};
use drover::store::StoreEngine as _;
use serde_json::{Value, json};
use server_support::{Api, GET, POST, Reply};
use support::each_engine;

const P: &str = "x";
const HOST: &str = "drover.internal:7420";
const ENQUEUE: &str = "/v1/processes/x/items";

/// What another site's `<form enctype="text/plain">` posts with one field named
/// `{"keys":["evil","` and valued `"]}`: valid JSON, so the API would take it.
const FORM_BODY: &str = r#"{"keys":["evil","="]}"#;

fn tokens() -> Tokens {
    Tokens::parse("viewer:v-token\nadmin:a-token").expect("tokens")
}

/// What the browser keeps after the dashboard's login prompt.
fn basic(token: &str) -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("me:{token}"));
    format!("Basic {pair}")
}

/// A request as a browser sends it: the admin's Basic credentials, `Host`, a
/// `text/plain` body and the given browser `headers`.
fn browser(method: Method, uri: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, HOST)
        .header(header::AUTHORIZATION, basic("a-token"))
        .header(header::CONTENT_TYPE, "text/plain");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::from(body.to_owned())).expect("request")
}

fn assert_refused(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        StatusCode::FORBIDDEN,
        "{what}: {}",
        reply.text
    );
    let body = reply.json();
    assert_eq!(body["error"], "cross_origin", "{what}: {body}");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.starts_with("cross-origin request refused: ")
            && message.ends_with("send it from the dashboard's own origin or without a browser"),
        "{what}: {message}"
    );
}

/// The API with tokens, reading as an admin by bearer token.
fn admin_api(db: &support::TestDb) -> Api {
    let mut api = Api::with(&db.store, ServerOptions::default().tokens(tokens()));
    api.token = Some("a-token".into());
    api
}

async fn item_status(api: &Api, key: &str) -> StatusCode {
    let uri = format!("/v1/processes/{P}/items/{key}");
    api.call(GET, &uri, None).await.status
}

#[tokio::test]
async fn a_cross_site_form_post_with_an_admins_basic_credentials_enqueues_nothing() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        for site in ["cross-site", "same-site"] {
            let headers = [("sec-fetch-site", site), ("origin", "http://evil.example")];
            let reply = api
                .request(browser(POST, ENQUEUE, &headers, FORM_BODY))
                .await;
            assert_refused(&reply, site);
            assert!(
                reply.json()["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(site))
            );
        }
        assert_eq!(item_status(&api, "evil").await, StatusCode::NOT_FOUND);
        assert_eq!(api.counts(P).await, None, "no process was created");
    })
    .await;
}

#[tokio::test]
async fn an_origin_that_is_not_the_host_is_refused() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        for origin in [
            "http://evil.example",
            "http://drover.internal:8080",
            "http://drover.internal",
            "null",
        ] {
            let headers = [("origin", origin)];
            let reply = api
                .request(browser(POST, ENQUEUE, &headers, FORM_BODY))
                .await;
            assert_refused(&reply, origin);
            let message = reply.json()["message"]
                .as_str()
                .expect("message")
                .to_owned();
            assert!(
                message.contains(origin) && message.contains(HOST),
                "{message}"
            );
        }
        assert_eq!(item_status(&api, "evil").await, StatusCode::NOT_FOUND);
    })
    .await;
}

#[tokio::test]
async fn the_same_post_from_the_servers_own_origin_is_accepted() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        let own = format!("http://{HOST}");
        let browsers: [&[(&str, &str)]; 3] = [
            &[("origin", &own)],
            &[("sec-fetch-site", "same-origin"), ("origin", &own)],
            &[("sec-fetch-site", "none")],
        ];
        for headers in browsers {
            let reply = api
                .request(browser(POST, ENQUEUE, headers, FORM_BODY))
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{headers:?}: {}", reply.text);
        }
        assert_eq!(item_status(&api, "evil").await, StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn a_post_without_browser_headers_is_accepted_as_from_curl() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        let reply = api
            .send(POST, ENQUEUE, Some(FORM_BODY.into()), Some("a-token"))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let with_host = browser(POST, ENQUEUE, &[], r#"{"keys":["b"]}"#);
        assert_eq!(api.request(with_host).await.status, StatusCode::OK);
        assert_eq!(api.counts(P).await.expect("listed")["pending"], 3);
    })
    .await;
}

#[tokio::test]
async fn reads_pass_whatever_the_browser_says() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        api.enqueue(P, &["a"]).await;
        let headers = [("sec-fetch-site", "cross-site"), ("origin", "null")];
        for uri in [
            "/v1/processes",
            "/v1/processes/x/items",
            "/v1/processes/x/items/a",
            "/",
            "/ui/processes/x/items/a",
        ] {
            let reply = api.request(browser(GET, uri, &headers, "")).await;
            assert_eq!(reply.status, StatusCode::OK, "GET {uri}: {}", reply.text);
        }
    })
    .await;
}

#[tokio::test]
async fn the_refusal_comes_before_authentication_and_the_body() {
    each_engine(|db| async move {
        let api = Api::with(
            &db.store,
            ServerOptions::default().tokens(tokens()).body_limit(1024),
        );
        let cross = || {
            Request::post(ENQUEUE)
                .header("sec-fetch-site", "cross-site")
                .header(header::CONTENT_TYPE, "text/plain")
        };
        let no_token = cross().body(Body::from(FORM_BODY)).expect("request");
        assert_refused(&api.request(no_token).await, "no token");
        let viewer = cross()
            .header(header::AUTHORIZATION, basic("v-token"))
            .body(Body::from(FORM_BODY))
            .expect("request");
        assert_refused(&api.request(viewer).await, "a viewer's token");
        let too_big = cross()
            .header(header::AUTHORIZATION, basic("a-token"))
            .body(Body::from("x".repeat(4096)))
            .expect("request");
        assert_refused(&api.request(too_big).await, "a body over the limit");
        let malformed = cross()
            .header(header::AUTHORIZATION, basic("a-token"))
            .body(Body::from("{"))
            .expect("request");
        assert_refused(&api.request(malformed).await, "malformed JSON");
    })
    .await;
}

/// Each operation of the OpenAPI document whose method changes state, with its
/// path parameters filled in.
fn state_changing_operations() -> Vec<(Method, String)> {
    let document = serde_json::to_value(drover::server::document()).expect("document as JSON");
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        let uri = path
            .replace("{process}", P)
            .replace("{key}", "a")
            .replace("{id}", "1");
        for method in item.as_object().expect("path item").keys() {
            let method: Method = method.to_uppercase().parse().expect("a method");
            if !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS) {
                operations.push((method, uri.clone()));
            }
        }
    }
    operations
}

#[tokio::test]
async fn every_state_changing_route_refuses_a_cross_site_request() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        api.enqueue(P, &["a"]).await;
        let mut routes = state_changing_operations();
        assert!(routes.len() >= 10, "the document lists the API: {routes:?}");
        for action in ["retry", "park"] {
            routes.push((POST, format!("/ui/processes/{P}/items/a/{action}")));
        }
        for action in ["pause", "resume"] {
            routes.push((POST, format!("/ui/processes/{P}/{action}")));
        }
        for (method, uri) in routes {
            let headers = [("sec-fetch-site", "cross-site")];
            let reply = api
                .request(browser(method.clone(), &uri, &headers, "{}"))
                .await;
            assert_refused(&reply, &format!("{method} {uri}"));
        }
        let item = api.get_ok(&format!("/v1/processes/{P}/items/a")).await;
        assert_eq!(item["item"]["state"], "pending", "nothing changed: {item}");
        let settings = api.get_ok(&format!("/v1/processes/{P}/settings")).await;
        assert_eq!(settings["paused"], false, "not paused: {settings}");
        assert_eq!(
            settings["concurrency"],
            Value::Null,
            "no limit set: {settings}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_dashboards_buttons_refuse_another_sites_post_and_take_their_own() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        api.enqueue(P, &["a"]).await;
        let park = format!("/ui/processes/{P}/items/a/park");
        let foreign = [("origin", "http://evil.example")];
        assert_refused(
            &api.request(browser(POST, &park, &foreign, "")).await,
            "park",
        );
        assert_eq!(api.counts(P).await.expect("listed")["parked"], 0);
        let own = format!("http://{HOST}");
        let headers = [("sec-fetch-site", "same-origin"), ("origin", own.as_str())];
        let reply = api.request(browser(POST, &park, &headers, "")).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text);
        assert_eq!(api.counts(P).await.expect("listed")["parked"], 1);
        let retry = format!("/ui/processes/{P}/items/a/retry");
        let cross = [("sec-fetch-site", "cross-site")];
        assert_refused(
            &api.request(browser(POST, &retry, &cross, "")).await,
            "retry",
        );
        assert_eq!(api.counts(P).await.expect("listed")["parked"], 1);
    })
    .await;
}

#[tokio::test]
async fn refusals_are_counted_in_the_request_metrics() {
    each_engine(|db| async move {
        let api = admin_api(&db);
        let headers = [("sec-fetch-site", "cross-site")];
        for _ in 0..2 {
            let reply = api.request(browser(POST, ENQUEUE, &headers, FORM_BODY)).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN);
        }
        let metrics = api.call(GET, "/metrics", None).await.text;
        let line = r#"drover_http_requests_total{method="POST",route="/v1/processes/{process}/items",status="403"} 2"#;
        assert!(metrics.contains(line), "{metrics}");
    })
    .await;
}

/// Over a real socket, so `Host` is what the HTTP stack delivers: an `Origin`
/// naming the address the client dialled passes, another host on it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_socket_the_origin_is_compared_with_the_host_the_client_sent() {
    let (db, _dir) = support::sqlite().await;
    let socket = server_support::Socket::serve(&db.store).await;
    let addr = socket.addr;
    let client = reqwest::Client::new();
    let post = |origin: String, key: &str| {
        client
            .post(format!("http://{addr}{ENQUEUE}"))
            .header("origin", origin)
            .header("content-type", "text/plain")
            .body(format!(r#"{{"keys":["{key}"]}}"#))
            .send()
    };
    let own = post(format!("http://{addr}"), "own").await.expect("sent");
    assert_eq!(own.status(), StatusCode::OK);
    let other = format!("http://localhost:{}", addr.port());
    let refused = post(other, "other").await.expect("sent");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"], json!("cross_origin"));
    socket.stop().await;
    let items = db
        .store
        .item_list(drover::store::ItemList {
            process: P.into(),
            state: None,
            after_key: None,
            limit: 10,
        })
        .await
        .expect("list");
    let keys: Vec<_> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["own"]);
}
