//! `drover work --server`: a worker speaking HTTP to `drover serve`, both spawned
//! from the built binary, on both engines.

mod support;

use std::time::Duration;

use drover::store::{
    ItemEnqueue, ItemGet, ItemState, Run, RunList, RunOutcome, Store, StoreEngine as _,
};
use nix::sys::signal::Signal;
use support::cli::work_command;
use support::process::{eventually, signal, stop};
use support::serve::Serve;
use support::{TestDb, each_engine};
use tokio::process::{Child, Command};

const PROCESS: &str = "remote";
const TOKEN: &str = "worker-secret";

/// `drover serve` on a free loopback port with one worker token; returns it and
/// its base URL.
async fn serve(db: &TestDb, dir: &std::path::Path) -> (Child, String) {
    serve_on(db, dir, "127.0.0.1:0").await
}

/// `drover serve` listening on `listen`.
async fn serve_on(db: &TestDb, dir: &std::path::Path, listen: &str) -> (Child, String) {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("worker:{TOKEN}\n")).unwrap();
    let tokens = tokens.to_str().expect("a UTF-8 temporary path");
    let serve = Serve::start_with(&db.url, &["--listen", listen, "--tokens", tokens]).await;
    (serve.child, serve.url)
}

/// [`serve`] with a fault proxy in front of it: workers reach the server
/// through the proxy's address, so a test can freeze or cut their link.
async fn serve_behind_proxy(
    db: &TestDb,
    dir: &std::path::Path,
) -> (Child, support::fault_proxy::FaultProxy) {
    let (serve, url) = serve(db, dir).await;
    let addr = url
        .trim_start_matches("http://")
        .parse()
        .expect("an address");
    (serve, support::fault_proxy::FaultProxy::start(addr).await)
}

fn remote_worker(url: &str, exec: &str, flags: &[&str]) -> Child {
    let args = [PROCESS, "--server", url, "--token", TOKEN, "--exec", exec];
    support::cli::work(args.into_iter().chain(flags.iter().copied()))
}

async fn counts(store: &Store) -> (u64, u64, u64) {
    let all = store.process_counts_all().await.unwrap();
    all.iter()
        .find(|c| c.process == PROCESS)
        .map_or((0, 0, 0), |c| (c.pending + c.backoff, c.running, c.parked))
}

/// `key`'s runs, newest first.
async fn runs(store: &Store, key: &str) -> Vec<Run> {
    let list = RunList {
        process: Some(PROCESS.into()),
        key: Some(key.into()),
        limit: 100,
        ..RunList::default()
    };
    store.run_list(list).await.unwrap()
}

/// `key`'s runs that ended with `outcome`, newest first.
async fn events(store: &Store, key: &str, outcome: RunOutcome) -> Vec<Run> {
    let mut all = runs(store, key).await;
    all.retain(|e| e.outcome == outcome);
    all
}

/// Waits until `key` has run to completion; its newest `done` run.
async fn finished_run(store: &Store, key: &str) -> Run {
    eventually(&format!("{key} to finish"), || async {
        !events(store, key, RunOutcome::Done).await.is_empty()
    })
    .await;
    events(store, key, RunOutcome::Done).await.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_over_http_processes_keys_end_to_end() {
    each_engine(|db| async move {
        let dir = tempfile::tempdir().unwrap();
        let (server, url) = serve(&db, dir.path()).await;
        let keys = ["a", "b", "c", "d", "bad"];
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .unwrap();
        let script =
            r#"[ "$1" = bad ] && { echo "cannot provision $DROVER_KEY" >&2; exit 2; }; exit 0"#;
        let worker = remote_worker(
            &url,
            &format!("sh -c '{script}' sh"),
            &["--parallelism", "2"],
        );
        eventually("four done and one parked", || async {
            counts(&db.store).await == (0, 0, 1)
        })
        .await;
        stop(worker).await;
        let bad = db
            .store
            .item_get(ItemGet {
                process: PROCESS.into(),
                key: "bad".into(),
                runs_limit: 10,
            })
            .await
            .unwrap()
            .expect("parked");
        assert_eq!(bad.item.state, ItemState::Parked);
        assert_eq!(
            bad.item.last_error.as_deref(),
            Some("exit 2: cannot provision bad")
        );
        for key in ["a", "b", "c", "d"] {
            assert_eq!(
                events(&db.store, key, RunOutcome::Done).await.len(),
                1,
                "{key}"
            );
        }
        let metrics = || async {
            reqwest::Client::new()
                .get(format!("{url}/metrics"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        };
        let line = |outcome: &str, n: u32| {
            format!(r#"drover_outcomes_total{{process="{PROCESS}",outcome="{outcome}"}} {n}"#)
        };
        // The server counts an outcome once it has committed it, just after
        // the database shows it: wait until it has counted five.
        eventually("the server counts every run", || async {
            let page = metrics().await;
            let counted = page
                .lines()
                .filter(|l| {
                    l.starts_with(&format!(r#"drover_outcomes_total{{process="{PROCESS}""#))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>();
            counted >= 5
        })
        .await;
        let metrics = metrics().await;
        for (outcome, n) in [("done", 4), ("permanent", 1)] {
            let line = line(outcome, n);
            assert!(
                metrics.contains(&line),
                "HTTP workers' outcomes are counted: no {line} in\n{metrics}"
            );
        }
        drop(server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_worker_that_lost_its_lease_to_expiry_is_refused() {
    each_engine(|db| async move {
        let dir = tempfile::tempdir().unwrap();
        let (server, url) = serve(&db, dir.path()).await;
        let marker = dir.path().join("started");
        let slow = format!("sh -c 'touch {}; sleep 1; exit 0' sh", marker.display());
        let stale = remote_worker(&url, &slow, &["--ttl", "1s"]);
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
            .await
            .unwrap();
        eventually("the remote run to start", || async { marker.exists() }).await;
        // Freeze the remote worker past its TTL: its session expires and a worker
        // on the database reclaims the key and runs it.
        signal(&stale, Signal::SIGSTOP);
        let heir = support::cli::worker(&db.url, PROCESS, "true", &["--ttl", "1s"]);
        eventually("the key reclaimed and run by the heir", || async {
            !events(&db.store, "k", RunOutcome::Done).await.is_empty()
        })
        .await;
        signal(&stale, Signal::SIGCONT);
        stop(heir).await;
        stop(stale).await;
        let finished = events(&db.store, "k", RunOutcome::Done).await;
        assert_eq!(
            finished.len(),
            1,
            "the stale worker's outcome was refused: {finished:?}"
        );
        let expired = events(&db.store, "k", RunOutcome::Expired).await;
        assert_eq!(expired.len(), 1);
        assert_ne!(
            finished[0].session, expired[0].session,
            "the heir's run counted, not the stale worker's"
        );
        assert!(
            finished[0].token > expired[0].token,
            "the heir's lease is the newer one"
        );
        drop(server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_worker_whose_claim_is_refused_starts_a_new_session_at_once() {
    each_engine(|db| async move {
        let dir = tempfile::tempdir().unwrap();
        let (server, url) = serve(&db, dir.path()).await;
        // A TTL far past the test: the next regular heartbeat is 200 s away.
        let worker = remote_worker(&url, "true", &["--ttl", "600s"]);
        let enqueue = |key: &'static str| db.store.item_enqueue(ItemEnqueue::new(PROCESS, [key]));
        enqueue("first").await.unwrap();
        let first = finished_run(&db.store, "first").await;
        let session = first.session.expect("the run's session");
        // The session goes away under the worker (as when the server closes it
        // after a claim whose commit was unknown); its claims are refused.
        db.store
            .session_close(drover::store::SessionClose { session })
            .await
            .unwrap();
        enqueue("second").await.unwrap();
        let second = finished_run(&db.store, "second").await;
        assert_ne!(second.session, Some(session), "run under a new session");
        stop(worker).await;
        drop(server);
    })
    .await;
}

#[tokio::test]
async fn a_wrong_token_fails_at_once_with_the_servers_answer() {
    let (db, dir) = support::sqlite().await;
    let (server, url) = serve(&db, dir.path()).await;
    let output = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args([
            "work", PROCESS, "--server", &url, "--token", "wrong", "--exec", "true",
        ])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("401"), "{stderr}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_reached_while_the_server_is_down_lands_after_its_restart() {
    each_engine(|db| async move {
        let dir = tempfile::tempdir().unwrap();
        let (server, url) = serve(&db, dir.path()).await;
        let listen = url.trim_start_matches("http://").to_owned();
        let (started, ended) = (dir.path().join("started"), dir.path().join("ended"));
        let gate = dir.path().join("gate");
        // The run waits for the test to kill the server, then ends: its outcome
        // is reached while nothing answers.
        let script = format!(
            "touch {s}; while [ ! -e {g} ]; do sleep 0.02; done; touch {e}",
            s = started.display(),
            g = gate.display(),
            e = ended.display()
        );
        let worker = remote_worker(&url, &format!("sh -c '{script}' sh"), &["--ttl", "30s"]);
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
            .await
            .unwrap();
        eventually("the run to start", || async { started.exists() }).await;
        let mut server = server;
        server.start_kill().unwrap();
        server.wait().await.unwrap();
        std::fs::write(&gate, "").unwrap();
        eventually("the run to end", || async { ended.exists() }).await;
        // The worker is now retrying its outcome against a dead server; bring
        // it back on the same address (a crash and restart of `serve`).
        let (restarted, _) = serve_on(&db, dir.path(), &listen).await;
        let finished = finished_run(&db.store, "k").await;
        assert_eq!(counts(&db.store).await, (0, 0, 0), "k is done, not stuck");
        let all = runs(&db.store, "k").await;
        assert_eq!(all.len(), 1, "one run: its outcome landed late: {all:?}");
        assert_eq!(all[0].id, finished.id);
        stop(worker).await;
        drop(restarted);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_worker_with_a_parallelism_over_one_claims_answer_drains_everything() {
    each_engine(|db| async move {
        let dir = tempfile::tempdir().unwrap();
        let (server, url) = serve(&db, dir.path()).await;
        let keys: Vec<String> = (0..2500).map(|i| format!("k{i:04}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .unwrap();
        // 2,000 slots (as the README says): more than one claim answer holds
        // (1,000), which the server once refused with a 400 for ever.
        let worker = remote_worker(&url, "true", &["--parallelism", "2000"]);
        support::process::eventually_within(
            "2,500 keys drained",
            Duration::from_secs(120),
            || async { counts(&db.store).await == (0, 0, 0) },
        )
        .await;
        stop(worker).await;
        let list = RunList {
            process: Some(PROCESS.into()),
            limit: 10_000,
            ..RunList::default()
        };
        let history = db.store.run_list(list).await.unwrap();
        let finished = history
            .iter()
            .filter(|e| e.outcome == RunOutcome::Done)
            .count();
        assert_eq!(finished, 2500, "every key ran once");
        drop(server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_serves_its_own_metrics_on_either_backend() {
    each_engine(|db| async move {
        let dir = tempfile::tempdir().unwrap();
        let (server, url) = serve(&db, dir.path()).await;
        let remote = [
            PROCESS, "--server", &url, "--token", TOKEN, "--exec", "true",
        ];
        let (remote, remote_addr) = support::cli::with_metrics(work_command(remote)).await;
        let direct = [PROCESS, "--db", &db.url, "--exec", "false"];
        let (direct, direct_addr) = support::cli::with_metrics(work_command(direct)).await;
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .unwrap();
        eventually("every key ran", || async {
            let (pending, running, _) = counts(&db.store).await;
            pending + running == 0
        })
        .await;
        // The remote worker's runs are done, the direct one's (`false`) parked:
        // each worker's own page counts what it ran, and both add up.
        let page = |addr: String| async move {
            let reply = reqwest::get(format!("http://{addr}/metrics"))
                .await
                .unwrap();
            assert!(reply.status().is_success());
            reply.text().await.unwrap()
        };
        let count = |text: &str, outcome: &str| -> u64 {
            let prefix =
                format!(r#"drover_outcomes_total{{process="{PROCESS}",outcome="{outcome}"}} "#);
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map_or(0, |n| n.trim().parse().unwrap())
        };
        // A worker counts an outcome once its commit is answered, just after
        // the database shows it: wait for the pages to catch up.
        let pages = || async {
            (
                page(remote_addr.clone()).await,
                page(direct_addr.clone()).await,
            )
        };
        eventually("both pages count every run", || async {
            let (remote_page, direct_page) = pages().await;
            count(&remote_page, "done") + count(&direct_page, "permanent") >= 20
        })
        .await;
        let (remote_page, direct_page) = pages().await;
        assert_eq!(count(&remote_page, "permanent"), 0, "{remote_page}");
        assert_eq!(count(&direct_page, "done"), 0, "{direct_page}");
        let (done, parked) = (
            count(&remote_page, "done"),
            count(&direct_page, "permanent"),
        );
        assert_eq!(done + parked, 20, "remote {done} + direct {parked}");
        assert_eq!(
            counts(&db.store).await.2,
            parked,
            "parked keys are the direct worker's"
        );
        assert!(remote_page.contains("drover_sessions_active"));
        stop(remote).await;
        stop(direct).await;
        drop(server);
    })
    .await;
}

/// A worker whose server does not answer its first session start (a frozen
/// link, a server that hangs) stops at once on SIGTERM, exit 0: before, it
/// waited out the client's 30 s request timeout and then exited 1, saying
/// it could not start a session, though a shutdown was asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_worker_whose_first_session_start_is_not_answered() {
    let (db, dir) = support::sqlite().await;
    let (_serve, proxy) = serve_behind_proxy(&db, dir.path()).await;
    proxy.freeze();
    let worker = remote_worker(&format!("http://{}", proxy.addr), "true", &[]);
    eventually("the session start in flight", || async {
        proxy.connections() > 0
    })
    .await;
    let asked = std::time::Instant::now();
    stop(worker).await;
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM"
    );
}

/// A traced worker (an OTLP endpoint set) links a transient failure's retry
/// to its attempt through the server before writing the outcome. With the
/// link to the server frozen, SIGTERM with a 1 s shutdown deadline still
/// ends it within a few seconds: the trace link waited out the client's
/// 30 s request timeout, past the deadline and past the session's loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_worker_stops_within_its_deadline_when_its_server_freezes() {
    let (db, dir) = support::sqlite().await;
    let (_serve, proxy) = serve_behind_proxy(&db, dir.path()).await;
    let log = dir.path().join("work.log");
    let exec = format!(
        "sh -c 'echo start >> {0}; sleep 1; echo end >> {0}; exit 75'",
        log.display()
    );
    let args = [
        PROCESS,
        "--server",
        &format!("http://{}", proxy.addr),
        "--token",
        TOKEN,
        "--exec",
        &exec,
        "--ttl",
        "10s",
        "--shutdown-deadline",
        "1s",
    ];
    let worker = work_command(args)
        // Nothing listens there: the spans are dropped, but runs are traced.
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("TRACEPARENT")
        .spawn()
        .expect("spawn drover work");
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .unwrap();
    let said = |what: &'static str| {
        let log = log.clone();
        move || {
            let log = log.clone();
            async move { std::fs::read_to_string(&log).is_ok_and(|l| l.contains(what)) }
        }
    };
    eventually("the command started", said("start")).await;
    proxy.freeze();
    eventually("the command ended", said("end")).await;
    let asked = std::time::Instant::now();
    stop(worker).await;
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM"
    );
}
