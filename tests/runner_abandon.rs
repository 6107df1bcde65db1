//! A session the runner gives up (a claim whose commit is unknown: it may
//! have leased keys nobody here heard of) hands its keys back only once its
//! runs have stopped, so no key runs twice at once; judged from what the runs
//! themselves log, on both engines.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{
    Claimed, LeaseClaim, LeaseComplete, LeaseRelease, ProcessConfigure, ReclaimReport, RemoteError,
    Session, SessionClose, SessionHeartbeat, SessionStart, Store, StoreError, WorkerBackend,
};
use support::each_engine;
use support::store::{P, enqueue};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The store, except that the claim after [`arm`](Self::arm) is answered
/// with an unknown outcome after it committed (its answer lost, as a cut
/// link or a timed-out long-poll loses it).
#[derive(Debug, Clone)]
struct AnswerLost {
    inner: Store,
    armed: Arc<AtomicBool>,
}

impl AnswerLost {
    fn arm(&self) {
        self.armed.store(true, SeqCst);
    }
}

impl WorkerBackend for AnswerLost {
    const RECLAIMS: bool = true;

    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        WorkerBackend::session_start(&self.inner, params).await
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        WorkerBackend::session_heartbeat(&self.inner, params).await
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        WorkerBackend::session_close(&self.inner, params).await
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        WorkerBackend::session_reclaim(&self.inner).await
    }

    async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> Result<Claimed, StoreError> {
        let claimed = WorkerBackend::lease_claim_wait(&self.inner, params, wait).await?;
        if !claimed.leases.is_empty() && self.armed.swap(false, SeqCst) {
            return Err(StoreError::Remote(RemoteError {
                message: "the claim's answer was lost".into(),
                status: None,
                unknown: true,
            }));
        }
        Ok(claimed)
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        WorkerBackend::lease_complete_batch(&self.inner, batch).await
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        WorkerBackend::lease_release(&self.inner, params).await
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        WorkerBackend::process_configure(&self.inner, params).await
    }

    fn subscribe(&self, process: &str) -> Option<Arc<Notify>> {
        WorkerBackend::subscribe(&self.inner, process)
    }

    fn local_store(&self) -> Option<&Store> {
        WorkerBackend::local_store(&self.inner)
    }
}

/// One run as it logged itself: its key, when it began and when it ended.
type Logged = (String, Instant, Instant);

/// A run going on: logs itself when dropped, at its end.
struct Ran {
    key: String,
    began: Instant,
    log: Arc<Mutex<Vec<Logged>>>,
}

impl Drop for Ran {
    fn drop(&mut self) {
        let ended = Instant::now();
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.push((std::mem::take(&mut self.key), self.began, ended));
    }
}

/// `slow`'s first run holds on until it is cancelled, then takes 80 ms to
/// stop (a command being killed: within the runner's grace to return). A
/// claim's lost answer makes the controller give its session up while that
/// run stops. Closed at once, the session handed `slow` back, and a claim
/// started it again beside its first run; now the close waits for the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_given_up_hands_its_keys_back_only_once_its_runs_have_stopped() {
    each_engine(|db| async move {
        let backend = AnswerLost {
            inner: db.store.clone(),
            armed: Arc::new(AtomicBool::new(false)),
        };
        let log: Arc<Mutex<Vec<Logged>>> = Arc::default();
        let (began, mut begun) = mpsc::unbounded_channel::<String>();
        let slow_runs = Arc::new(AtomicU32::new(0));
        let reconciler = {
            let log = Arc::clone(&log);
            move |task: Task| {
                let (log, began, slow_runs) =
                    (Arc::clone(&log), began.clone(), Arc::clone(&slow_runs));
                async move {
                    let key = task.key().to_owned();
                    // Logged when the run ends, however: returned, or dropped
                    // past its grace on a slow machine.
                    let _ran = Ran {
                        key: key.clone(),
                        began: Instant::now(),
                        log,
                    };
                    let _ = began.send(key.clone());
                    if key == "slow" && slow_runs.fetch_add(1, SeqCst) == 0 {
                        task.cancelled().await;
                        tokio::time::sleep(Duration::from_millis(80)).await;
                    }
                    Ok::<_, BoxError>(Action::Done)
                }
            }
        };
        let controller = Controller::builder(backend.clone(), P, reconciler)
            .parallelism(4)
            .poll_rate(Duration::from_millis(1), 1000)
            .idle_poll(Duration::from_millis(20))
            .ttl(Duration::from_secs(10))
            .build()
            .expect("a controller");
        let stop = CancellationToken::new();
        let running = tokio::spawn(controller.run(stop.clone()));
        enqueue(&db.store, &["slow"]).await;
        assert_eq!(begun.recv().await.as_deref(), Some("slow"));
        backend.arm();
        enqueue(&db.store, &["other"]).await;
        // slow runs again (its first run was cancelled with the session), and
        // other, whose lease the lost answer held, runs under the new session.
        let mut seen = Vec::new();
        while !(seen.iter().any(|k| k == "other")
            && seen.iter().filter(|k| *k == "slow").count() >= 1)
        {
            let key = tokio::time::timeout(Duration::from_secs(30), begun.recv())
                .await
                .expect("the keys run again under a new session")
                .expect("the reconciler lives");
            seen.push(key);
        }
        stop.cancel();
        running
            .await
            .expect("the controller's task")
            .expect("the controller stops");
        let log = log.lock().unwrap().clone();
        let mut slow: Vec<&Logged> = log.iter().filter(|(k, ..)| k == "slow").collect();
        slow.sort_by_key(|(_, began, _)| *began);
        assert_eq!(slow.len(), 2, "slow ran twice: {log:?}");
        let (first, second) = (slow[0], slow[1]);
        assert!(
            first.2 <= second.1,
            "slow's second run began {:?} before its first ended",
            first.2 - second.1
        );
    })
    .await;
}
