//! The worker seam over the model, with the world's faults: each call may fail
//! before it reaches the store, commit and then lose its answer
//! (`CommitUnknown`), hang on a frozen link until it times out, or arrive and
//! answer late. A crashed worker's calls never answer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use drover::store::{
    Claimed, DriverError, LeaseClaim, LeaseComplete, LeaseRelease, ProcessConfigure, ReclaimReport,
    Session, SessionClose, SessionHeartbeat, SessionStart, StoreError, WorkerBackend,
};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::log::{Log, What};
use crate::model::Model;
use crate::rng::Rng;

/// What the world shares with every worker's backend and reconciler.
#[derive(Debug)]
pub(crate) struct Shared {
    pub log: Log,
    pub model: Mutex<Model>,
    pub rng: Mutex<Rng>,
    /// Chance that a call meets a fault, while the world is not quiet.
    pub fault_rate: f64,
    /// Set when faults stop, for the convergence phase.
    pub quiet: AtomicBool,
    /// Each worker's failing link, if its link is failing.
    pub cuts: Mutex<BTreeMap<u32, Cut>>,
    /// Until when each worker's writes to items fail while the rest of its
    /// calls pass: rows locked by a transaction that does not end, a statement
    /// timeout on the items table. What a run does with an outcome it cannot
    /// write for longer than a TTL, while its session stays alive, is decided
    /// only here (the hand-back of `Run::hand_back`).
    pub write_outages: Mutex<BTreeMap<u32, Instant>>,
}

/// A worker's link failing in two steps, as links do: first its answers are
/// held up (requests still arrive) until `slow_until`, then nothing gets
/// through either way until `down_until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cut {
    pub slow_until: Instant,
    pub down_until: Instant,
}

impl Shared {
    pub(crate) fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn rng(&self) -> MutexGuard<'_, Rng> {
        self.rng.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `worker`'s link failure going on now, if any.
    fn cut(&self, worker: u32) -> Option<Cut> {
        let cuts = self.cuts.lock().unwrap_or_else(PoisonError::into_inner);
        cuts.get(&worker)
            .copied()
            .filter(|cut| Instant::now() < cut.down_until)
    }

    /// Whether `worker`'s writes to items fail now.
    fn writes_fail(&self, worker: u32) -> bool {
        let outages = self
            .write_outages
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        outages
            .get(&worker)
            .is_some_and(|until| Instant::now() < *until)
    }

    pub(crate) fn quiet(&self) -> bool {
        self.quiet.load(Ordering::SeqCst)
    }
}

/// What happens to one call.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Reaches the store after `before`, answers after `after`.
    Arrives { before: Duration, after: Duration },
    /// The link fails before the request reaches the store.
    Fails,
    /// Applied, then the connection breaks before the answer.
    CommitUnknown,
    /// The link freezes; after this long the caller's driver gives up.
    Hangs(Duration),
    /// A write to items waits on a lock and gives up (a write outage).
    Busy,
}

/// The calls that write to items, which a write outage fails.
const WRITES: [&str; 2] = ["lease_complete_batch", "lease_release"];

/// One worker's handle on the store.
#[derive(Clone)]
pub(crate) struct SimBackend {
    pub worker: u32,
    pub shared: Arc<Shared>,
    /// Cancelled when this worker crashes: its calls then never answer.
    pub death: CancellationToken,
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimBackend(worker {})", self.worker)
    }
}

fn link_error(what: &str) -> DriverError {
    DriverError(sqlx::Error::Io(std::io::Error::other(format!(
        "sim: {what}"
    ))))
}

impl SimBackend {
    fn fault(&self, call: &'static str) -> Fault {
        let mut rng = self.shared.rng();
        let normal = Fault::Arrives {
            before: rng.ms(0, 3),
            after: rng.ms(0, 3),
        };
        if self.shared.quiet() || !rng.chance(self.shared.fault_rate) {
            return normal;
        }
        let fault = match rng.below(4) {
            0 => Fault::Fails,
            1 => Fault::CommitUnknown,
            2 => Fault::Hangs(rng.ms(50, 4_000)),
            _ => Fault::Arrives {
                before: rng.ms(0, 1_500),
                after: rng.ms(0, 1_500),
            },
        };
        drop(rng);
        self.shared.log.push(What::Fault {
            worker: self.worker,
            call,
            fault: format!("{fault:?}"),
        });
        fault
    }

    /// Runs `apply` on the model as the fault drawn for this call allows.
    async fn call<T>(
        &self,
        name: &'static str,
        apply: impl FnOnce(&mut Model) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let fault = if WRITES.contains(&name) && self.shared.writes_fail(self.worker) {
            Fault::Busy
        } else {
            self.fault(name)
        };
        let shared = &self.shared;
        let cut = shared.cut(self.worker);
        let reach = async move {
            if let Some(cut) = cut {
                if Instant::now() < cut.slow_until {
                    let result = apply(&mut shared.model());
                    sleep_until(cut.slow_until).await;
                    return result;
                }
                sleep_until(cut.down_until).await;
                return Err(StoreError::Unavailable(link_error("link cut")));
            }
            match fault {
                Fault::Arrives { before, after } => {
                    sleep(before).await;
                    let result = apply(&mut shared.model());
                    sleep(after).await;
                    result
                }
                Fault::Fails => {
                    sleep(Duration::from_millis(1)).await;
                    Err(StoreError::Unavailable(link_error("link down")))
                }
                Fault::CommitUnknown => {
                    sleep(Duration::from_millis(1)).await;
                    let _ = apply(&mut shared.model());
                    sleep(Duration::from_millis(1)).await;
                    Err(StoreError::CommitUnknown(link_error("lost at COMMIT")))
                }
                Fault::Hangs(d) => {
                    sleep(d).await;
                    Err(StoreError::Unavailable(link_error("link frozen")))
                }
                Fault::Busy => {
                    sleep(Duration::from_millis(50)).await;
                    Err(StoreError::Busy(link_error("items locked")))
                }
            }
        };
        tokio::select! {
            biased;
            () = self.death.cancelled() => std::future::pending().await,
            result = reach => {
                if self.death.is_cancelled() {
                    std::future::pending::<()>().await;
                }
                result
            }
        }
    }
}

impl WorkerBackend for SimBackend {
    const RECLAIMS: bool = true;

    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        let worker = self.worker;
        self.call("session_start", |m| Ok(m.session_start(worker, params.ttl)))
            .await
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.call("session_heartbeat", |m| {
            m.session_heartbeat(params.session.0)
        })
        .await
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        self.call("session_close", |m| Ok(m.session_close(params.session.0)))
            .await
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        self.call("session_reclaim", |m| Ok(m.session_reclaim()))
            .await
    }

    async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        _wait: Duration,
    ) -> Result<Claimed, StoreError> {
        // The model wakes subscribers itself, so the controller never asks
        // this backend to wait.
        let worker = self.worker;
        self.call("lease_claim", |m| {
            m.lease_claim(worker, params.session.0, params.max)
        })
        .await
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        self.call("lease_complete_batch", |m| {
            Ok(m.lease_complete_batch(batch.iter().map(|c| (c.lease, c.outcome))))
        })
        .await
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        self.call("lease_release", |m| m.lease_release(params.lease))
            .await
    }

    async fn process_configure(&self, _params: ProcessConfigure) -> Result<(), StoreError> {
        Ok(())
    }

    fn subscribe(&self, _process: &str) -> Option<Arc<Notify>> {
        Some(Arc::clone(&self.shared.model().wake))
    }
}
