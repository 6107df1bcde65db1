//! DNS rebinding and framing: an open server (no tokens) answers only requests
//! addressed to an IP address, a localhost name or a name it was given, so a
//! page that rebinds its own name to 127.0.0.1 can neither read nor act; a
//! server with tokens answers any name; no other site may frame a page of
//! drover's.

mod server_support;
mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use drover::server::{ServerOptions, Tokens};
use drover::store::StoreEngine as _;
use serde_json::json;
use server_support::{Api, Reply};
use support::each_engine;

const REBOUND: &str = "rebind.attacker.example:7432";
const P: &str = "victim";

/// A request as the rebinding page's browser sends it: every header agrees
/// that it is same-origin, because for the browser it is.
fn rebound(method: Method, uri: &str, host: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, host)
        .header(header::ORIGIN, format!("http://{host}"))
        .header("sec-fetch-site", "same-origin")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(body.to_owned()))
        .expect("request")
}

fn assert_host_refused(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        StatusCode::FORBIDDEN,
        "{what}: {}",
        reply.text
    );
    let body = reply.json();
    assert_eq!(body["error"], "host_not_allowed", "{what}: {body}");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("rebind.attacker.example") && message.contains("--allowed-host"),
        "{what}: {message}"
    );
}

#[tokio::test]
async fn an_open_server_refuses_a_rebound_name_on_reads_and_writes_and_changes_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "b"]).await;
        let delete = r#"{"key_prefix":""}"#;
        let uri = format!("/v1/processes/{P}/items:delete");
        let reply = api
            .request(rebound(Method::POST, &uri, REBOUND, delete))
            .await;
        assert_host_refused(&reply, "bulk delete");
        for read in ["/v1/processes", "/", "/metrics", "/v1/sessions"] {
            let reply = api.request(rebound(Method::GET, read, REBOUND, "")).await;
            assert_host_refused(&reply, read);
        }
        let counts = db.store.process_counts_all().await.expect("counts");
        let victim = counts.iter().find(|c| c.process == P).expect("the process");
        assert_eq!(victim.pending, 2, "nothing was deleted");
    })
    .await;
}

#[tokio::test]
async fn an_open_server_answers_addresses_localhost_names_and_the_names_it_was_given() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        for host in [
            "127.0.0.1:7420",
            "[::1]:7420",
            "localhost:7420",
            "ui.localhost",
            "10.0.0.7",
        ] {
            let reply = api
                .request(rebound(Method::GET, "/v1/processes", host, ""))
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{host}: {}", reply.text);
        }
        let given = ServerOptions::default().allowed_hosts(["Rebind.Attacker.Example".to_owned()]);
        let api = Api::with(&db.store, given);
        let reply = api
            .request(rebound(Method::GET, "/v1/processes", REBOUND, ""))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let other = "other.example:7432";
        let reply = api
            .request(rebound(Method::GET, "/v1/processes", other, ""))
            .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text);
    })
    .await;
}

#[tokio::test]
async fn a_server_with_tokens_answers_any_name_and_asks_for_a_token() {
    each_engine(|db| async move {
        let tokens = Tokens::parse("viewer:v-token").expect("tokens");
        let api = Api::with(&db.store, ServerOptions::default().tokens(tokens));
        let reply = api
            .request(rebound(Method::GET, "/v1/processes", REBOUND, ""))
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.text);
        let mut request = rebound(Method::GET, "/v1/processes", REBOUND, "");
        let bearer = "Bearer v-token".parse().expect("header");
        request.headers_mut().insert(header::AUTHORIZATION, bearer);
        assert_eq!(api.request(request).await.status, StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn no_other_site_may_frame_a_page_or_answer() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        for uri in [
            "/",
            "/ui/workers",
            "/ui/processes/victim",
            "/v1/processes",
            "/nowhere",
        ] {
            let reply = api.call(Method::GET, uri, None).await;
            let frame = reply.headers.get(header::X_FRAME_OPTIONS);
            assert_eq!(
                frame.map(|v| v.as_bytes()),
                Some(&b"SAMEORIGIN"[..]),
                "{uri}"
            );
            let policy = reply.headers.get(header::CONTENT_SECURITY_POLICY);
            assert_eq!(
                policy.map(|v| v.as_bytes()),
                Some(&b"frame-ancestors 'self'"[..]),
                "{uri}"
            );
        }
    })
    .await;
}

/// Over a real socket, the name the client put in `Host` is what the server
/// judges: the address it dialled passes, a rebound name on the same socket
/// does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_socket_a_rebound_name_is_refused() {
    let (db, _dir) = support::sqlite().await;
    let socket = server_support::Socket::serve(&db.store).await;
    let addr = socket.addr;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/v1/processes");
    let own = client.get(&url).send().await.expect("sent");
    assert_eq!(own.status(), StatusCode::OK);
    let rebound = client
        .get(&url)
        .header("host", REBOUND)
        .send()
        .await
        .expect("sent");
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = rebound.json().await.expect("JSON");
    assert_eq!(body["error"], json!("host_not_allowed"));
    socket.stop().await;
}
