//! Waiting claims (long-polls) share one wake-up per process per server and
//! are capped (DESIGN.md rule 13): hundreds of idle long-polls cost about one
//! claim per poll interval, an enqueue of one key wakes one of them, and a
//! claim over the server's or its session's cap is answered 429 at once. On
//! every engine.

mod server_support;
mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use drover::server::{Role, ServerOptions, Tokens};
use serde_json::json;
use server_support::{Api, POST, waiting_claim};
use support::each_engine;

const P: &str = "idle";

/// The server's `drover_claim_attempts_total`.
async fn attempts(api: &Api) -> u64 {
    let metrics = api.call(Method::GET, "/metrics", None).await;
    metrics
        .text
        .lines()
        .find_map(|l| l.strip_prefix("drover_claim_attempts_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the server reports drover_claim_attempts_total")
}

/// 200 claims wait on an empty process for one second with a 50 ms poll
/// interval: each polling on its own they would send about 4,000 claims; in
/// one line they send one per poll interval. The second is time passing, not
/// a synchronisation: nothing is waited for but the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_long_polls_cost_one_claim_per_poll_interval_and_one_key_wakes_one_claim() {
    each_engine(|db| async move {
        let options = ServerOptions::default().poll_interval(Duration::from_millis(50));
        let api = Arc::new(Api::with(&db.store, options));
        let mut claims = Vec::new();
        for _ in 0..20 {
            let session = api.session(60_000).await;
            for _ in 0..10 {
                claims.push(waiting_claim(&api, 20_000, session, P, 1));
            }
        }
        api.until_claims_waiting(200).await;
        let before = attempts(&api).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let polled = attempts(&api).await - before;
        eprintln!(
            "{}: 200 waiting claims sent {polled} claims in 1 s",
            db.engine
        );
        assert!(
            (1..=45).contains(&polled),
            "one claim per 50 ms interval, about 20 in a second; got {polled}"
        );

        let before = attempts(&api).await;
        api.enqueue(P, &["k"]).await;
        let mut done = Vec::new();
        while done.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let finished: Vec<usize> = (0..claims.len())
                .filter(|&i| claims[i].is_finished())
                .collect();
            done = finished;
        }
        let (status, body) = claims.remove(done[0]).await.expect("joined");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["leases"].as_array().expect("leases").len(),
            1,
            "{body}"
        );
        api.until_claims_waiting(199).await;
        assert!(
            claims.iter().all(|c| !c.is_finished()),
            "one key wakes one claim"
        );
        let woken = attempts(&api).await - before;
        assert!(woken < 40, "an enqueue of one key cost {woken} claims");
        for claim in claims {
            claim.abort();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_over_the_servers_or_a_sessions_cap_are_refused_at_once_and_ready_work_never_is() {
    each_engine(|db| async move {
        let options = ServerOptions::default().max_waiting_claims(20);
        let api = Arc::new(Api::with(&db.store, options));
        let one = api.session(60_000).await;
        let mut claims: Vec<_> = (0..16)
            .map(|_| waiting_claim(&api, 20_000, one, P, 1))
            .collect();
        api.until_claims_waiting(16).await;
        let (status, body) = waiting_claim(&api, 20_000, one, P, 1)
            .await
            .expect("joined");
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"], "too_many_waiting_claims", "{body}");
        let two = api.session(60_000).await;
        claims.extend((0..4).map(|_| waiting_claim(&api, 20_000, two, P, 1)));
        api.until_claims_waiting(20).await;
        let three = api.session(60_000).await;
        let (status, body) = waiting_claim(&api, 20_000, three, P, 1)
            .await
            .expect("joined");
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("20 waiting claims")),
            "{body}"
        );
        // A claim that finds work is answered whatever the caps.
        api.enqueue("busy", &["ready"]).await;
        let (status, body) = waiting_claim(&api, 20_000, three, "busy", 1)
            .await
            .expect("joined");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["leases"][0]["key"], "ready", "{body}");
        for claim in claims {
            claim.abort();
        }
    })
    .await;
}

/// One token, however many sessions it starts, fills at most half the
/// server's cap when more than one token may claim: its claims past that
/// are answered 429, and another token's claim still waits, and ends with
/// its wait (200). Before, one token's sessions took the whole cap
/// and every other worker's waiting claim was turned away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_fills_at_most_half_the_cap_and_another_still_waits() {
    each_engine(|db| async move {
        let mut tokens = Tokens::default();
        tokens.insert("worker-a", Role::Worker);
        tokens.insert("worker-b", Role::Worker);
        let options = ServerOptions::default()
            .tokens(tokens)
            .max_waiting_claims(4);
        let mut api = Api::with(&db.store, options);
        // For `/metrics`, which `until_claims_waiting` reads.
        api.token = Some("worker-a".into());
        let api = Arc::new(api);
        let start = |token: &'static str| {
            let api = Arc::clone(&api);
            async move {
                let body = json!({ "component": "test", "ttl_ms": 60_000 }).to_string();
                let reply = api
                    .send(POST, "/v1/sessions", Some(body), Some(token))
                    .await;
                assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
                reply.json()["id"].as_i64().expect("session id")
            }
        };
        let claim = |token: &'static str, session: i64, wait_ms: u64| {
            let api = Arc::clone(&api);
            tokio::spawn(async move {
                let body = json!({ "process": P, "max": 1, "wait_ms": wait_ms }).to_string();
                let uri = format!("/v1/sessions/{session}/claim");
                let reply = api.send(POST, &uri, Some(body), Some(token)).await;
                (reply.status, reply.json())
            })
        };
        let mut waiting = Vec::new();
        for _ in 0..2 {
            let session = start("worker-a").await;
            waiting.push(claim("worker-a", session, 20_000));
        }
        api.until_claims_waiting(2).await;
        for _ in 0..2 {
            let session = start("worker-a").await;
            let (status, body) = claim("worker-a", session, 20_000).await.expect("joined");
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("this token's sessions")),
                "{body}"
            );
        }
        let b = start("worker-b").await;
        let theirs = claim("worker-b", b, 2_000);
        api.until_claims_waiting(3).await;
        let (status, body) = theirs.await.expect("joined");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["leases"], json!([]), "{body}");
        for claim in waiting {
            claim.abort();
        }
    })
    .await;
}

/// The token share applies between worker tokens only: beside an admin's
/// token (an operator's, the common `admin:…,worker:…` set-up), the one
/// worker token, the whole fleet, may fill the server's cap. Counting the
/// admin's halved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_worker_token_beside_an_admins_may_fill_the_cap() {
    each_engine(|db| async move {
        let mut tokens = Tokens::default();
        tokens.insert("s3cret", Role::Admin);
        tokens.insert("w0rk", Role::Worker);
        let options = ServerOptions::default()
            .tokens(tokens)
            .max_waiting_claims(4);
        let mut api = Api::with(&db.store, options);
        api.token = Some("w0rk".into());
        let api = Arc::new(api);
        let mut claims = Vec::new();
        for n in 1..=4 {
            let session = api.session(60_000).await;
            claims.push(waiting_claim(&api, 20_000, session, P, 1));
            api.until_claims_waiting(n).await;
        }
        for claim in claims {
            claim.abort();
        }
    })
    .await;
}

/// Claims waiting on a process its rate limit holds back (more keys ready
/// than tokens) share the line as idle ones do: when the next token comes,
/// one of them claims, not every one. Before, each claimed on its own timer
/// at every token: 200 of them on a process limited to 2 runs a second sent
/// about 400 claims a second, and a worker token's waiting claims (up to the
/// server's cap) multiplied the database's work by as many. The keys still
/// flow at the limit's rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_long_polls_cost_one_claim_per_token_not_one_each() {
    each_engine(|db| async move {
        let api = Arc::new(Api::new(&db.store));
        let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        api.enqueue(P, &keys).await;
        let limit = json!({ "rate_per_s": 2.0, "rate_burst": 1 });
        let reply = api
            .call(
                Method::PATCH,
                &format!("/v1/processes/{P}/settings"),
                Some(limit),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let mut claims = Vec::new();
        for _ in 0..20 {
            let session = api.session(60_000).await;
            for _ in 0..10 {
                claims.push(waiting_claim(&api, 20_000, session, P, 1));
            }
        }
        api.until_claims_waiting(150).await;
        let before = attempts(&api).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let polled = attempts(&api).await - before;
        eprintln!(
            "{}: 200 rate-limited waiting claims sent {polled} claims in 2 s",
            db.engine
        );
        assert!(
            polled <= 40,
            "about two claims per token (4 tokens) and one per poll; got {polled} in 2 s"
        );
        let served = claims.iter().filter(|c| c.is_finished()).count();
        assert!(
            served >= 2,
            "the keys flow at the limit's rate (2 a second); {served} claims were served"
        );
        for claim in claims {
            claim.abort();
        }
    })
    .await;
}

/// A waiting claim whose session ended while it waited (closed, or expired
/// with its worker) does not swallow the wake-up of an enqueue: the turn it
/// was given, and could not use, goes on to a live claim behind it, which
/// gets the key at once. Before, the dead claim answered 409 with the turn,
/// and the live one slept until the next poll (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_of_an_ended_session_passes_its_wakeup_on() {
    each_engine(|db| async move {
        let options = ServerOptions::default().poll_interval(Duration::from_secs(60));
        let api = Arc::new(Api::with(&db.store, options));
        let ended = api.session(60_000).await;
        let dead = waiting_claim(&api, 20_000, ended, P, 1);
        api.until_claims_waiting(1).await;
        let live = api.session(60_000).await;
        let alive = waiting_claim(&api, 20_000, live, P, 1);
        api.until_claims_waiting(2).await;
        let reply = api
            .call(Method::DELETE, &format!("/v1/sessions/{ended}"), None)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        api.enqueue(P, &["k"]).await;
        let (status, body) = tokio::time::timeout(Duration::from_secs(10), alive)
            .await
            .expect("the live claim was woken by the enqueue, not left to its poll")
            .expect("joined");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["leases"][0]["key"], "k", "{body}");
        let (status, body) = dead.await.expect("joined");
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"], "session_expired", "{body}");
    })
    .await;
}
