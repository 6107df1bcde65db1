//! [`Pacing`]: what the [`Pruner`] and the [`Resyncer`] share — how often they
//! tick, how much one batch and one tick may do, and what follows each batch
//! of a tick ([`Share`]). Both walk each process a small batch at a time on a
//! jittered timer, so they pace themselves alike; only what a batch does
//! differs.
//!
//! [`Pruner`]: super::Pruner
//! [`Resyncer`]: super::Resyncer

use std::time::Duration;

use super::ticks::Ticks;
use crate::store::{ProcessSettings, StoreEngine, StoreError};

/// The pause between two batches, so writers waiting for the database (a
/// claim, a completion, another process on the same SQLite file) go first.
const BETWEEN_BATCHES: Duration = Duration::from_millis(5);

/// The shortest interval between ticks.
const MIN_EVERY: Duration = Duration::from_millis(10);

/// How a maintenance service paces itself: a tick every `every` (jittered),
/// batches of about `batch` rows, at most `budget` batches per process per
/// tick.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pacing {
    /// The interval between ticks.
    every: Duration,
    /// About how many rows one batch reads.
    pub(super) batch: u32,
    /// The most batches one process gets per tick.
    budget: u32,
}

/// What follows a batch of one process's walk within a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Another batch, after the pause.
    Again,
    /// None: the batch said the walk is complete.
    Done,
    /// None this tick: the budget is spent, or the batch failed (logged);
    /// the walk goes on at the next tick.
    Later,
}

/// One process's share of a tick: how many more batches its walk may run.
#[derive(Debug)]
pub(super) struct Share {
    left: u32,
}

impl Share {
    /// Takes in one batch's outcome (`true`: the walk is complete) and says
    /// what follows. After a batch that left work it pauses, so writers
    /// waiting for the database go first; a failure is logged as `what`
    /// failing and tried again next tick.
    pub(super) async fn after(
        &mut self,
        outcome: Result<bool, StoreError>,
        (what, process): (&str, &str),
    ) -> Step {
        self.left = self.left.saturating_sub(1);
        match outcome {
            Ok(true) => Step::Done,
            Ok(false) => {
                tokio::time::sleep(BETWEEN_BATCHES).await;
                if self.left == 0 {
                    Step::Later
                } else {
                    Step::Again
                }
            }
            Err(e) => {
                tracing::warn!(%process, error = %e, "{what} failed; trying again next tick");
                Step::Later
            }
        }
    }
}

impl Pacing {
    /// Ticks every `every`, batches of `batch`, `budget` batches per process
    /// per tick: a service's defaults.
    pub(super) const fn new(every: Duration, batch: u32, budget: u32) -> Self {
        Self {
            every,
            batch,
            budget,
        }
    }

    /// With ticks every `every` (at least 10 ms).
    pub(super) fn every(self, every: Duration) -> Self {
        Self {
            every: every.max(MIN_EVERY),
            ..self
        }
    }

    /// With batches of `batch` (at least 1).
    pub(super) fn batch(self, batch: u32) -> Self {
        Self {
            batch: batch.max(1),
            ..self
        }
    }

    /// With at most `budget` batches per process per tick (at least 1).
    pub(super) fn budget(self, budget: u32) -> Self {
        Self {
            budget: budget.max(1),
            ..self
        }
    }

    /// The interval between ticks.
    pub(super) const fn interval(&self) -> Duration {
        self.every
    }

    /// The timer of the service's ticks.
    pub(super) fn ticks(&self) -> Ticks {
        Ticks::new(self.every)
    }

    /// A process's share of this tick: the budget's batches.
    pub(super) fn share(&self) -> Share {
        Share { left: self.budget }
    }

    /// Pauses between two batches of a pass run to its end at once (see
    /// [`Share::after`] for a tick's).
    pub(super) async fn pause() {
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}

/// Every process with its settings, for one tick to walk; `None` (logged as
/// not being able to `verb`) when the store cannot list them, and the tick
/// is skipped.
pub(super) async fn processes(
    store: &impl StoreEngine,
    verb: &str,
) -> Option<Vec<ProcessSettings>> {
    match store.process_list().await {
        Ok(processes) => Some(processes),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list processes to {verb}; trying again next tick");
            None
        }
    }
}
