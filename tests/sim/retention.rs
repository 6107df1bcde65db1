//! Retention in the model store (DESIGN.md rule 10): what a whole pass of
//! `retention_prune` leaves, on the model's database clock. The engines walk
//! a process in small batches with a cursor (`src/store/rules/retention.rs`);
//! a complete pass must come to what one atomic step here does:
//!
//! - every run (history row) that ended before now − `keep_runs_for` is gone;
//! - of each key's runs only the newest `keep_runs_per_key` (at least 1)
//!   are kept. The process's own rows (pause and resume, under the key
//!   `""`, which no item can have) are no key's runs: only the period
//!   removes them (the engines' walks over the keys start after `""`);
//! - with `forget_idle_after` set, every idle key whose last run ended (or,
//!   with none, which was enqueued) before now − that period is forgotten,
//!   as by a delete but without a history row; its runs stay. A pending,
//!   running (dirty or not) or parked key is never forgotten.
//!
//! Which old runs a batch deletes first is the engine's choice (PostgreSQL
//! takes any, SQLite the oldest), so only a whole pass is compared.

use std::time::Duration;

use drover::store::Retention;

use crate::log::What;
use crate::model::{Model, State};

/// What a pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pruned {
    /// Runs deleted: too old, or beyond the per-key cap.
    pub runs: u64,
    /// Idle keys forgotten.
    pub items: u64,
}

/// The instant `period` before `now`, if the clock has run that long (the
/// model's clock starts at 0, where nothing can be older than a period).
fn before(now: Duration, period: Duration) -> Option<Duration> {
    now.checked_sub(period)
}

impl Model {
    /// Sets how long runs and idle keys are kept.
    pub(crate) fn set_retention(&mut self, retention: Retention) {
        self.retention = retention;
    }

    /// One whole retention pass, atomically.
    pub(crate) fn retention_prune(&mut self) -> Pruned {
        let now = self.now();
        let rules = self.retention;
        let before_runs = self.history.len();
        if let Some(cut) = before(now, rules.keep_runs_for) {
            self.history.retain(|row| row.at >= cut);
        }
        // Newest first, so each key's first `keep` rows are the ones kept.
        let keep = rules.keep_runs_per_key.max(1) as usize;
        let mut seen = std::collections::HashMap::<String, usize>::new();
        let mut kept: Vec<bool> = self
            .history
            .iter()
            .rev()
            .map(|row| {
                if row.key.is_empty() {
                    return true;
                }
                let n = seen.entry(row.key.clone()).or_default();
                *n += 1;
                *n <= keep
            })
            .collect();
        kept.reverse();
        let mut kept = kept.into_iter();
        self.history.retain(|_| kept.next().expect("one per row"));
        let runs = (before_runs - self.history.len()) as u64;
        let mut forgot = Vec::new();
        if let Some(cut) = rules.forget_idle_after.and_then(|p| before(now, p)) {
            self.items.retain(|key, item| {
                let touched = item.last_ended_at.unwrap_or(item.enqueued_at);
                let forget = item.state == State::Idle && touched < cut;
                if forget {
                    forgot.push(key.clone());
                }
                !forget
            });
        }
        let items = forgot.len() as u64;
        if runs > 0 || items > 0 {
            self.log.push(What::Prune { runs, forgot });
        }
        Pruned { runs, items }
    }
}
