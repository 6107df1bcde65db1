//! [`Pruner`]: retention that runs. Every interval it walks every process and
//! applies the process's [`Retention`](crate::store::Retention) a small batch at a
//! time, so it never holds the database long and claims go on meanwhile.

use std::collections::HashMap;
use std::time::Duration;

use rand::RngExt as _;
use tokio_util::sync::CancellationToken;

use super::pacing::{Pacing, Step, processes};
use crate::metrics::PruneMetrics;
use crate::store::Store;
use crate::store::StoreEngine;
use crate::store::StoreError;
use crate::store::{PruneCursor, PruneReport};
use crate::store::{PruneTurn, RetentionPrune};

/// The shortest time a pruner holds a process's turn ([`Pruner::run`]
/// renews it at every tick): two intervals, but at least this, so a pruner
/// on a short interval whose tick comes late (a busy machine, a slow
/// database) keeps its turn instead of handing it to another pruner, which
/// would then walk the same history.
const MIN_HOLD: Duration = Duration::from_secs(10);

/// What retention removed from one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// History runs deleted: older than the process keeps them, or beyond its
    /// per-key cap.
    pub runs: u64,
    /// Idle keys forgotten after going untouched for the process's period.
    pub idle_keys: u64,
}

impl Pruned {
    fn add(&mut self, report: &PruneReport) {
        self.runs += report.runs;
        self.idle_keys += report.items;
    }
}

/// Applies every process's retention in the background: every interval
/// (jittered ±10 %, so nodes started together spread out) it lists the
/// processes and runs [`retention_prune`](StoreEngine::retention_prune)
/// batches for each, going on while there is more to do up to a budget of
/// batches per process per tick; a process with more left goes on from
/// where it stopped at the next tick. It pauses between batches, so a claim
/// never waits behind more than one short transaction.
///
/// Each removal is counted in [`PruneMetrics`]. Errors are logged and the
/// work is tried again at the next tick; nothing a database does stops the
/// pruner, only its [`CancellationToken`]. Any number of pruners may share a
/// database (every `drover serve` and every controller on a [`Store`] runs
/// one): at each tick a pruner first takes or renews each process's turn
/// ([`prune_turn`](StoreEngine::prune_turn), held for two intervals and at
/// least 10 s) and leaves alone the processes whose turn another pruner
/// holds, so a fleet walks each process's history once per interval, not
/// once per node. A pruner that stops (its node gone) loses its turns that
/// long after its last tick, and the next pruner to tick takes them over.
///
/// ```no_run
/// use std::time::Duration;
/// use drover::runner::Pruner;
/// use drover::store::Store;
/// use tokio_util::sync::CancellationToken;
///
/// # async fn run() -> Result<(), drover::store::StoreError> {
/// let store = Store::connect("sqlite://drover.db").await?;
/// let stop = CancellationToken::new();
/// let pruner = tokio::spawn(Pruner::new(store).every(Duration::from_secs(30)).run(stop.clone()));
/// // … until shutdown:
/// stop.cancel();
/// pruner.await.ok();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Pruner<S = Store> {
    store: S,
    pacing: Pacing,
    metrics: PruneMetrics,
    /// Who this pruner is when it asks for a process's turn: drawn at
    /// random when [`run`](Self::run) starts, so two clones of one pruner,
    /// each run, are two holders and never walk one process side by side.
    holder: i64,
}

impl<S: StoreEngine> Pruner<S> {
    /// The default interval between ticks: 60 s.
    pub const EVERY: Duration = Duration::from_secs(60);
    /// The default batch size: 500 rows looked at per step.
    pub const BATCH: u32 = 500;
    /// The default budget: 20 batches per process per tick.
    pub const BUDGET: u32 = 20;

    /// A pruner over `store` with the defaults: every 60 s, batches of 500,
    /// at most 20 batches per process per tick, counted in the process-wide
    /// [`PruneMetrics`].
    #[must_use]
    pub fn new(store: S) -> Self {
        Self {
            store,
            pacing: Pacing::new(Self::EVERY, Self::BATCH, Self::BUDGET),
            metrics: PruneMetrics::global(),
            holder: 0,
        }
    }

    /// The interval between ticks (default 60 s, at least 10 ms). Shorter
    /// keeps the history closer to its limits at the cost of more small
    /// transactions on an idle database.
    #[must_use]
    pub fn every(self, every: Duration) -> Self {
        Self {
            pacing: self.pacing.every(every),
            ..self
        }
    }

    /// About how many rows one batch looks at (default 500, at least 1).
    /// Larger batches prune faster and hold each transaction longer.
    #[must_use]
    pub fn batch(self, batch: u32) -> Self {
        Self {
            pacing: self.pacing.batch(batch),
            ..self
        }
    }

    /// The most batches one process gets per tick (default 20, at least 1):
    /// with the batch size, how much one tick may delete per process. A
    /// history growing faster than that falls behind.
    #[must_use]
    pub fn budget(self, budget: u32) -> Self {
        Self {
            pacing: self.pacing.budget(budget),
            ..self
        }
    }

    /// Where removals are counted (default: the process-wide
    /// [`registry`](crate::metrics::registry)).
    #[must_use]
    pub fn metrics(self, metrics: PruneMetrics) -> Self {
        Self { metrics, ..self }
    }

    /// Prunes every process on a timer until `stop` fires. The first tick comes
    /// after a random part of the interval.
    ///
    /// A tick in flight when `stop` fires is dropped where it stands (its
    /// batch rolls back, and the next node's tick does it again), so a
    /// database that does not answer never holds shutdown up.
    pub async fn run(mut self, stop: CancellationToken) {
        self.holder = rand::rng().random();
        let mut passes = HashMap::new();
        let mut ticks = self.pacing.ticks();
        while ticks.next(&stop).await {
            let tick = self.tick(&mut passes, &stop);
            if stop.run_until_cancelled(tick).await.is_none() {
                return;
            }
        }
    }

    /// Runs one complete pass over `process` now, however many batches it
    /// takes (what `drover history prune` does), and returns what it removed.
    pub async fn prune_process(&self, process: &str) -> Result<Pruned, StoreError> {
        let mut pass = Pass::default();
        let mut total = Pruned::default();
        while !self.batch_of(process, &mut pass, &mut total).await? {
            Pacing::pause().await;
        }
        Ok(total)
    }

    /// One tick: each process's pass goes on from where the last tick left
    /// it, for up to the budget.
    async fn tick(&self, passes: &mut HashMap<String, Pass>, stop: &CancellationToken) {
        let Some(processes) = processes(&self.store, "prune").await else {
            return;
        };
        let mut next = HashMap::with_capacity(processes.len());
        for settings in processes {
            let process = settings.process;
            if !self.has_turn(&process).await {
                continue;
            }
            let mut pass = passes.remove(&process).unwrap_or_default();
            let mut total = Pruned::default();
            let mut share = self.pacing.share();
            loop {
                if stop.is_cancelled() {
                    return;
                }
                let outcome = self.batch_of(&process, &mut pass, &mut total).await;
                match share.after(outcome, ("retention", &process)).await {
                    Step::Again => {}
                    Step::Done => {
                        pass = Pass::default();
                        break;
                    }
                    Step::Later => break,
                }
            }
            if total != Pruned::default() {
                tracing::info!(%process, runs = total.runs, idle_keys = total.idle_keys, "pruned history");
            }
            next.insert(process, pass);
        }
        *passes = next;
    }

    /// Whether this pruner holds `process`'s turn for this tick (taken or
    /// renewed now). A failure to ask is logged and counts as no: the turn
    /// is asked for again at the next tick.
    async fn has_turn(&self, process: &str) -> bool {
        let turn = PruneTurn {
            process: process.to_owned(),
            holder: self.holder,
            hold: self.pacing.interval().saturating_mul(2).max(MIN_HOLD),
        };
        match self.store.prune_turn(turn).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(%process, error = %e, "cannot take the turn to prune; trying again next tick");
                false
            }
        }
    }

    /// Runs one batch of `pass`, counting what it removed; `true` when the
    /// pass is complete.
    async fn batch_of(
        &self,
        process: &str,
        pass: &mut Pass,
        total: &mut Pruned,
    ) -> Result<bool, StoreError> {
        let report = self
            .store
            .retention_prune(RetentionPrune {
                process: process.to_owned(),
                cursor: pass.cursor.clone(),
                batch: self.pacing.batch,
            })
            .await?;
        self.metrics.count(report.runs, report.items);
        total.add(&report);
        Ok(pass.advance(report))
    }
}

/// Where a pass over one process stands, between batches and between ticks.
#[derive(Debug, Default)]
struct Pass {
    cursor: PruneCursor,
}

impl Pass {
    /// Takes in one batch's report; `true` when the pass is complete (the
    /// store's cursor then starts the next pass from the beginning).
    fn advance(&mut self, report: PruneReport) -> bool {
        self.cursor = report.cursor;
        report.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(runs: u64, runs_key: Option<&str>, done: bool) -> PruneReport {
        PruneReport {
            runs,
            items: 0,
            cursor: PruneCursor {
                runs_key: runs_key.map(str::to_owned),
                ..PruneCursor::default()
            },
            done,
        }
    }

    #[test]
    fn a_pass_ends_when_the_store_says_done() {
        let mut pass = Pass::default();
        assert!(pass.advance(report(7, None, true)));
    }

    #[test]
    fn a_pass_goes_on_from_the_cursor_until_done() {
        let mut pass = Pass::default();
        assert!(!pass.advance(report(0, Some("k"), false)));
        assert_eq!(pass.cursor.runs_key.as_deref(), Some("k"));
        assert!(!pass.advance(report(0, Some("m"), false)));
        assert_eq!(pass.cursor.runs_key.as_deref(), Some("m"));
    }
}
