//! The store's families: what the database holds, set at scrape time by the
//! server from what it read there (so every node reports the shared truth), and
//! the connection pool's gauges, which a server registers in its own registry; and what this process's
//! retention removed ([`PruneMetrics`]), in the process-wide registry.

#[cfg(feature = "server")]
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
#[cfg(feature = "server")]
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[cfg(feature = "server")]
use super::QueueMetrics;
#[cfg(feature = "server")]
use std::time::Duration;

#[cfg(feature = "server")]
type TwoLabels = [(&'static str, String); 2];
type OneLabel = [(&'static str, String); 1];

/// `drover_history_pruned_total{what}`: the history runs (`what="runs"`) and
/// idle keys (`what="idle_keys"`) that retention in this process removed, by
/// a [`Pruner`](crate::runner::Pruner) or `drover history prune`.
///
/// Every node prunes the same database, so each counts only its own share;
/// sum over nodes for the total. Register once per registry; clones share the
/// counters. Pruners report to [`registry`](super::registry) unless given other
/// metrics.
#[derive(Debug, Clone)]
pub struct PruneMetrics {
    pruned: Family<OneLabel, Counter>,
}

impl PruneMetrics {
    /// Registers the family in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let pruned = Family::<OneLabel, Counter>::default();
        registry.register(
            "drover_history_pruned",
            "History runs and idle keys removed by retention in this process, by what (runs, idle_keys)",
            pruned.clone(),
        );
        Self { pruned }
    }

    /// The process-wide family, in [`registry`](super::registry).
    #[must_use]
    pub fn global() -> Self {
        super::pruned().clone()
    }

    /// Counts what one retention batch removed.
    pub(crate) fn count(&self, runs: u64, idle_keys: u64) {
        for (what, n) in [("runs", runs), ("idle_keys", idle_keys)] {
            // Created even at 0, so the series exists from the first prune.
            self.pruned
                .get_or_create(&[("what", what.to_owned())])
                .inc_by(n);
        }
    }
}

/// `drover_resync_enqueued_total{process}`: the idle keys this process's
/// [`Resyncer`](crate::runner::Resyncer) made pending again. Every node walks
/// its share of the shared resync walk, so sum over nodes for the total.
/// Register once per registry; clones share the counters.
#[derive(Debug, Clone)]
pub struct ResyncMetrics {
    enqueued: Family<OneLabel, Counter>,
}

impl ResyncMetrics {
    /// Registers the family in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let enqueued = Family::<OneLabel, Counter>::default();
        registry.register(
            "drover_resync_enqueued",
            "Idle keys made pending again by resync in this process, by process",
            enqueued.clone(),
        );
        Self { enqueued }
    }

    /// The process-wide family, in [`registry`](super::registry).
    #[must_use]
    pub fn global() -> Self {
        super::resynced().clone()
    }

    /// Counts the keys one resync batch made pending.
    pub(crate) fn count(&self, process: &str, keys: u64) {
        self.enqueued
            .get_or_create(&[("process", process.to_owned())])
            .inc_by(keys);
    }
}

/// Item counts per process and state, the oldest ready item's age, whether
/// each process is paused, and the pool's connections.
#[cfg(feature = "server")]
#[derive(Debug)]
pub(crate) struct StoreFamilies {
    pool: Family<OneLabel, Gauge>,
    pool_max: Gauge,
    items: Family<TwoLabels, Gauge>,
    oldest: Family<OneLabel, Gauge<f64, AtomicU64>>,
    paused: Family<OneLabel, Gauge>,
    truncated: Gauge,
}

#[cfg(feature = "server")]
impl StoreFamilies {
    /// Registers the families in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let pool = Family::<OneLabel, Gauge>::default();
        let pool_max = Gauge::default();
        let items = Family::<TwoLabels, Gauge>::default();
        let oldest = Family::<OneLabel, Gauge<f64, AtomicU64>>::default();
        let paused = Family::<OneLabel, Gauge>::default();
        let truncated = Gauge::default();
        registry.register(
            "drover_db_pool_connections",
            "Database pool connections, by state (idle, in_use)",
            pool.clone(),
        );
        registry.register(
            "drover_db_pool_max_connections",
            "The most connections the database pool opens",
            pool_max.clone(),
        );
        registry.register(
            "drover_items",
            "Durable items per process and state (pending, backoff, running, parked), read from the database at scrape time",
            items.clone(),
        );
        registry.register(
            "drover_oldest_pending_age_seconds",
            "How long the longest-waiting ready item of a process has been ready (0 when none is)",
            oldest.clone(),
        );
        registry.register(
            "drover_process_paused",
            "1 while a process is paused (no worker claims its keys), 0 otherwise, read from the database at scrape time",
            paused.clone(),
        );
        registry.register(
            "drover_metrics_processes_truncated",
            "1 when the database holds more processes than the per-process series show (the server's metrics_max_processes, in name order), 0 otherwise",
            truncated.clone(),
        );
        Self {
            pool,
            pool_max,
            items,
            oldest,
            paused,
            truncated,
        }
    }

    /// Forgets every process's item gauges, before a scrape sets them again
    /// (so a process deleted since the last scrape disappears).
    pub(crate) fn clear_items(&self) {
        self.items.clear();
        self.oldest.clear();
    }

    /// Sets one process's item counts per state (`pending`, `backoff`,
    /// `running`, `parked`), its queue depth (the pending count) and how long
    /// its oldest ready item has waited.
    pub(crate) fn set_items(&self, process: &str, states: [(&str, u64); 4], oldest: Duration) {
        for (state, n) in states {
            let labels = [("process", process.to_owned()), ("state", state.to_owned())];
            self.items
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
            if state == "pending" {
                QueueMetrics::global()
                    .handle(process)
                    .depth
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        self.oldest
            .get_or_create(&[("process", process.to_owned())])
            .set(oldest.as_secs_f64());
    }

    /// Forgets every process's pause gauge, before a scrape sets them again.
    pub(crate) fn clear_paused(&self) {
        self.paused.clear();
    }

    /// Sets whether the per-process series left processes out.
    pub(crate) fn set_truncated(&self, truncated: bool) {
        self.truncated.set(i64::from(truncated));
    }

    /// Sets whether `process` is paused.
    pub(crate) fn set_paused(&self, process: &str, paused: bool) {
        self.paused
            .get_or_create(&[("process", process.to_owned())])
            .set(i64::from(paused));
    }

    /// Sets the connection pool's gauges.
    pub(crate) fn set_pool(&self, idle: u32, in_use: u32, max: u32) {
        for (state, n) in [("idle", idle), ("in_use", in_use)] {
            self.pool
                .get_or_create(&[("state", state.to_owned())])
                .set(i64::from(n));
        }
        self.pool_max.set(i64::from(max));
    }
}
