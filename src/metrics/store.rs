//! The store's families: what the database holds, read from it at scrape time
//! (so every node reports the shared truth), and the connection pool's gauges.
//! A server registers them in its own registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::QueueMetrics;
use crate::store::{PoolStats, ProcessCounts, Store, StoreEngine as _};

type TwoLabels = [(&'static str, String); 2];
type OneLabel = [(&'static str, String); 1];

/// Item counts per process and state, the oldest ready item's age, and the
/// pool's connections.
#[derive(Debug)]
pub(crate) struct StoreFamilies {
    pool: Family<OneLabel, Gauge>,
    pool_max: Gauge,
    items: Family<TwoLabels, Gauge>,
    oldest: Family<OneLabel, Gauge<f64, AtomicU64>>,
}

impl StoreFamilies {
    /// Registers the families in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let pool = Family::<OneLabel, Gauge>::default();
        let pool_max = Gauge::default();
        let items = Family::<TwoLabels, Gauge>::default();
        let oldest = Family::<OneLabel, Gauge<f64, AtomicU64>>::default();
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
        Self {
            pool,
            pool_max,
            items,
            oldest,
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
