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
        let stop = CancellationToken::new();
        let started = Instant::now();
        let handle = tokio::spawn({
            let stop = stop.clone();
            async move { controller.run(stop).await.expect("runs") }
        });
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
        let pause = |paused| ProcessPause {
            process: PROCESS.into(),
            paused,
            actor: "test".into(),
        };
        db.store.process_pause(pause(true)).await.expect("pause");
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, ["a", "b"]))
            .await
            .expect("enqueue");
        let ran = Arc::new(AtomicU32::new(0));
        let controller = counting(&db, &ran, Duration::from_millis(200));
        let stop = CancellationToken::new();
        let handle = tokio::spawn({
            let stop = stop.clone();
            async move { controller.run(stop).await.expect("runs") }
        });
        // Several idle polls of a paused process: nothing may run.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(ran.load(SeqCst), 0, "a paused process ran a key");
        db.store.process_pause(pause(false)).await.expect("resume");
        eventually_within("both keys ran", Duration::from_secs(30), || async {
            ran.load(SeqCst) == 2
        })
        .await;
        stop.cancel();
        handle.await.expect("join");
    })
    .await;
}

/// (pending, running) of [`PROCESS`].
async fn pending_running(store: &drover::store::Store) -> (u64, u64) {
    let all = store.process_counts_all().await.expect("counts");
    all.iter()
        .find(|c| c.process == PROCESS)
        .map_or((0, 0), |c| (c.pending, c.running))
}

/// A worker with one slot and three keys claimed ahead (`prefetch`) is
/// paused while its first run goes on: once that run ends, none of the keys
/// it claimed ahead starts (they were claimed more than an idle poll before),
/// and they are handed back, pending again. Before, the worker started them
/// one after the other without a claim, so without seeing the pause, for as
/// long as the runs ahead of them lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_reaches_the_keys_a_worker_claimed_ahead() {
    each_backend(|db| async move {
        const KEYS: usize = 10;
        let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
        db.store
            .item_enqueue(ItemEnqueue::new(PROCESS, keys))
            .await
            .expect("enqueue");
        let started = Arc::new(AtomicU32::new(0));
        let first_may_end = Arc::new(tokio::sync::Notify::new());
        let controller = {
            let (started, first_may_end) = (Arc::clone(&started), Arc::clone(&first_may_end));
            Controller::builder(db.worker.clone(), PROCESS, move |_: Task| {
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
        let stop = CancellationToken::new();
        let handle = tokio::spawn({
            let stop = stop.clone();
            async move { controller.run(stop).await.expect("runs") }
        });
        eventually_within("the first run started", Duration::from_secs(30), || async {
            started.load(SeqCst) == 1
        })
        .await;
        let pause = |paused| ProcessPause {
            process: PROCESS.into(),
            paused,
            actor: "test".into(),
        };
        db.store.process_pause(pause(true)).await.expect("pause");
        // The keys claimed ahead are older than an idle poll by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        first_may_end.notify_one();
        eventually_within(
            "the keys claimed ahead are handed back",
            Duration::from_secs(30),
            || async { pending_running(&db.store).await == ((KEYS - 1) as u64, 0) },
        )
        .await;
        // Several idle polls more: nothing else may start.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            started.load(SeqCst),
            1,
            "a run started after the pause returned"
        );
        db.store.process_pause(pause(false)).await.expect("resume");
        eventually_within("every key ran", Duration::from_secs(30), || async {
            started.load(SeqCst) == KEYS as u32
        })
        .await;
        stop.cancel();
        handle.await.expect("join");
    })
    .await;
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
        let stop = CancellationToken::new();
        let handle = tokio::spawn({
            let stop = stop.clone();
            async move { controller.run(stop).await.expect("runs") }
        });
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
