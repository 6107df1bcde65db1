//! The HTTP worker's batches of completions against the server's body limit
//! (`drover serve --body-limit`, `ServerOptions::body_limit`): every outcome
//! lands once, whatever its error text holds. A batch the server refuses as
//! too large (413) wrote nothing; before, it was sent again whole at every
//! retry until its leases lapsed, so permanent failures were never parked
//! and runs that succeeded ran again. SQLite behind an in-process server.
//! Also how long the worker waits for a claim its server is slow to answer
//! (on PostgreSQL, behind a table lock).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use drover::runner::{Action, BoxError, Controller, Task, permanent};
use drover::server::ServerOptions;
use drover::store::{
    ItemEnqueue, ItemGet, ItemState, LeaseClaim, LeaseComplete, Outcome, SessionStart, Store,
    StoreEngine as _, WorkerBackend,
};
use support::backend::{TestBackend, served_with};
use support::process::eventually_within;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "batches";

/// (pending + backoff, running, parked) of the process.
async fn counts(store: &Store) -> (u64, u64, u64) {
    let all = store.process_counts_all().await.expect("counts");
    all.iter()
        .find(|c| c.process == PROCESS)
        .map_or((0, 0, 0), |c| (c.pending + c.backoff, c.running, c.parked))
}

/// Claims `n` keys through `backend` under a new session.
async fn claimed(backend: &TestBackend, n: u32) -> Vec<drover::store::Lease> {
    let session = backend
        .session_start(SessionStart::new("batches", Duration::from_secs(30)))
        .await
        .expect("session");
    let claim = LeaseClaim {
        session: session.id,
        process: PROCESS.into(),
        max: n,
        trace_links: false,
    };
    backend
        .lease_claim_wait(claim, Duration::ZERO)
        .await
        .expect("claim")
        .leases
}

/// Eight permanent failures, each 60 KiB of escape characters (a terminal's
/// colours): within the store's 64 KiB, but six times that as JSON, so one
/// batch of them is over the server's default 1 MiB. Every one is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_of_control_characters_are_counted_as_json_sends_them() {
    let (db, _dir) = support::sqlite().await;
    let backend = served_with(&db.store, ServerOptions::default());
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, keys))
        .await
        .expect("enqueue");
    let leases = claimed(&backend, 8).await;
    assert_eq!(leases.len(), 8);
    let outcome = Outcome::Permanent("\u{1b}".repeat(60 * 1024));
    let batch: Vec<LeaseComplete<'_>> = leases
        .iter()
        .map(|lease| LeaseComplete {
            lease,
            outcome: &outcome,
            trace_id: None,
        })
        .collect();
    let results = backend.lease_complete_batch(&batch).await.expect("batch");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(counts(&db.store).await, (0, 0, 8), "every key parked");
}

/// A lone completion larger than the server takes (a 4 KiB body limit, an
/// error of 60 KiB) is written with its error text cut to fit, marked with an
/// ellipsis, and its key parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_completion_over_the_limit_is_written_with_its_error_cut() {
    let (db, _dir) = support::sqlite().await;
    let backend = served_with(&db.store, ServerOptions::default().body_limit(4 * 1024));
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    let leases = claimed(&backend, 1).await;
    let outcome = Outcome::Permanent(format!("failed: {}", "\u{1b}[31mred".repeat(10_000)));
    let batch = [LeaseComplete {
        lease: &leases[0],
        outcome: &outcome,
        trace_id: None,
    }];
    let results = backend.lease_complete_batch(&batch).await.expect("batch");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let item = db
        .store
        .item_get(ItemGet {
            process: PROCESS.into(),
            key: "k".into(),
            runs_limit: 1,
        })
        .await
        .expect("get")
        .expect("the item");
    assert_eq!(item.item.state, ItemState::Parked);
    let error = item.item.last_error.expect("its error");
    assert!(
        error.starts_with("failed: \u{1b}[31mred") && error.ends_with('…'),
        "{error:?}"
    );
    assert!(error.len() < 4 * 1024, "{} bytes", error.len());
}

/// Enqueues `n` keys and runs them through a worker of `parallelism` runs on
/// `backend` (10 s TTL, so a heartbeat late on a loaded machine cannot rerun
/// a key), each run taking `took` and ending with `end()`, until the
/// process's counts are `until`; returns how many runs there were.
async fn drain(
    store: &Store,
    backend: TestBackend,
    (n, parallelism): (usize, usize),
    took: Duration,
    end: fn() -> Result<Action, BoxError>,
    until: (u64, u64, u64),
) -> u64 {
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i:04}")).collect();
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, keys))
        .await
        .expect("enqueue");
    let runs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&runs);
    let controller = Controller::builder(backend, PROCESS, move |_task: Task| {
        let counted = Arc::clone(&counted);
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(took).await;
            end()
        }
    })
    .parallelism(parallelism)
    .ttl(Duration::from_secs(10))
    .idle_poll(Duration::from_millis(100))
    .build()
    .expect("valid settings");
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(controller.run(shutdown.clone()));
    eventually_within("the keys settled", Duration::from_secs(60), || async {
        counts(store).await == until
    })
    .await;
    shutdown.cancel();
    worker.await.expect("worker task").expect("worker");
    runs.load(Ordering::SeqCst)
}

/// A worker of 1,000 runs at once on a server that takes bodies of 64 KiB at
/// most: every key runs once and is done. Before, its batches of up to
/// 512 KiB were refused whole, retried until their leases lapsed, and their
/// keys ran again (2,086 runs for 1,000 keys with a 2 s TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_lands_once_on_a_server_with_a_small_body_limit() {
    let (db, _dir) = support::sqlite().await;
    let backend = served_with(&db.store, ServerOptions::default().body_limit(64 * 1024));
    let done = || Ok(Action::Done);
    let runs = drain(
        &db.store,
        backend,
        (1000, 1000),
        Duration::from_millis(200),
        done,
        (0, 0, 0),
    )
    .await;
    assert_eq!(runs, 1000, "each key ran once");
}

/// Permanent failures of long control-character errors through a whole
/// worker: each key runs once and is parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_permanent_failures_park_their_keys_after_one_run() {
    let (db, _dir) = support::sqlite().await;
    let backend = served_with(&db.store, ServerOptions::default());
    let failed = || Err(permanent(std::io::Error::other("\u{1b}".repeat(60 * 1024))).into());
    let runs = drain(
        &db.store,
        backend,
        (32, 32),
        Duration::from_millis(300),
        failed,
        (0, 0, 32),
    )
    .await;
    assert_eq!(runs, 32, "each key ran once");
}

/// A busy worker claims without waiting (`wait_ms` 0), and its server may
/// rightly take longer than 10 s to answer: here its claim waits 13 s behind
/// a table lock, and the server's store, finding the database alive, waits
/// it out. The client waits as long as for any other request (30 s). Before,
/// it gave such a claim 10 s, then took the answer for unknown and gave its
/// whole session up, stopping every run under it. PostgreSQL only: a
/// SQLite claim does not queue behind a reader's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_wait_is_awaited_while_its_server_waits_on_a_lock() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    db.store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["a"]))
        .await
        .expect("enqueue");
    let backend = served_with(&db.store, ServerOptions::default());
    let holder = support::locks::items_held_for(&db.sql_url, Duration::from_secs(13)).await;
    // A new session, then a claim without wait, answered once the lock goes.
    let leases = claimed(&backend, 1).await;
    holder.await.expect("holder");
    assert_eq!(leases.len(), 1, "{leases:?}");
    drop(backend);
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}
