//! A process's settings: what [`process_configure`](super::StoreEngine::process_configure)
//! changes and what [`process_list`](super::StoreEngine::process_list) reads
//! back, side by side (as `fleet.rs` keeps the fleet controls' change and
//! value), so a new per-process setting is a field in each here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::fleet::{FleetLimits, LimitChanges};
use crate::backoff::Backoff;

/// Parameters of [`process_configure`](super::StoreEngine::process_configure):
/// the settings to change; those left `None` keep their stored value (or the
/// default, for a new process).
#[derive(Debug, Clone, Default)]
pub struct ProcessConfigure {
    /// The process; created if unknown.
    pub process: String,
    /// Its backoff after failures (default 1 s, ×2, 360 s).
    pub backoff: Option<Backoff>,
    /// Keep runs this long (default 7 days).
    pub keep_runs_for: Option<Duration>,
    /// Keep at most this many runs per key (default 100; at least 1).
    pub keep_runs_per_key: Option<u32>,
    /// Forget idle keys untouched this long: `Some(None)` = never (the default).
    pub forget_idle_after: Option<Option<Duration>>,
    /// Resync every idle key this long after its last run ended: `Some(None)`
    /// = never (the default). At least one second.
    pub resync_every: Option<Option<Duration>>,
    /// The resync's jitter, a fraction in `[0, 1]` (default 0.1): each key
    /// comes back between `every` and `every × (1 + jitter)`.
    pub resync_jitter: Option<f64>,
    /// The priority resynced keys are pending at (default −100, below
    /// every enqueue's default 0).
    pub resync_priority: Option<i32>,
    /// Its fleet controls' limits (concurrency, rate); pause is
    /// [`process_pause`](super::StoreEngine::process_pause).
    pub limits: LimitChanges,
}

impl ProcessConfigure {
    /// Changes nothing yet (but creates the process if unknown).
    #[must_use]
    pub fn new(process: impl Into<String>) -> Self {
        Self {
            process: process.into(),
            ..Self::default()
        }
    }

    /// Sets the backoff policy.
    #[must_use]
    pub fn backoff(self, backoff: Backoff) -> Self {
        Self {
            backoff: Some(backoff),
            ..self
        }
    }

    /// Sets how long runs are kept.
    #[must_use]
    pub fn keep_runs_for(self, period: Duration) -> Self {
        Self {
            keep_runs_for: Some(period),
            ..self
        }
    }

    /// Sets how many runs are kept per key.
    #[must_use]
    pub fn keep_runs_per_key(self, runs: u32) -> Self {
        Self {
            keep_runs_per_key: Some(runs),
            ..self
        }
    }

    /// Sets after how long untouched idle keys are forgotten (`None`: never).
    #[must_use]
    pub fn forget_idle_after(self, period: Option<Duration>) -> Self {
        Self {
            forget_idle_after: Some(period),
            ..self
        }
    }

    /// Sets how long after its last run an idle key is resynced (`None`:
    /// never).
    #[must_use]
    pub fn resync_every(self, every: Option<Duration>) -> Self {
        Self {
            resync_every: Some(every),
            ..self
        }
    }

    /// Sets the resync's jitter (a fraction in `[0, 1]`).
    #[must_use]
    pub fn resync_jitter(self, jitter: f64) -> Self {
        Self {
            resync_jitter: Some(jitter),
            ..self
        }
    }

    /// Sets the priority resynced keys are pending at.
    #[must_use]
    pub fn resync_priority(self, priority: i32) -> Self {
        Self {
            resync_priority: Some(priority),
            ..self
        }
    }

    /// Sets the cluster-wide concurrency limit (`None`: no limit).
    #[must_use]
    pub fn concurrency(mut self, limit: Option<u32>) -> Self {
        self.limits.concurrency = Some(limit);
        self
    }

    /// Sets the cluster-wide rate limit in runs per second (`None`: no limit).
    #[must_use]
    pub fn rate(mut self, per_second: Option<f64>) -> Self {
        self.limits.rate = Some(per_second);
        self
    }

    /// Sets the rate limit's burst.
    #[must_use]
    pub fn burst(mut self, burst: u32) -> Self {
        self.limits.burst = Some(burst);
        self
    }
}

/// How long a process keeps its history and its idle keys. Stored per process
/// in the database, so every node prunes by the same rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Retention {
    /// Runs older than this are deleted (default 7 days).
    pub keep_runs_for: Duration,
    /// At most this many runs are kept per key, the newest (default 100).
    /// The process's own history rows (paused, resumed: they name no key)
    /// are not capped; only [`keep_runs_for`](Self::keep_runs_for) removes
    /// them.
    pub keep_runs_per_key: u32,
    /// Idle keys untouched (no run ended, no enqueue) for this long are
    /// forgotten, as by a delete; `None` (the default) keeps them forever.
    pub forget_idle_after: Option<Duration>,
}

impl Retention {
    /// The default period runs are kept: 7 days.
    pub const KEEP_RUNS_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
    /// The default number of runs kept per key: 100.
    pub const KEEP_RUNS_PER_KEY: u32 = 100;
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            keep_runs_for: Self::KEEP_RUNS_FOR,
            keep_runs_per_key: Self::KEEP_RUNS_PER_KEY,
            forget_idle_after: None,
        }
    }
}

/// A process's stored settings, as every node reads them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSettings {
    /// The process.
    pub process: String,
    /// Its backoff after failures.
    #[serde(skip)]
    pub backoff: Backoff,
    /// How long its history and idle keys are kept.
    pub retention: Retention,
    /// Its fleet controls: pause, concurrency and rate limits.
    pub limits: FleetLimits,
    /// How its idle keys are looked at again; `None`: never.
    pub resync: Option<Resync>,
    /// When the next resync pass is due (the earliest time an idle key it
    /// knows of comes back); `None` without resync or before the first pass.
    pub next_resync: Option<DateTime<Utc>>,
}

/// A process's resync: every idle (converged) key becomes pending again, at a
/// low priority, between `every` and `every × (1 + jitter)` after its last
/// run ended, as an informer's resync re-adds every known object. Parked,
/// backing-off, pending and running keys are never touched.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Resync {
    /// How long after its last run an idle key is looked at again.
    pub every: Duration,
    /// The fraction of `every` over which keys spread (by a hash of the key).
    pub jitter: f64,
    /// The priority resynced keys are pending at.
    pub priority: i32,
}
