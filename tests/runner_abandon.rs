//! A session the runner gives up (a claim whose commit is unknown: it may
//! have leased keys nobody here heard of) hands its keys back only once its
//! runs have stopped, so no key runs twice at once; judged from what the runs
//! themselves log, on both engines.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{Claimed, RemoteError, Store, StoreError};
use support::claim_hook::{Hooked, OnClaim};
use support::each_engine;
use support::store::{P, enqueue};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The store, except that the claim after [`LoseNext::arm`] is answered
/// with an unknown outcome after it committed (its answer lost, as a cut
/// link or a timed-out long-poll loses it).
type AnswerLost = Hooked<Store, LoseNext>;

/// Loses the answer of the first claim with keys once armed.
#[derive(Debug, Clone, Default)]
struct LoseNext(Arc<AtomicBool>);

impl LoseNext {
    fn arm(&self) {
        self.0.store(true, SeqCst);
    }
}

impl OnClaim for LoseNext {
    fn on_claim(
        &self,
        _asked: u32,
        claimed: Result<Claimed, StoreError>,
    ) -> Result<Claimed, StoreError> {
        if claimed.as_ref().is_ok_and(|c| !c.leases.is_empty()) && self.0.swap(false, SeqCst) {
            return Err(StoreError::Remote(RemoteError {
                message: "the claim's answer was lost".into(),
                status: None,
                unknown: true,
            }));
        }
        claimed
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
            hook: LoseNext::default(),
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
        backend.hook.arm();
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
