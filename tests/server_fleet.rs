//! Fleet controls over the HTTP API and the dashboard, on every engine:
//! settings read by viewers and changed by admins, pause / resume, what a
//! claim answers under them, the paused gauge, and bad input.

mod server_support;
mod support;

use axum::http::{Method, StatusCode};
use drover::store::StoreEngine as _;
use serde_json::{Value, json};
use server_support::{Api, GET, POST};
use support::each_engine;

const P: &str = "provision";

fn settings_uri() -> String {
    format!("/v1/processes/{P}/settings")
}

async fn patch(api: &Api, body: Value) -> (StatusCode, Value) {
    let reply = api.call(Method::PATCH, &settings_uri(), Some(body)).await;
    (reply.status, reply.json())
}

#[tokio::test]
async fn admins_change_the_same_settings_as_process_configure_and_viewers_read_them() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        let unknown = api.call(GET, &settings_uri(), None).await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text);
        let body = json!({
            "concurrency": 4, "rate_per_s": 10.5, "rate_burst": 2,
            "keep_runs_per_key": 7, "backoff_max_ms": 60000
        });
        let (status, settings) = patch(&api, body).await;
        assert_eq!(status, StatusCode::OK, "{settings}");
        assert_eq!(settings["concurrency"], 4);
        assert_eq!(settings["rate_per_s"], 10.5);
        assert_eq!(settings["rate_burst"], 2);
        assert_eq!(settings["keep_runs_per_key"], 7);
        assert_eq!(settings["backoff_max_ms"], 60000);
        assert_eq!(
            settings["backoff_initial_ms"], 1000,
            "the stored initial delay is kept"
        );
        assert_eq!(settings["paused"], false);
        assert_eq!(api.get_ok(&settings_uri()).await, settings);

        let (status, settings) = patch(&api, json!({ "concurrency": null })).await;
        assert_eq!(status, StatusCode::OK, "{settings}");
        assert_eq!(
            settings["concurrency"],
            Value::Null,
            "null removes the limit"
        );
        assert_eq!(settings["rate_per_s"], 10.5, "what was not given is kept");
        let process = db.store.process_list().await;
        let limits = process.expect("list")[0].limits;
        assert_eq!(limits.concurrency, None);
    })
    .await;
}

#[tokio::test]
async fn bad_settings_get_a_400_and_change_nothing() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        patch(&api, json!({ "concurrency": 3 })).await;
        for body in [
            json!({ "concurrency": 0 }),
            json!({ "concurrency": -1 }),
            json!({ "concurrency": "many" }),
            json!({ "rate_per_s": 0 }),
            json!({ "rate_per_s": -5 }),
            json!({ "rate_per_s": 2_000_000 }),
            json!({ "rate_burst": 0 }),
            json!({ "backoff_factor": 0.5 }),
            json!({ "keep_runs_per_key": 0 }),
            json!({ "rate": 5 }),
        ] {
            let (status, error) = patch(&api, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
            let message = error["message"].as_str().expect("a message");
            assert!(!message.contains('\n'), "one line: {message}");
        }
        let settings = api.get_ok(&settings_uri()).await;
        assert_eq!(settings["concurrency"], 3, "nothing changed: {settings}");
        assert_eq!(settings["rate_per_s"], Value::Null);
    })
    .await;
}

#[tokio::test]
async fn a_paused_process_answers_claims_with_nothing_until_resumed_and_shows_in_history_and_metrics()
 {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "b"]).await;
        let pause = api
            .post(
                &format!("/v1/processes/{P}/pause"),
                json!(null),
                StatusCode::OK,
            )
            .await;
        assert_eq!(
            pause,
            json!({ "process": P, "paused": true, "changed": true })
        );
        let again = api
            .post(
                &format!("/v1/processes/{P}/pause"),
                json!(null),
                StatusCode::OK,
            )
            .await;
        assert_eq!(again["changed"], false);
        let session = api.session(30_000).await;
        let uri = format!("/v1/sessions/{session}/claim");
        let claim = api
            .post(&uri, json!({ "process": P, "max": 5 }), StatusCode::OK)
            .await;
        assert_eq!(claim["leases"], json!([]));
        assert_eq!(claim["paused"], true);
        let metrics = api.call(GET, "/metrics", None).await.text;
        assert!(
            metrics.contains(&format!("drover_process_paused{{process=\"{P}\"}} 1")),
            "{metrics}"
        );

        api.post(
            &format!("/v1/processes/{P}/resume"),
            json!(null),
            StatusCode::OK,
        )
        .await;
        assert_eq!(api.claim(session, P, 5).await.len(), 2, "resumed");
        let runs = api.get_ok(&format!("/v1/processes/{P}/runs")).await;
        let actions: Vec<_> = runs["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| (r["outcome"].clone(), r["actor"].clone()))
            .collect();
        assert_eq!(
            actions,
            [
                (json!("resumed"), json!("admin")),
                (json!("paused"), json!("admin"))
            ]
        );
        let metrics = api.call(GET, "/metrics", None).await.text;
        assert!(metrics.contains(&format!("drover_process_paused{{process=\"{P}\"}} 0")));
    })
    .await;
}

#[tokio::test]
async fn a_rate_limited_claim_says_when_the_next_token_comes() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a", "b", "c"]).await;
        patch(&api, json!({ "rate_per_s": 1, "rate_burst": 1 })).await;
        let session = api.session(30_000).await;
        let uri = format!("/v1/sessions/{session}/claim");
        let claim = api
            .post(&uri, json!({ "process": P, "max": 5 }), StatusCode::OK)
            .await;
        assert_eq!(claim["leases"].as_array().expect("leases").len(), 1);
        let next = claim["next_token_in_ms"].as_u64().expect("a next token");
        assert!((1..=1000).contains(&next), "{claim}");
    })
    .await;
}

#[tokio::test]
async fn the_process_page_shows_its_fleet_controls_and_its_button_pauses_and_resumes() {
    each_engine(|db| async move {
        let api = Api::new(&db.store);
        api.enqueue(P, &["a"]).await;
        patch(
            &api,
            json!({ "concurrency": 5, "rate_per_s": 20, "rate_burst": 5 }),
        )
        .await;
        let page = api
            .call(GET, &format!("/ui/processes/{P}"), None)
            .await
            .text;
        assert!(page.contains("Fleet controls"), "{page}");
        assert!(page.contains("at most 5 running at once"), "{page}");
        assert!(page.contains("20 runs/s, burst 5"), "{page}");
        assert!(
            page.contains(&format!("action=\"/ui/processes/{P}/pause\"")),
            "{page}"
        );
        let paused = api
            .call(POST, &format!("/ui/processes/{P}/pause"), None)
            .await;
        assert_eq!(paused.status, StatusCode::SEE_OTHER);
        let page = api
            .call(GET, &format!("/ui/processes/{P}"), None)
            .await
            .text;
        assert!(page.contains("paused"), "{page}");
        assert!(
            page.contains(&format!("action=\"/ui/processes/{P}/resume\"")),
            "{page}"
        );
        api.call(POST, &format!("/ui/processes/{P}/resume"), None)
            .await;
        assert_eq!(api.get_ok(&settings_uri()).await["paused"], false);
    })
    .await;
}
