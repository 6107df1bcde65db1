//! The server's own metrics and the `/metrics` page.
//!
//! `/metrics` encodes [`crate::metrics::registry`] (queue and runner metrics of
//! this process) followed by the server's registry: HTTP request counts and
//! latencies per route, database pool gauges, and per-process item counts read
//! from the database at scrape time (so every node reports the shared truth).
//! Family names are unique across both registries.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::Mutex;

use crate::store::{PoolStats, ProcessCounts, Store};

type RequestLabels = [(&'static str, String); 3];
type TwoLabels = [(&'static str, String); 2];
type OneLabel = [(&'static str, String); 1];

/// The server's metric families, in a registry of their own.
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<TwoLabels, Histogram>,
    pool: Family<OneLabel, Gauge>,
    pool_max: Gauge,
    items: Family<TwoLabels, Gauge>,
    oldest: Family<OneLabel, Gauge<f64, AtomicU64>>,
    /// Serialises scrapes, so two never interleave clearing and setting gauges.
    scrape: Mutex<()>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl ServerMetrics {
    /// Registers the families.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<TwoLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let pool = Family::<OneLabel, Gauge>::default();
        let pool_max = Gauge::default();
        let items = Family::<TwoLabels, Gauge>::default();
        let oldest = Family::<OneLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "drover_http_requests",
            "HTTP requests answered, by method, route template and status",
            requests.clone(),
        );
        registry.register(
            "drover_http_request_duration_seconds",
            "HTTP request latency, by method and route template",
            latency.clone(),
        );
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
            registry,
            requests,
            latency,
            pool,
            pool_max,
            items,
            oldest,
            scrape: Mutex::new(()),
        }
    }

    /// Counts one answered request.
    pub(crate) fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let labels = [
            ("method", method.to_owned()),
            ("route", route.to_owned()),
            ("status", status.to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
        let route = [("method", method.to_owned()), ("route", route.to_owned())];
        self.latency
            .get_or_create(&route)
            .observe(elapsed.as_secs_f64());
    }

    /// Refreshes the scrape-time gauges from `store` and encodes both registries
    /// as OpenMetrics text. A failing count query leaves the item gauges out
    /// rather than failing the scrape (the HTTP and pool figures still help).
    pub(crate) async fn render(&self, store: &Store) -> Result<String, std::fmt::Error> {
        let _scrape = self.scrape.lock().await;
        self.refresh_pool(store);
        let counts = crate::store::StoreEngine::process_counts(store).await;
        self.items.clear();
        self.oldest.clear();
        match counts {
            Ok(counts) => counts.iter().for_each(|c| self.set_counts(c)),
            Err(e) => tracing::warn!(error = %e, "cannot count items for /metrics"),
        }
        let mut text = String::new();
        encode_registry(&mut text, crate::metrics::registry())?;
        encode_registry(&mut text, &self.registry)?;
        encode_eof(&mut text)?;
        Ok(text)
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
        crate::queue::QueueMetrics::global()
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

/// The queue metrics of DESIGN.md for work that passes through this server,
/// recorded in the process-wide families (`name` = process).
impl ServerMetrics {
    /// `workqueue_adds_total` for keys enqueued over HTTP.
    pub(crate) fn enqueued(&self, process: &str, keys: u64) {
        crate::queue::QueueMetrics::global()
            .handle(process)
            .adds
            .inc_by(keys);
    }

    /// `workqueue_queue_duration_seconds`: how long each claimed key waited.
    pub(crate) fn claimed(&self, leases: &[crate::store::Lease]) {
        for lease in leases {
            let waited = (lease.started_at - lease.enqueued_at)
                .to_std()
                .unwrap_or_default();
            crate::queue::QueueMetrics::global()
                .handle(&lease.process)
                .queue_duration
                .observe(waited.as_secs_f64());
        }
    }

    /// `workqueue_work_duration_seconds` (when the worker sent the start time
    /// back) and `workqueue_retries_total` for transient failures.
    pub(crate) fn completed(
        &self,
        process: &str,
        outcome: &str,
        started_at: Option<chrono::DateTime<chrono::Utc>>,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let handle = crate::queue::QueueMetrics::global().handle(process);
        if let Some(started) = started_at
            && let Ok(took) = (now - started).to_std()
        {
            handle.work_duration.observe(took.as_secs_f64());
        }
        if outcome == "transient" {
            handle.retries.inc();
        }
        crate::metrics::runner().count_outcome(process, outcome);
    }
}
