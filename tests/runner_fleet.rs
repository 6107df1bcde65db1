//! The runner under fleet controls, on both engines and through a server: a
//! worker held back by the rate limit waits for the next token, not for its
//! idle poll, and hears a limit removed within a poll; a paused process is
//! resumed within a poll, and its keys claimed ahead do not start.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{ItemEnqueue, ProcessConfigure, ProcessPause, StoreEngine as _};
use support::process::eventually_within;
use support::{each_backend, each_backend_unpolled};
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "paced";

/// Runs `controller` on a task of its own until the token is cancelled;
/// join the handle after.
fn spawn_run<R, B>(controller: Controller<R, B>) -> (CancellationToken, tokio::task::JoinHandle<()>)
where
    R: drover::runner::Reconciler,
    B: drover::store::WorkerBackend,
{
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move { controller.run(stop).await.expect("runs") }
    });
    (stop, handle)
}

/// Pauses (`true`) or resumes `process`, as the test.
fn pause(process: &str, paused: bool) -> ProcessPause {
    ProcessPause {
        process: process.into(),
        paused,
        actor: "test".into(),
    }
}

/// A controller whose runs count themselves in `ran`, polling when idle
/// every `idle_poll`.
fn counting(
    db: &support::TestDb,
    ran: &Arc<AtomicU32>,
    idle_poll: Duration,
) -> Controller<impl drover::runner::Reconciler, support::backend::TestBackend> {
    let count = Arc::clone(ran);
    Controller::builder(db.worker.clone(), PROCESS, move |_: Task| {
        let count = Arc::clone(&count);
        async move {
            count.fetch_add(1, SeqCst);
            Ok::<_, BoxError>(Action::Done)
        }
    })
    .parallelism(8)
    .idle_poll(idle_poll)
    .build()
    .expect("controller")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_worker_claims_at_each_token_not_at_its_idle_poll() {
    each_backend_unpolled(|db| async move {
        const KEYS: u32 = 20;
        let configure = ProcessConfigure::new(PROCESS).rate(Some(20.0)).burst(1);
        db.store.process_configure(configure).await.expect("limit");
        let keys = (0..KEYS).map(|i| format!("k{i}"));
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .expect("enqueue");
        let ran = Arc::new(AtomicU32::new(0));
        // An idle poll far longer than the whole run: only the token hint
        // can make the worker claim again in time.
        let controller = counting(&db, &ran, Duration::from_secs(60));
        let started = Instant::now();
        let (stop, handle) = spawn_run(controller);
        eventually_within("every key ran", Duration::from_secs(30), || async {
            ran.load(SeqCst) == KEYS
        })
        .await;
        let took = started.elapsed();
        stop.cancel();
        handle.await.expect("join");
        // 19 tokens after the first at 20/s: about 0.95 s; an idle poll
        // would have taken a minute per claim.
        assert!(
            took >= Duration::from_millis(900),
            "faster than the rate: {took:?}"
        );
        assert!(
            took < Duration::from_secs(20),
            "waited for polls, not tokens: {took:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_process_runs_nothing_and_a_resume_wakes_its_worker() {
    each_backend(|db| async move {
        db.store
            .process_pause(pause(PROCESS, true))
            .await
            .expect("pause");
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["a", "b"]))
            .await
            .expect("enqueue");
        let ran = Arc::new(AtomicU32::new(0));
        let controller = counting(&db, &ran, Duration::from_millis(200));
        let (stop, handle) = spawn_run(controller);
        // Several idle polls of a paused process: nothing may run.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(ran.load(SeqCst), 0, "a paused process ran a key");
        db.store
            .process_pause(pause(PROCESS, false))
            .await
            .expect("resume");
        eventually_within("both keys ran", Duration::from_secs(30), || async {
            ran.load(SeqCst) == 2
        })
        .await;
        stop.cancel();
        handle.await.expect("join");
    })
    .await;
}

/// (pending, running) of `process`.
async fn pending_running(store: &drover::store::Store, process: &str) -> (u64, u64) {
    let all = store.process_counts_all().await.expect("counts");
    all.iter()
        .find(|c| c.process == process)
        .map_or((0, 0), |c| (c.pending, c.running))
}

/// A worker with one slot and three keys claimed ahead (`prefetch`) is
/// paused while its first run goes on: once that run ends, none of the keys
/// it claimed ahead starts (they were claimed more than an idle poll before),
/// and they are handed back, pending again. Before, the worker started them
/// one after the other without a claim, so without seeing the pause, for as
/// long as the runs ahead of them lasted. With 4 keys nothing else is
/// pending, so the claim that answers "paused" finds nothing to take (on
/// SQLite its quick path said nothing of the pause until it read it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_reaches_the_keys_a_worker_claimed_ahead() {
    each_backend(|db| async move {
        claimed_ahead_then_paused(&db, "ahead", 10).await;
        claimed_ahead_then_paused(&db, "ahead_all", 4).await;
    })
    .await;
}

async fn claimed_ahead_then_paused(db: &support::TestDb, process: &'static str, n: usize) {
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    db.store
        .item_enqueue(ItemEnqueue::new(process, keys))
        .await
        .expect("enqueue");
    let started = Arc::new(AtomicU32::new(0));
    let first_may_end = Arc::new(tokio::sync::Notify::new());
    let controller = {
        let (started, first_may_end) = (Arc::clone(&started), Arc::clone(&first_may_end));
        Controller::builder(db.worker.clone(), process, move |_: Task| {
            let (started, first_may_end) = (Arc::clone(&started), Arc::clone(&first_may_end));
            async move {
                if started.fetch_add(1, SeqCst) == 0 {
                    first_may_end.notified().await;
                }
                Ok::<_, BoxError>(Action::Done)
            }
        })
        .parallelism(1)
        .prefetch(3)
        .idle_poll(Duration::from_millis(100))
        .build()
        .expect("controller")
    };
    let (stop, handle) = spawn_run(controller);
    eventually_within("the first run started", Duration::from_secs(30), || async {
        started.load(SeqCst) == 1
    })
    .await;
    db.store
        .process_pause(pause(process, true))
        .await
        .expect("pause");
    // The keys claimed ahead are older than an idle poll by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first_may_end.notify_one();
    let left = (n as u64 - 1, 0);
    eventually_within(
        "the keys claimed ahead are handed back",
        Duration::from_secs(30),
        || async { pending_running(&db.store, process).await == left },
    )
    .await;
    // Several idle polls more: nothing else may start.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        started.load(SeqCst),
        1,
        "{process}: a run started after the pause returned"
    );
    db.store
        .process_pause(pause(process, false))
        .await
        .expect("resume");
    eventually_within("every key ran", Duration::from_secs(30), || async {
        started.load(SeqCst) == n as u32
    })
    .await;
    stop.cancel();
    handle.await.expect("join");
}

/// A worker held back by a rate limit of 2 an hour (its next token half an
/// hour away) runs the rest of its keys within a few idle polls of the limit
/// being removed. Before, it slept until that token, whatever changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_rate_limit_reaches_a_worker_waiting_for_its_next_token() {
    each_backend(|db| async move {
        let limited = ProcessConfigure::new(PROCESS)
            .rate(Some(2.0 / 3600.0))
            .burst(1);
        db.store.process_configure(limited).await.expect("limit");
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["a", "b", "c"]))
            .await
            .expect("enqueue");
        let ran = Arc::new(AtomicU32::new(0));
        let controller = counting(&db, &ran, Duration::from_millis(100));
        let (stop, handle) = spawn_run(controller);
        eventually_within("the burst's one run", Duration::from_secs(30), || async {
            ran.load(SeqCst) == 1
        })
        .await;
        let unlimited = ProcessConfigure::new(PROCESS).rate(None);
        db.store
            .process_configure(unlimited)
            .await
            .expect("no limit");
        eventually_within("the other keys ran", Duration::from_secs(20), || async {
            ran.load(SeqCst) == 3
        })
        .await;
        stop.cancel();
        handle.await.expect("join");
    })
    .await;
}

/// A backend whose lease releases, while `lost` is set, reach the store but
/// lose their answer (as an HTTP worker's request that timed out after the
/// server applied it).
#[derive(Clone, Debug)]
struct LostAnswers {
    store: drover::store::Store,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

impl drover::store::WorkerBackend for LostAnswers {
    const RECLAIMS: bool = true;

    async fn session_start(
        &self,
        params: drover::store::SessionStart,
    ) -> Result<drover::store::Session, drover::store::StoreError> {
        drover::store::WorkerBackend::session_start(&self.store, params).await
    }
    async fn session_heartbeat(
        &self,
        params: drover::store::SessionHeartbeat,
    ) -> Result<chrono::DateTime<chrono::Utc>, drover::store::StoreError> {
        drover::store::WorkerBackend::session_heartbeat(&self.store, params).await
    }
    async fn session_close(
        &self,
        params: drover::store::SessionClose,
    ) -> Result<u64, drover::store::StoreError> {
        drover::store::WorkerBackend::session_close(&self.store, params).await
    }
    async fn session_reclaim(
        &self,
    ) -> Result<drover::store::ReclaimReport, drover::store::StoreError> {
        drover::store::WorkerBackend::session_reclaim(&self.store).await
    }
    async fn lease_claim_wait(
        &self,
        params: drover::store::LeaseClaim,
        wait: Duration,
    ) -> Result<drover::store::Claimed, drover::store::StoreError> {
        drover::store::WorkerBackend::lease_claim_wait(&self.store, params, wait).await
    }
    async fn lease_complete_batch(
        &self,
        batch: &[drover::store::LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), drover::store::StoreError>>, drover::store::StoreError> {
        drover::store::WorkerBackend::lease_complete_batch(&self.store, batch).await
    }
    async fn lease_release(
        &self,
        params: drover::store::LeaseRelease<'_>,
    ) -> Result<(), drover::store::StoreError> {
        let released = drover::store::WorkerBackend::lease_release(&self.store, params).await;
        if self.lost.load(SeqCst) {
            return Err(drover::store::StoreError::Remote(
                drover::store::RemoteError {
                    message: "the answer was lost".into(),
                    status: None,
                    unknown: true,
                },
            ));
        }
        released
    }
    async fn process_configure(
        &self,
        params: ProcessConfigure,
    ) -> Result<(), drover::store::StoreError> {
        drover::store::WorkerBackend::process_configure(&self.store, params).await
    }
}

/// Keys claimed ahead of a paused process are handed back; when a hand-back's
/// answer is lost (it went through), the lease is handed back again and
/// never started. Before, it was kept to start after the resume: its key ran
/// without a lease, beside its run under the lease the next claim took.
/// Judged from the store as each run begins: its lease is the item's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_hand_back_was_not_answered_never_starts_without_its_lease() {
    support::each_engine(|db| async move {
        let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .expect("enqueue");
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let backend = LostAnswers {
            store: db.store.clone(),
            lost: Arc::clone(&lost),
        };
        let unleased = Arc::new(std::sync::Mutex::new(Vec::new()));
        let started = Arc::new(AtomicU32::new(0));
        let (first_end, first_end_rx) = tokio::sync::watch::channel(false);
        let controller = {
            let (store, unleased, started) = (
                db.store.clone(),
                Arc::clone(&unleased),
                Arc::clone(&started),
            );
            Controller::builder(backend, PROCESS, move |task: Task| {
                let (store, unleased, started) =
                    (store.clone(), Arc::clone(&unleased), Arc::clone(&started));
                let mut first_end = first_end_rx.clone();
                async move {
                    let n = started.fetch_add(1, SeqCst);
                    let get = drover::store::ItemGet {
                        process: PROCESS.into(),
                        key: task.key().to_owned(),
                        runs_limit: 0,
                    };
                    let item = store.item_get(get).await.expect("get").expect("known");
                    if item.item.lease_token != Some(task.fencing_token()) {
                        unleased.lock().expect("log").push(task.key().to_owned());
                    }
                    if n < 2 {
                        let _ = first_end.wait_for(|end| *end).await;
                    }
                    Ok::<_, BoxError>(Action::Done)
                }
            })
            .parallelism(2)
            .prefetch(1)
            .idle_poll(Duration::from_millis(100))
            .build()
            .expect("controller")
        };
        let (stop, handle) = spawn_run(controller);
        eventually_within("two runs going", Duration::from_secs(30), || async {
            started.load(SeqCst) == 2
        })
        .await;
        db.store
            .process_pause(pause(PROCESS, true))
            .await
            .expect("pause");
        lost.store(true, SeqCst);
        // The key claimed ahead is older than an idle poll by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        first_end.send(true).expect("let the runs end");
        eventually_within(
            "the key claimed ahead handed back",
            Duration::from_secs(30),
            || async { pending_running(&db.store, PROCESS).await == (4, 0) },
        )
        .await;
        // Resumed while hand-backs still lose their answers: the lease whose
        // hand-back went through unanswered must not start.
        db.store
            .process_pause(pause(PROCESS, false))
            .await
            .expect("resume");
        eventually_within("every key ran", Duration::from_secs(30), || async {
            pending_running(&db.store, PROCESS).await == (0, 0)
        })
        .await;
        lost.store(false, SeqCst);
        stop.cancel();
        handle.await.expect("join");
        let unleased = unleased.lock().expect("log").clone();
        assert!(
            unleased.is_empty(),
            "runs without their lease: {unleased:?}"
        );
    })
    .await;
}

/// A query source's worker locks its candidates ahead (`prefetch`) and is
/// paused while its first run goes on: the key it locked ahead does not
/// start. Its claims are locks, and a lock refused for the pause, or no lock
/// at all, said nothing of it before; now an empty claim reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_reaches_a_key_a_query_source_locked_ahead() {
    support::each_engine(|db| async move {
        let started = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (first_end, first_end_rx) = tokio::sync::watch::channel(false);
        let controller = {
            let started = Arc::clone(&started);
            Controller::builder(db.store.clone(), PROCESS, move |task: Task| {
                let started = Arc::clone(&started);
                let mut first_end = first_end_rx.clone();
                async move {
                    started.lock().expect("log").push(task.key().to_owned());
                    if task.key() == "k0" {
                        let _ = first_end.wait_for(|end| *end).await;
                    }
                    Ok::<_, BoxError>(Action::Done)
                }
            })
            .source(drover::runner::Source::query(|_store, _limit| async {
                Ok(vec!["k0".to_owned(), "k1".to_owned(), "k2".to_owned()])
            }))
            .parallelism(1)
            .prefetch(1)
            .idle_poll(Duration::from_millis(100))
            .build()
            .expect("controller")
        };
        let (stop, handle) = spawn_run(controller);
        eventually_within("k0 running", Duration::from_secs(30), || async {
            started.lock().expect("log").len() == 1
        })
        .await;
        db.store
            .process_pause(pause(PROCESS, true))
            .await
            .expect("pause");
        // The key locked ahead is older than an idle poll by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        first_end.send(true).expect("let k0 end");
        eventually_within("k1 handed back", Duration::from_secs(30), || async {
            pending_running(&db.store, PROCESS).await.1 == 0
        })
        .await;
        // Several idle polls more: nothing else may start.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.cancel();
        handle.await.expect("join");
        let seen = started.lock().expect("log").clone();
        assert_eq!(seen, ["k0"], "a key locked ahead started while paused");
    })
    .await;
}
