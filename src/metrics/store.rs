//! The store's families: what the database holds, read from it at scrape time
//! (so every node reports the shared truth), and the connection pool's gauges,
//! which a server registers in its own registry; and what this process's
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
use crate::store::{PoolStats, ProcessCounts, Store, StoreEngine as _};

#[cfg(feature = "server")]
type TwoLabels = [(&'static str, String); 2];
type OneLabel = [(&'static str, String); 1];

/// `drover_history_pruned_total{what}`: the history runs (`what="runs"`) and
/// idle keys (`what="idle_keys"`) that retention in this process removed, by
/// a [`Pruner`](crate::store::Pruner) or `drover history prune`.
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
/// [`Resyncer`](crate::store::Resyncer) made pending again. Every node walks
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
        Self {
            pool,
            pool_max,
            items,
            oldest,
            paused,
        }
    }

    /// Sets every gauge from `store`. A failing count query leaves the item
    /// gauges out rather than failing the scrape (the pool figures still help).
    pub(crate) async fn refresh(&self, store: &Store) {
        self.refresh_pool(store);
        let counts = store.process_counts().await;
        self.items.clear();
        self.oldest.clear();
        match counts {
            Ok(counts) => counts.iter().for_each(|c| self.set_counts(c)),
            Err(e) => tracing::warn!(error = %e, "cannot count items for /metrics"),
        }
        let settings = store.process_list().await;
        self.paused.clear();
        match settings {
            Ok(settings) => {
                for s in settings {
                    let labels = [("process", s.process)];
                    self.paused
                        .get_or_create(&labels)
                        .set(i64::from(s.limits.paused));
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read process settings for /metrics"),
        }
    }

    fn set_counts(&self, c: &ProcessCounts) {
        for (state, n) in [
            ("pending", c.pending),
            ("backoff", c.backoff),
            ("running", c.running),
            ("parked", c.parked),
        ] {
            let labels = [("process", c.process.clone()), ("state", state.to_owned())];
            self.items
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        QueueMetrics::global()
            .handle(&c.process)
            .depth
            .set(i64::try_from(c.pending).unwrap_or(i64::MAX));
        let age = c.oldest_pending_age.unwrap_or_default().as_secs_f64();
        self.oldest
            .get_or_create(&[("process", c.process.clone())])
            .set(age);
    }

    fn refresh_pool(&self, store: &Store) {
        let PoolStats {
            size, idle, max, ..
        } = store.pool_stats();
        let in_use = size.saturating_sub(idle);
        for (state, n) in [("idle", idle), ("in_use", in_use)] {
            self.pool
                .get_or_create(&[("state", state.to_owned())])
                .set(i64::from(n));
        }
        self.pool_max.set(i64::from(max));
    }
}
