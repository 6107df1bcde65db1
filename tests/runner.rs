//! The runner against both engines: what a control loop built with
//! `drover::runner::Controller` guarantees, end to end, in one process.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use drover::backoff::Backoff;
use drover::runner::{
    Action, BoxError, Controller, ControllerBuilder, Reconciler, Source, Task, permanent,
};
use drover::store::{
    ItemEnqueue, ItemGet, ItemState, Run, RunList, RunOutcome, Store, StoreEngine as _,
};
use support::backend::TestBackend;
use support::{TestDb, each_backend, each_engine};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "persist";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A controller tuned for tests: no poll throttling, quick idle polls.
fn controller<R: Reconciler>(
    backend: &TestBackend,
    reconciler: R,
) -> ControllerBuilder<R, TestBackend> {
    Controller::builder(backend.clone(), PROCESS, reconciler)
        .poll_rate(ms(1), 1000)
        .idle_poll(ms(50))
        .ttl(Duration::from_secs(3))
}

/// [`controller`] retrying a failed key after a fixed 10 ms.
fn retrying<R: Reconciler>(
    backend: &TestBackend,
    reconciler: R,
) -> ControllerBuilder<R, TestBackend> {
    controller(backend, reconciler).backoff(Backoff::new(ms(10), 2.0, ms(10)).unwrap())
}

struct Running {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Running {
    fn start<R: Reconciler>(builder: ControllerBuilder<R, TestBackend>) -> Self {
        let (stop, handle) = support::running::spawn(builder.build().expect("valid settings"));
        Self { stop, handle }
    }

    /// Graceful shutdown; returns once every outcome is written.
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .expect("shutdown within 20 s")
            .expect("controller task");
    }
}

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the controller made progress within 20 s")
        .expect("sender alive")
}

async fn enqueue(store: &Store, keys: &[&str]) {
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, keys.iter().copied()))
        .await
        .expect("enqueue");
}

async fn item(db: &TestDb, key: &str) -> Option<drover::store::ItemDetail> {
    db.store
        .item_get(ItemGet {
            process: PROCESS.into(),
            key: key.into(),
            runs_limit: 100,
        })
        .await
        .expect("item_get")
}

/// `key`'s runs, oldest first.
async fn runs_of(db: &TestDb, key: &str) -> Vec<Run> {
    let mut all = db
        .store
        .run_list(RunList {
            process: Some(PROCESS.into()),
            key: Some(key.into()),
            limit: 1000,
            ..RunList::default()
        })
        .await
        .expect("run_list");
    all.reverse();
    all
}

/// `key`'s runs that ended with `outcome`, oldest first.
async fn events(db: &TestDb, key: &str, outcome: RunOutcome) -> Vec<Run> {
    let mut all = runs_of(db, key).await;
    all.retain(|r| r.outcome == outcome);
    all
}

/// Fails unless `key` is pending again with no failure counted (a released or
/// canceled run is not a failure).
async fn assert_pending_unfailed(db: &TestDb, key: &str) {
    let detail = item(db, key).await.expect("still an item");
    assert_eq!(
        detail.item.state,
        ItemState::Pending,
        "{key} back to pending"
    );
    assert_eq!(detail.item.failures, 0, "{key}: not a failure");
}

/// A reconciler that reports every run's (key, attempt) and ends it with `end`.
fn reporting<F>(tx: mpsc::UnboundedSender<(String, u32)>, end: F) -> impl Reconciler
where
    F: Fn(&Task) -> Result<Action, BoxError> + Send + Sync + 'static,
{
    let end = Arc::new(end);
    move |task: Task| {
        let (tx, end) = (tx.clone(), Arc::clone(&end));
        async move {
            let _ = tx.send((task.key().to_owned(), task.attempt()));
            end(&task)
        }
    }
}

/// A reconciler that reports each run's key, then never returns (until the
/// shutdown deadline cancels it).
fn stuck(tx: mpsc::UnboundedSender<String>) -> impl Reconciler {
    move |task: Task| {
        let tx = tx.clone();
        async move {
            tx.send(task.key().to_owned()).unwrap();
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Action::Done)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_enqueued_key_is_reconciled_exactly_once() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let running = Running::start(
            controller(&db.worker, reporting(tx, |_| Ok(Action::Done))).parallelism(4),
        );
        let keys: Vec<String> = (0..40).map(|i| format!("ns/obj-{i:02}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        enqueue(&db.store, &refs).await;
        let mut seen = Vec::new();
        for _ in 0..keys.len() {
            seen.push(recv(&mut rx).await.0);
        }
        running.stop().await;
        assert!(rx.try_recv().is_err(), "no key ran twice");
        seen.sort();
        assert_eq!(seen, keys);
        let counts = db.store.process_counts_all().await.unwrap();
        let counts = counts.iter().find(|c| c.process == PROCESS).unwrap();
        assert_eq!((counts.pending, counts.running, counts.parked), (0, 0, 0));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_parks_the_key_until_it_is_enqueued_again() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let calls = Arc::new(AtomicU32::new(0));
        let reconciler = {
            let calls = Arc::clone(&calls);
            reporting(tx, move |_| {
                if calls.fetch_add(1, SeqCst) == 0 {
                    let invalid = permanent(std::io::Error::other("manifest is invalid"));
                    Err(anyhow::Error::new(invalid).context("saving the run").into())
                } else {
                    Ok(Action::Done)
                }
            })
        };
        let running = Running::start(controller(&db.worker, reconciler));
        enqueue(&db.store, &["run-1"]).await;
        recv(&mut rx).await;
        running.stop().await;
        let parked = item(&db, "run-1").await.expect("parked item");
        assert_eq!(parked.item.state, ItemState::Parked);
        assert_eq!(
            parked.item.last_error.as_deref(),
            Some("saving the run: manifest is invalid"),
            "a wrapped permanent error keeps its class and its whole chain"
        );

        let (tx, mut rx) = mpsc::unbounded_channel();
        let running = Running::start(controller(&db.worker, reporting(tx, |_| Ok(Action::Done))));
        enqueue(&db.store, &["run-1"]).await;
        assert_eq!(
            recv(&mut rx).await.0,
            "run-1",
            "an enqueue revives a parked key"
        );
        running.stop().await;
        assert_eq!(
            item(&db, "run-1").await.map(|d| d.item.state),
            Some(ItemState::Idle)
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_back_off_longer_each_time_up_to_the_cap() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let backoff = Backoff::new(ms(40), 2.0, ms(160)).unwrap();
        let failing = reporting(tx, |_| Err("upstream unavailable".into()));
        let running = Running::start(
            controller(&db.worker, failing)
                .backoff(backoff)
                .idle_poll(ms(10)),
        );
        enqueue(&db.store, &["k"]).await;
        let mut attempts = Vec::new();
        for _ in 0..5 {
            attempts.push(recv(&mut rx).await.1);
        }
        running.stop().await;
        assert_eq!(attempts, [1, 2, 3, 4, 5]);
        let starts: Vec<_> = runs_of(&db, "k")
            .await
            .iter()
            .map(|r| r.started_at.expect("a run's start"))
            .collect();
        assert!(starts.len() >= 5, "{starts:?}");
        let gaps: Vec<_> = starts
            .windows(2)
            .map(|w| (w[1] - w[0]).to_std().unwrap())
            .collect();
        for (gap, least) in gaps.iter().zip([40, 80, 160, 160]) {
            assert!(
                *gap >= ms(least),
                "a retry came {gap:?} after the last, before its {least} ms backoff"
            );
        }
        let detail = item(&db, "k").await.unwrap();
        assert!(detail.item.failures >= 5);
        assert_eq!(
            detail.item.last_error.as_deref(),
            Some("upstream unavailable")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_respects_the_stored_backoff() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let backoff = Backoff::new(ms(400), 2.0, ms(400)).unwrap();
        let running = Running::start(
            controller(&db.worker, reporting(tx, |_| Err("down".into()))).backoff(backoff),
        );
        enqueue(&db.store, &["k"]).await;
        recv(&mut rx).await;
        running.stop().await;
        let until = item(&db, "k")
            .await
            .unwrap()
            .item
            .backoff_until
            .expect("in backoff");

        let restarted = db.reconnect().await;
        // On the database, a fresh connection; through a server, a new client.
        let worker = match &db.worker {
            TestBackend::Store(_) => TestBackend::Store(restarted.clone()),
            client => client.clone(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let running = Running::start(
            controller(&worker, reporting(tx, |_| Ok(Action::Done))).idle_poll(ms(10)),
        );
        enqueue(&restarted, &["k"]).await; // an enqueue does not shorten the backoff
        assert_eq!(recv(&mut rx).await, ("k".to_owned(), 2));
        running.stop().await;
        let second = runs_of(&db, "k").await[1].started_at.expect("a start");
        assert!(
            second >= until,
            "ran at {second} before the backoff ended at {until}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_is_a_transient_failure_and_the_worker_lives_on() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = reporting(tx, |task| {
            if task.attempt() == 1 {
                panic!("bug in the reconciler");
            }
            Ok(Action::Done)
        });
        let running = Running::start(retrying(&db.worker, reconciler));
        enqueue(&db.store, &["p"]).await;
        assert_eq!(recv(&mut rx).await.1, 1);
        assert_eq!(recv(&mut rx).await.1, 2, "the worker survived and retried");
        running.stop().await;
        let failed = &runs_of(&db, "p").await[0];
        assert_eq!(failed.outcome, RunOutcome::Retry);
        assert!(
            failed
                .error
                .as_deref()
                .unwrap()
                .contains("panicked: bug in the reconciler")
        );
    })
    .await;
}

/// A reconciler that panics before it returns its future (code ahead of a
/// closure's `async move`) fails its run as one that panics inside it does:
/// the key backs off and runs again. The panic once escaped the run's catch
/// and left the key running under the live session, never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_that_panics_before_its_future_fails_its_run_and_the_key_runs_again() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = move |task: Task| {
            assert!(task.attempt() > 1, "bug ahead of the future");
            let tx = tx.clone();
            async move {
                let _ = tx.send((task.key().to_owned(), task.attempt()));
                Ok::<_, BoxError>(Action::Done)
            }
        };
        let running = Running::start(retrying(&db.worker, reconciler));
        enqueue(&db.store, &["p"]).await;
        assert_eq!(
            recv(&mut rx).await,
            ("p".to_owned(), 2),
            "the key ran again"
        );
        running.stop().await;
        let runs = runs_of(&db, "p").await;
        assert_eq!(runs[0].outcome, RunOutcome::Retry);
        assert!(
            runs[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("bug ahead of the future")),
            "{:?}",
            runs[0].error
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_timeout_is_cancelled_and_retried_as_a_transient_failure() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = move |task: Task| {
            let tx = tx.clone();
            async move {
                if task.attempt() == 1 {
                    // Returns only once cancelled, and then says "done":
                    // a result after the timeout is not the run's outcome.
                    let _stopped = OnDrop(Some({
                        let tx = tx.clone();
                        move || tx.send("dropped".to_owned()).unwrap()
                    }));
                    task.cancelled().await;
                    tx.send("cancelled".to_owned()).unwrap();
                } else {
                    tx.send(format!("attempt {}", task.attempt())).unwrap();
                }
                Ok::<_, BoxError>(Action::Done)
            }
        };
        let running = Running::start(retrying(&db.worker, reconciler).timeout(ms(100)));
        enqueue(&db.store, &["t"]).await;
        assert_eq!(recv(&mut rx).await, "cancelled");
        assert_eq!(recv(&mut rx).await, "dropped", "its future is gone");
        assert_eq!(recv(&mut rx).await, "attempt 2");
        running.stop().await;
        let runs = runs_of(&db, "t").await;
        assert_eq!(runs[0].outcome, RunOutcome::Retry);
        let error = runs[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("timed out after 100ms"), "{error}");
        assert_eq!(runs[1].outcome, RunOutcome::Done);
    })
    .await;
}

/// A reconcile stopped past its timeout whose drop panics (a guard's
/// destructor) still fails its run as timed out, and the key runs again. The
/// panic escaped the run when the future was dropped, ending its task with
/// nothing written: the key stayed running under the live session, never run
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_whose_drop_panics_after_its_timeout_fails_its_run_and_the_key_runs_again() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = move |task: Task| {
            let tx = tx.clone();
            async move {
                if task.attempt() == 1 {
                    let _guard = OnDrop(Some(|| panic!("a guard that panics as it drops")));
                    // Deaf to its cancellation: it is dropped where it stands.
                    std::future::pending::<()>().await;
                }
                tx.send(task.attempt()).unwrap();
                Ok::<_, BoxError>(Action::Done)
            }
        };
        let running = Running::start(retrying(&db.worker, reconciler).timeout(ms(100)));
        enqueue(&db.store, &["d"]).await;
        assert_eq!(recv(&mut rx).await, 2, "the key ran again");
        running.stop().await;
        let runs = runs_of(&db, "d").await;
        assert_eq!(runs[0].outcome, RunOutcome::Retry);
        let error = runs[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("timed out after 100ms"), "{error}");
        assert_eq!(runs[1].outcome, RunOutcome::Done);
    })
    .await;
}

/// A reconcile that blocks its thread cannot be cancelled or dropped until it
/// gives the thread back; its key must not run again meanwhile. Judged from
/// what the work itself logs: each run's start and end, by the test's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reconcile_blocking_its_thread_past_its_timeout_never_overlaps_its_next_run() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = move |task: Task| {
            let tx = tx.clone();
            async move {
                let started = std::time::Instant::now();
                if task.attempt() == 1 {
                    std::thread::sleep(ms(700));
                    task.cancelled().await;
                }
                tx.send((task.attempt(), started, std::time::Instant::now()))
                    .unwrap();
                Ok::<_, BoxError>(Action::Done)
            }
        };
        let running = Running::start(retrying(&db.worker, reconciler).timeout(ms(100)));
        enqueue(&db.store, &["b"]).await;
        let (first, _, first_end) = recv(&mut rx).await;
        let (second, second_start, _) = recv(&mut rx).await;
        running.stop().await;
        assert_eq!((first, second), (1, 2));
        assert!(
            second_start >= first_end,
            "the retry started {:?} before the blocked run ended",
            first_end - second_start
        );
        let runs = runs_of(&db, "b").await;
        assert_eq!(runs[0].outcome, RunOutcome::Retry);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_runs_at_the_deadline_and_releases_their_keys() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let running = Running::start(
            controller(&db.worker, stuck(tx))
                .parallelism(3)
                .shutdown_deadline(ms(200)),
        );
        enqueue(&db.store, &["a", "b", "c"]).await;
        for _ in 0..3 {
            recv(&mut rx).await;
        }
        running.stop().await;
        for key in ["a", "b", "c"] {
            assert_pending_unfailed(&db, key).await;
            assert_eq!(events(&db, key, RunOutcome::Canceled).await.len(), 1);
        }

        let (tx, mut rx) = mpsc::unbounded_channel();
        let running = Running::start(controller(&db.worker, reporting(tx, |_| Ok(Action::Done))));
        let mut rerun = Vec::new();
        for _ in 0..3 {
            rerun.push(recv(&mut rx).await.0);
        }
        rerun.sort();
        assert_eq!(
            rerun,
            ["a", "b", "c"],
            "the released keys run on the next start"
        );
        running.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_keys_wait_leased_and_go_back_to_pending_at_shutdown() {
    for prefetch in [0, 2] {
        each_backend(move |db| async move {
            let keys = ["a", "b", "c", "d"];
            let (tx, mut rx) = mpsc::unbounded_channel();
            let running = Running::start(
                controller(&db.worker, stuck(tx))
                    .parallelism(1)
                    .prefetch(prefetch)
                    .shutdown_deadline(ms(200)),
            );
            enqueue(&db.store, &keys).await;
            assert_eq!(recv(&mut rx).await, keys[0], "FIFO: the first key runs");
            // The claim that started it also took `prefetch` more, in order.
            for (n, key) in keys.iter().enumerate() {
                let state = item(&db, key).await.expect("an item").item.state;
                let leased = n <= prefetch;
                let expected = if leased {
                    ItemState::Running
                } else {
                    ItemState::Pending
                };
                assert_eq!(state, expected, "prefetch {prefetch}: {key}");
            }
            running.stop().await;
            for key in keys {
                assert_pending_unfailed(&db, key).await;
            }
            for key in &keys[1..=prefetch] {
                assert_eq!(
                    events(&db, key, RunOutcome::Canceled).await.len(),
                    1,
                    "{key} was released unstarted"
                );
            }
            assert!(rx.try_recv().is_err(), "only the first key ever ran");
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_stops_the_run_and_discards_its_result() {
    each_backend(|db| async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let runs = Arc::new(AtomicU32::new(0));
        let reconciler = move |task: Task| {
            let (tx, runs) = (tx.clone(), Arc::clone(&runs));
            async move {
                tx.send(format!("start {}", task.attempt())).unwrap();
                if runs.fetch_add(1, SeqCst) == 0 {
                    // Reports when the run is stopped (its future dropped).
                    let _stopped = OnDrop(Some(move || tx.send("stopped".to_owned()).unwrap()));
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(Action::Done)
            }
        };
        let running = Running::start(controller(&db.worker, reconciler).ttl(ms(900)));
        enqueue(&db.store, &["m"]).await;
        assert_eq!(recv(&mut rx).await, "start 1");
        // Jump the database clock past the TTL: the next heartbeat is refused.
        db.store.clock().advance(Duration::from_secs(5));
        let mut next = vec![recv(&mut rx).await, recv(&mut rx).await];
        next.sort();
        assert_eq!(
            next,
            ["start 1", "stopped"],
            "stopped, reclaimed and run again (not a failure)"
        );
        running.stop().await;
        assert_eq!(events(&db, "m", RunOutcome::Expired).await.len(), 1);
        assert_eq!(
            events(&db, "m", RunOutcome::Done).await.len(),
            1,
            "only the second run's result counts"
        );
        assert_eq!(
            item(&db, "m").await.map(|d| d.item.state),
            Some(ItemState::Idle)
        );
    })
    .await;
}

/// Runs its closure when dropped.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Runs `sql` on the store's own database.
async fn exec(store: &Store, sql: &str) {
    if let Some(pool) = store.sqlite_pool() {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    } else if let Some(pool) = store.postgres_pool() {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
}

async fn unstarted(store: Store, limit: u32) -> Result<Vec<String>, BoxError> {
    let sql = format!("SELECT id FROM machines WHERE NOT started ORDER BY id LIMIT {limit}");
    let rows: Vec<(String,)> = if let Some(pool) = store.sqlite_pool() {
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await?
    } else {
        let pool = store.postgres_pool().expect("one of the engines");
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await?
    };
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_source_locks_candidates_from_the_users_table_and_backs_off_failures() {
    each_engine(|db| async move {
        exec(
            &db.store,
            "CREATE TABLE machines (id TEXT PRIMARY KEY, started BOOLEAN NOT NULL DEFAULT FALSE)",
        )
        .await;
        exec(
            &db.store,
            "INSERT INTO machines (id) VALUES ('m1'), ('m2'), ('m3'), ('m4')",
        )
        .await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let agent = move |task: Task| {
            let tx = tx.clone();
            async move {
                tx.send((task.key().to_owned(), task.attempt())).unwrap();
                if task.key() == "m3" && task.attempt() == 1 {
                    return Err::<Action, BoxError>("provider timed out".into());
                }
                let sql = format!(
                    "UPDATE machines SET started = TRUE WHERE id = '{}'",
                    task.key()
                );
                exec(task.store().expect("a store backend"), &sql).await;
                Ok(Action::Done)
            }
        };
        let builder = controller(&db.worker, agent)
            .source(Source::query(unstarted))
            .parallelism(2)
            .idle_poll(ms(10))
            .backoff(Backoff::new(ms(200), 2.0, ms(200)).unwrap());
        let running = Running::start(builder);
        let mut runs = Vec::new();
        for _ in 0..5 {
            runs.push(recv(&mut rx).await);
        }
        running.stop().await;
        runs.sort();
        let expected: Vec<(String, u32)> = [("m1", 1), ("m2", 1), ("m3", 1), ("m3", 2), ("m4", 1)]
            .iter()
            .map(|(k, a)| ((*k).to_owned(), *a))
            .collect();
        assert_eq!(
            runs, expected,
            "each machine once, the failed one retried once"
        );
        assert!(unstarted(db.store.clone(), 10).await.unwrap().is_empty());
        let starts: Vec<_> = runs_of(&db, "m3")
            .await
            .iter()
            .map(|r| r.started_at.expect("a start"))
            .collect();
        assert!(
            (starts[1] - starts[0]).to_std().unwrap() >= ms(200),
            "the retry waited out its backoff"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_commit_is_unknown_gives_its_session_up_and_loses_no_key() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let (proxy, store) = support::commit_cut::CommitCut::in_front_of(&base, &db.url).await;
    // The controller's first claim takes all three keys, and its commit is cut.
    enqueue(&db.store, &["a", "b", "c"]).await;
    proxy.arm();
    let (tx, mut rx) = mpsc::unbounded_channel();
    // A TTL far past the test: only closing the session can free what it leased.
    let builder = controller(
        &TestBackend::Store(store.clone()),
        reporting(tx, |_| Ok(Action::Done)),
    )
    .parallelism(3)
    .ttl(Duration::from_secs(600))
    .idle_poll(Duration::from_secs(3600));
    let running = Running::start(builder);
    tokio::time::timeout(Duration::from_secs(20), proxy.cut())
        .await
        .expect("the claim of a, b and c was cut after its commit");
    let mut ran: Vec<String> = Vec::new();
    for _ in 0..3 {
        ran.push(recv(&mut rx).await.0);
    }
    ran.sort_unstable();
    assert_eq!(ran, ["a", "b", "c"]);
    // A graceful stop writes every outcome the runs returned.
    running.stop().await;
    for key in ["a", "b", "c"] {
        let started = runs_of(&db, key).await;
        assert_eq!(
            started.len(),
            2,
            "{key}: leased by the cut claim, then again"
        );
        assert_ne!(started[0].session, started[1].session, "{key}");
        assert_eq!(
            events(&db, key, RunOutcome::Canceled).await.len(),
            1,
            "{key}"
        );
    }
    store.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reports_its_outcomes_and_sessions_as_metrics() {
    each_backend(|db| async move {
        let process = format!("metered_{}_{}", db.engine, db.worker.name());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = reporting(tx, |task| match task.key() {
            "bad" => Err(permanent(std::io::Error::other("no")).into()),
            _ => Ok(Action::Done),
        });
        let builder = Controller::builder(db.worker.clone(), process.clone(), reconciler)
            .poll_rate(ms(1), 1000)
            .idle_poll(ms(20));
        let running = Running::start(builder);
        db.store
            .item_enqueue(ItemEnqueue::new(process.clone(), ["a", "b", "bad"]))
            .await
            .unwrap();
        for _ in 0..3 {
            recv(&mut rx).await;
        }
        running.stop().await;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, drover::metrics::registry()).unwrap();
        let line = |prefix: String| {
            text.lines()
                .find(|l| l.starts_with(&prefix))
                .map(str::to_owned)
        };
        // Through a server, the server counts each outcome it records too, in
        // this same process's registry.
        let counted = if db.worker.name() == "client" { 2 } else { 1 };
        assert_eq!(
            line(format!(
                r#"drover_outcomes_total{{process="{process}",outcome="done"}}"#
            ))
            .as_deref(),
            Some(
                format!(
                    r#"drover_outcomes_total{{process="{process}",outcome="done"}} {}"#,
                    2 * counted
                )
                .as_str()
            )
        );
        assert!(
            line(format!(
                r#"drover_outcomes_total{{process="{process}",outcome="permanent"}} {counted}"#
            ))
            .is_some()
        );
        assert!(
            line(format!(
                r#"workqueue_work_duration_seconds_count{{name="{process}"}} {}"#,
                3 * counted
            ))
            .is_some()
        );
        assert!(line("drover_sessions_active ".to_owned()).is_some());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parallelism_beyond_one_claims_answer_drains_every_key_once() {
    each_backend(|db| async move {
        // 2,000 slots: over HTTP more than one claim answer holds (1,000).
        let keys: Vec<String> = (0..5000).map(|i| format!("k{i:04}")).collect();
        let (tx, mut rx) = mpsc::unbounded_channel();
        // A long TTL: this is about paging claims, and a loaded machine must
        // not lose the session (and re-run keys) meanwhile.
        let running = Running::start(
            controller(&db.worker, reporting(tx, |_| Ok(Action::Done)))
                .parallelism(2000)
                .ttl(Duration::from_secs(60)),
        );
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys.iter().map(String::as_str)))
            .await
            .unwrap();
        let mut seen = Vec::with_capacity(keys.len());
        for _ in 0..keys.len() {
            seen.push(recv(&mut rx).await.0);
        }
        running.stop().await;
        assert!(rx.try_recv().is_err(), "no key ran twice");
        seen.sort();
        assert_eq!(seen, keys);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_error_with_nul_bytes_parks_its_key_with_the_text_cleaned() {
    each_backend(|db| async move {
        // Over HTTP the raw text would not fit the server's 1 MiB body limit:
        // refused on every retry, the key would never park.
        let huge = format!("bad\0{}", "x".repeat(2 << 20));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reconciler = reporting(tx, move |_| {
            Err(permanent(std::io::Error::other(huge.clone())).into())
        });
        let running = Running::start(controller(&db.worker, reconciler));
        enqueue(&db.store, &["poison"]).await;
        recv(&mut rx).await;
        running.stop().await;
        let parked = item(&db, "poison").await.expect("parked item");
        assert_eq!(parked.item.state, ItemState::Parked);
        let error = parked.item.last_error.expect("its error");
        assert!(error.starts_with("bad\u{FFFD}xxx"), "{}", &error[..20]);
        assert!(
            error.len() <= drover::store::MAX_TEXT_BYTES,
            "{}",
            error.len()
        );
    })
    .await;
}

/// A caller's open transaction that enqueued a running key holds back that
/// key's outcome alone (PostgreSQL, directly and through a server): the
/// controller's other runs write their outcomes while the transaction stays
/// open, the held key's outcome is answered "busy" and sent again by its
/// run, and once the caller commits it is written and the key runs once more
/// for the caller's change. Before, the controller's one writer waited for
/// the caller's commit with the held outcome, and every outcome queued
/// behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_open_transaction_holds_back_its_keys_outcome_alone() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    for served in [false, true] {
        let (db, schema) = support::postgres(&base).await;
        let db = if served { db.served() } else { db };
        let (started, mut starts) = mpsc::unbounded_channel();
        let (release, released) = tokio::sync::watch::channel(false);
        let reconciler = move |task: Task| {
            let (started, mut released) = (started.clone(), released.clone());
            async move {
                started
                    .send(task.key().to_owned())
                    .expect("the test listens");
                if task.key() == "held" && task.attempt() == 1 {
                    released.wait_for(|go| *go).await.expect("the test lives");
                }
                Ok::<_, BoxError>(Action::Done)
            }
        };
        enqueue(&db.store, &["held"]).await;
        let running = Running::start(controller(&db.worker, reconciler).parallelism(4));
        assert_eq!(recv(&mut starts).await, "held");
        let mut caller = support::caller_tx::CallerTx::begin(&db.store).await;
        let report = caller.enqueue(ItemEnqueue::new(PROCESS, ["held"])).await;
        assert_eq!(report.expect("the caller's enqueue").dirty, 1);
        release.send(true).expect("the run listens");
        enqueue(&db.store, &["free-1", "free-2"]).await;
        support::process::eventually_within(
            "the other keys' outcomes while the caller's transaction is open",
            Duration::from_secs(3),
            || async {
                let mut written = 0;
                for key in ["free-1", "free-2"] {
                    written += events(&db, key, RunOutcome::Done).await.len();
                }
                written == 2
            },
        )
        .await;
        let held = item(&db, "held").await.expect("held");
        assert_eq!(held.item.state, ItemState::Running, "served: {served}");
        assert!(events(&db, "held", RunOutcome::Done).await.is_empty());
        caller.commit().await;
        support::process::eventually("the held key's two runs written", || async {
            events(&db, "held", RunOutcome::Done).await.len() == 2
        })
        .await;
        running.stop().await;
        let mut seen = Vec::new();
        while let Ok(key) = starts.try_recv() {
            seen.push(key);
        }
        seen.sort();
        assert_eq!(seen, ["free-1", "free-2", "held"], "served: {served}");
        let held = item(&db, "held").await.expect("held");
        assert_eq!(held.item.state, ItemState::Idle, "served: {served}");
        db.store.close().await;
        support::drop_schema(&base, &schema).await;
    }
}
