//! The server's own families, and the `/metrics` page.
//!
//! `/metrics` encodes [`registry`](super::registry) (queue and runner metrics of
//! this process) followed by the server's registry: HTTP request counts and
//! latencies per route, and the [store families](super::store) read from the
//! database at scrape time. Family names are unique across both registries.

use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::Mutex;

use super::QueueMetrics;
pub(crate) use super::store::StoreFamilies;

type RequestLabels = [(&'static str, String); 3];
type RouteLabels = [(&'static str, String); 2];

/// The server's metric families, in a registry of their own (one per server,
/// so servers sharing a process keep their figures apart).
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    /// Claims waiting for work (long-polls) right now.
    claims_waiting: Gauge,
    /// Claims sent to the database for HTTP workers.
    claim_attempts: Counter,
    /// Enqueues refused because they would create a process over the cap.
    enqueues_refused: Counter,
    store: StoreFamilies,
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
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
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
        let claims_waiting = Gauge::default();
        registry.register(
            "drover_claims_waiting",
            "Claims waiting on this server for work to come (long-polls)",
            claims_waiting.clone(),
        );
        let claim_attempts = Counter::default();
        registry.register(
            "drover_claim_attempts",
            "Claims this server sent to the database for HTTP workers: first tries and turns of waiting claims",
            claim_attempts.clone(),
        );
        let enqueues_refused = Counter::default();
        registry.register(
            "drover_enqueues_refused",
            "Enqueues refused because they would create a process over the server's limit",
            enqueues_refused.clone(),
        );
        let store = StoreFamilies::new(&mut registry);
        Self {
            registry,
            requests,
            latency,
            claims_waiting,
            claim_attempts,
            enqueues_refused,
            store,
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

    /// Lets `refresh` set the scrape-time gauges (the server reads the
    /// database; this module reads nothing), then encodes both registries as
    /// OpenMetrics text. Scrapes are serialised, so two never interleave
    /// clearing and setting gauges.
    pub(crate) async fn render(
        &self,
        refresh: impl AsyncFnOnce(&StoreFamilies),
    ) -> Result<String, std::fmt::Error> {
        let _scrape = self.scrape.lock().await;
        refresh(&self.store).await;
        let mut text = String::new();
        encode_registry(&mut text, super::registry())?;
        encode_registry(&mut text, &self.registry)?;
        encode_eof(&mut text)?;
        Ok(text)
    }
}

/// The queue metrics of DESIGN.md for work that passes through this server,
/// recorded in the process-wide families (`name` = process).
impl ServerMetrics {
    /// `workqueue_adds_total` for keys enqueued over HTTP.
    pub(crate) fn enqueued(&self, process: &str, keys: u64) {
        QueueMetrics::global().handle(process).adds.inc_by(keys);
    }

    /// Counts one claim waiting for work (`drover_claims_waiting`) until the
    /// returned guard drops.
    pub(crate) fn claim_waiting(&self) -> impl Drop + use<> {
        struct Waiting(Gauge);
        impl Drop for Waiting {
            fn drop(&mut self) {
                self.0.dec();
            }
        }
        self.claims_waiting.inc();
        Waiting(self.claims_waiting.clone())
    }

    /// Counts one enqueue refused for creating a process over the cap
    /// (`drover_enqueues_refused_total`).
    pub(crate) fn enqueue_refused(&self) {
        self.enqueues_refused.inc();
    }

    /// Counts one claim sent to the database (`drover_claim_attempts_total`).
    pub(crate) fn claim_attempted(&self) {
        self.claim_attempts.inc();
    }

    /// `workqueue_queue_duration_seconds`: how long a claimed key waited.
    pub(crate) fn claimed(&self, process: &str, waited: Duration) {
        QueueMetrics::global()
            .handle(process)
            .queue_duration
            .observe(waited.as_secs_f64());
    }

    /// `workqueue_work_duration_seconds` (from `started_at`, when the server
    /// can vouch for the run's start: see `timed_from` in `routes/leases.rs`)
    /// and `workqueue_retries_total` for transient failures.
    pub(crate) fn completed(
        &self,
        process: &str,
        outcome: &str,
        started_at: Option<chrono::DateTime<chrono::Utc>>,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let handle = QueueMetrics::global().handle(process);
        if let Some(started) = started_at
            && let Ok(took) = (now - started).to_std()
        {
            handle.work_duration.observe(took.as_secs_f64());
        }
        if outcome == "transient" {
            handle.retries.inc();
        }
        super::runner().count_outcome(process, outcome);
    }
}
