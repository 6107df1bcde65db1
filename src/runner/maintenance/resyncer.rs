//! [`Resyncer`]: resync that runs. On a timer it gives every process with a
//! [`Resync`](crate::store::Resync) a few batches of its walk, so each idle key is
//! looked at again about once per interval without any transaction holding
//! more than one small window of keys.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::pacing::{Pacing, Step, processes};
use crate::metrics::ResyncMetrics;
use crate::store::ResyncBatch;
use crate::store::ResyncReport;
use crate::store::Store;
use crate::store::StoreEngine;
use crate::store::StoreError;

/// Resyncs every process that asks for it, in the background: every tick
/// (default 10 s, jittered ±10 %) it lists the processes and, for each with a
/// resync interval, runs [`resync_batch`](StoreEngine::resync_batch) batches
/// while a pass is under way or due, up to a budget per process per tick; a
/// longer walk goes on at the next tick. Passes are decided in the database,
/// on its clock: the walk is shared by every node (each batch takes the
/// walk's row, or skips the process when another node holds it), and a new
/// pass starts only when the earliest idle key it knows of is due. So any
/// number of resyncers may share a database: they share one walk.
///
/// Each key made pending is counted in [`ResyncMetrics`]. Errors are logged
/// and tried again at the next tick; only the [`CancellationToken`] stops it.
///
/// ```no_run
/// use drover::runner::Resyncer;
/// use drover::store::Store;
/// use tokio_util::sync::CancellationToken;
///
/// # async fn run() -> Result<(), drover::store::StoreError> {
/// let store = Store::connect("sqlite://drover.db").await?;
/// let stop = CancellationToken::new();
/// let resyncer = tokio::spawn(Resyncer::new(store).run(stop.clone()));
/// // … until shutdown:
/// stop.cancel();
/// resyncer.await.ok();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Resyncer<S = Store> {
    store: S,
    pacing: Pacing,
    metrics: ResyncMetrics,
}

impl<S: StoreEngine> Resyncer<S> {
    /// The default interval between ticks: 10 s.
    pub const EVERY: Duration = Duration::from_secs(10);
    /// The default batch: 1,000 keys read per transaction.
    pub const BATCH: u32 = 1_000;
    /// The default budget: 100 batches per process per tick.
    pub const BUDGET: u32 = 100;

    /// A resyncer over `store` with the defaults: every 10 s, batches of
    /// 1,000 keys, at most 100 batches per process per tick, counted in the
    /// process-wide [`ResyncMetrics`].
    #[must_use]
    pub fn new(store: S) -> Self {
        Self {
            store,
            pacing: Pacing::new(Self::EVERY, Self::BATCH, Self::BUDGET),
            metrics: ResyncMetrics::global(),
        }
    }

    /// The interval between ticks (default 10 s, at least 10 ms): how late
    /// after it is due a pass may start, at worst. Shorter costs one small
    /// transaction per resyncing process per tick.
    #[must_use]
    pub fn every(self, every: Duration) -> Self {
        Self {
            pacing: self.pacing.every(every),
            ..self
        }
    }

    /// How many keys one batch reads (default 1,000, at least 1). Larger
    /// batches walk faster and hold each transaction longer.
    #[must_use]
    pub fn batch(self, batch: u32) -> Self {
        Self {
            pacing: self.pacing.batch(batch),
            ..self
        }
    }

    /// The most batches one process gets per tick (default 100, at least 1).
    #[must_use]
    pub fn budget(self, budget: u32) -> Self {
        Self {
            pacing: self.pacing.budget(budget),
            ..self
        }
    }

    /// Where resynced keys are counted (default: the process-wide
    /// [`registry`](crate::metrics::registry)).
    #[must_use]
    pub fn metrics(self, metrics: ResyncMetrics) -> Self {
        Self { metrics, ..self }
    }

    /// Resyncs on a timer until `stop` fires. The first tick comes after a
    /// random part of the interval.
    ///
    /// A tick in flight when `stop` fires is dropped where it stands (its
    /// batch rolls back; the walk goes on from its stored place), so a
    /// database that does not answer never holds shutdown up.
    pub async fn run(self, stop: CancellationToken) {
        let mut ticks = self.pacing.ticks();
        while ticks.next(&stop).await {
            if stop.run_until_cancelled(self.tick(&stop)).await.is_none() {
                return;
            }
        }
    }

    /// Runs one complete pass over `process` now, due or not (a pass under
    /// way is finished instead), and returns how many keys it resynced.
    pub async fn resync_process(&self, process: &str) -> Result<u64, StoreError> {
        let mut total = 0;
        let mut start = true;
        loop {
            let report = self.batch_of(process, start).await?;
            total += report.resynced;
            if report.done {
                return Ok(total);
            }
            start = false;
            Pacing::pause().await;
        }
    }

    /// One tick: each resyncing process's walk goes on for up to the budget.
    async fn tick(&self, stop: &CancellationToken) {
        let Some(processes) = processes(&self.store, "resync").await else {
            return;
        };
        for settings in processes.into_iter().filter(|s| s.resync.is_some()) {
            let process = settings.process;
            let mut total = 0;
            let mut share = self.pacing.share();
            let mut step = Step::Again;
            while step == Step::Again {
                if stop.is_cancelled() {
                    return;
                }
                let outcome = self.batch_of(&process, false).await.map(|report| {
                    total += report.resynced;
                    report.done
                });
                step = share.after(outcome, ("resync", &process)).await;
            }
            if total > 0 {
                tracing::info!(%process, keys = total, "resynced idle keys");
            }
        }
    }

    /// Runs one batch of `process`'s walk, counting what it resynced.
    async fn batch_of(&self, process: &str, start: bool) -> Result<ResyncReport, StoreError> {
        let report = self
            .store
            .resync_batch(ResyncBatch {
                process: process.to_owned(),
                batch: self.pacing.batch,
                start,
            })
            .await?;
        self.metrics.count(process, report.resynced);
        Ok(report)
    }
}
