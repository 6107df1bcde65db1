//! Wake-ups: an idle controller hears of new work without polling, on the
//! database and through a server that never polls while a claim waits
//! ([`support::each_backend_unpolled`]). Each test works on a process name of
//! its own, so no neighbour's enqueue can wake it, and makes its change only
//! once the controller waits ([`Watched::waiting_since`]), so no claim already
//! on its way can find it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use drover::runner::{Action, BoxError, Controller, Reconciler, Task};
use drover::store::{
    ItemEnqueue, ItemGet, ItemState, LeaseClaim, LeaseRelease, RunList, RunOutcome, SessionClose,
    SessionStart, Store, StoreEngine as _,
};
use support::each_backend_unpolled;
use support::wakeups::Watched;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// An hour: no poll comes to the rescue within a test.
const NEVER: Duration = Duration::from_secs(3600);

/// A controller of `process` on `backend` that polls once an hour. Two runs
/// at a time: while one key runs, the controller asks for more and waits.
fn start<R: Reconciler>(
    backend: &Watched,
    process: &str,
    reconciler: R,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let controller = Controller::builder(backend.clone(), process, reconciler)
        .poll_rate(Duration::from_millis(1), 1000)
        .parallelism(2)
        .idle_poll(NEVER)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid settings");
    support::running::spawn(controller)
}

async fn stop(running: (CancellationToken, tokio::task::JoinHandle<()>)) {
    running.0.cancel();
    tokio::time::timeout(Duration::from_secs(20), running.1)
        .await
        .expect("shutdown within 20 s")
        .expect("controller task");
}

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what} within 20 s (the poll is an hour away)"))
        .expect("sender alive")
}

async fn enqueue(store: &Store, process: &str, key: &str) {
    store
        .item_enqueue(ItemEnqueue::new(process, [key]))
        .await
        .expect("enqueue");
}

/// A reconciler that reports each run's key and ends it done; the run of
/// `warm` first waits for a permit of `hold`. Holding one of two slots keeps
/// the controller from claiming again when a run ends: what it waits for
/// then can only come from a wake-up.
fn reporting(tx: mpsc::UnboundedSender<String>, hold: &Arc<Semaphore>) -> impl Reconciler {
    let hold = Arc::clone(hold);
    move |task: Task| {
        let (tx, hold) = (tx.clone(), Arc::clone(&hold));
        async move {
            let _ = tx.send(task.key().to_owned());
            if task.key() == "warm" {
                hold.acquire().await.expect("never closed").forget();
            }
            Ok::<_, BoxError>(Action::Done)
        }
    }
}

/// A controller of a process of its own, idle: its first key, `warm`, holds
/// one of its two slots until [`stop`](Self::stop), and it has claimed again
/// and found nothing, so what it runs next can only come from a wake-up.
struct Idle {
    worker: Watched,
    ran: mpsc::UnboundedReceiver<String>,
    hold: Arc<Semaphore>,
    running: (CancellationToken, tokio::task::JoinHandle<()>),
}

impl Idle {
    async fn start(db: &support::TestDb, process: &str) -> Self {
        let worker = Watched::new(&db.worker);
        let (tx, mut ran) = mpsc::unbounded_channel();
        let hold = Arc::new(Semaphore::new(0));
        let running = start(&worker, process, reporting(tx, &hold));
        let mark = worker.mark();
        enqueue(&db.store, process, "warm").await;
        assert_eq!(recv(&mut ran, "the first key ran").await, "warm");
        worker.waiting_since(mark).await;
        Self {
            worker,
            ran,
            hold,
            running,
        }
    }

    /// The key of the next run (`what` names what should start it).
    async fn next(&mut self, what: &str) -> String {
        recv(&mut self.ran, what).await
    }

    async fn stop(self) {
        self.hold.add_permits(1);
        stop(self.running).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_controller_wakes_on_an_enqueue_without_polling() {
    each_backend_unpolled(|db| async move {
        let process = support::process_name("woken");
        let mut idle = Idle::start(&db, &process).await;
        enqueue(&db.store, &process, "later").await;
        assert_eq!(
            idle.next("woken by the enqueue").await,
            "later",
            "woken, not polled"
        );
        idle.stop().await;
    })
    .await;
}

/// A key another worker gives back (it released the lease shutting down, or
/// its session was closed) is pending and ready at once: an idle controller
/// hears of it as of an enqueue, not at its poll an hour away. Neither woke
/// anyone before, on either engine, directly or through a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_controller_wakes_when_another_worker_gives_keys_back() {
    each_backend_unpolled(|db| async move {
        let process = support::process_name("given");
        enqueue(&db.store, &process, "released").await;
        enqueue(&db.store, &process, "closed").await;
        let other = db
            .store
            .session_start(SessionStart::new("other", Duration::from_secs(600)))
            .await
            .expect("another worker's session")
            .id;
        let leases = db
            .store
            .lease_claim(LeaseClaim {
                session: other,
                process: process.clone(),
                max: 2,
                trace_links: false,
            })
            .await
            .expect("the other worker's claim")
            .leases;
        assert_eq!(leases.len(), 2);
        let mut idle = Idle::start(&db, &process).await;
        let mark = idle.worker.mark();
        let released = leases.iter().find(|l| l.key == "released").expect("leased");
        db.store
            .lease_release(LeaseRelease { lease: released })
            .await
            .expect("the release");
        assert_eq!(idle.next("woken by the release").await, "released");
        idle.worker.waiting_since(mark).await;
        db.store
            .session_close(SessionClose { session: other })
            .await
            .expect("the close");
        assert_eq!(idle.next("woken by the close").await, "closed");
        idle.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_enqueues_during_a_run_gives_exactly_one_more_run() {
    each_backend_unpolled(|db| async move {
        let process = support::process_name("burst");
        let worker = Watched::new(&db.worker);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let reconciler = {
            let gate = Arc::clone(&gate);
            move |task: Task| {
                let (tx, gate) = (tx.clone(), Arc::clone(&gate));
                async move {
                    tx.send(task.key().to_owned()).unwrap();
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, BoxError>(Action::Done)
                }
            }
        };
        let running = start(&worker, &process, reconciler);
        let mark = worker.mark();
        enqueue(&db.store, &process, "a").await;
        assert_eq!(recv(&mut rx, "the first run").await, "a");
        for _ in 0..100 {
            enqueue(&db.store, &process, "a").await;
        }
        // The controller waits for more work while "a" runs: only the
        // completion's wake-up can hand it the re-run.
        worker.waiting_since(mark).await;
        gate.add_permits(1);
        assert_eq!(
            recv(&mut rx, "the completion woke the claim loop").await,
            "a",
            "the enqueues during the run give one more run"
        );
        gate.add_permits(1);
        stop(running).await;
        assert!(rx.try_recv().is_err(), "not one run per enqueue");
        let a = db
            .store
            .item_get(ItemGet {
                process: process.clone(),
                key: "a".into(),
                runs_limit: 0,
            })
            .await
            .expect("item_get")
            .expect("a stays known");
        assert_eq!(a.item.state, ItemState::Idle, "nothing left pending");
        assert_eq!(a.item.enqueue_count, 101, "every enqueue counted");
        let runs = db
            .store
            .run_list(RunList {
                process: Some(process.clone()),
                key: Some("a".into()),
                limit: 10,
                ..RunList::default()
            })
            .await
            .expect("run_list");
        let outcomes: Vec<_> = runs.iter().map(|r| r.outcome).collect();
        assert_eq!(outcomes, [RunOutcome::Done, RunOutcome::Done]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_controller_hears_an_enqueue_from_another_process_through_listen() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let process = support::process_name("listen");
    let mut idle = Idle::start(&db, &process).await;
    // Another OS process: only LISTEN/NOTIFY can tell this one about it.
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["enqueue", &process, "from-elsewhere", "--db", &db.url])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    assert_eq!(
        idle.next("woken by NOTIFY").await,
        "from-elsewhere",
        "woken by NOTIFY, not by the hourly poll"
    );
    idle.stop().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}
