//! The server's own families, and the `/metrics` page.
//!
//! `/metrics` encodes [`registry`](super::registry) (queue and runner metrics of
//! this process) followed by the server's registry: HTTP request counts and
//! latencies per route, and the [store families](super::store) read from the
//! database at scrape time. Family names are unique across both registries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
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
    /// Serialises scrapes, so two never interleave clearing and setting
    /// gauges, and keeps the last one's text for those that waited on it.
    scrape: Mutex<Option<Rendered>>,
    /// Renders begun so far (only ever raised under `scrape`).
    begun: AtomicU64,
}

/// A finished render: its number among those begun, and its text.
#[derive(Debug)]
struct Rendered {
    number: u64,
    text: Bytes,
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
            scrape: Mutex::new(None),
            begun: AtomicU64::new(0),
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
    /// clearing and setting gauges; a scrape that finds a render begun after
    /// it arrived finished by the time it gets its turn takes that render's
    /// text instead of reading the database again. So scrapes sent at once
    /// (a viewer's script, several Prometheus replicas) cost at most two
    /// renders between them, and an operator's scrape waits behind at most
    /// two, not behind every one queued before it; each still gets figures
    /// read after it arrived.
    pub(crate) async fn render(
        &self,
        refresh: impl AsyncFnOnce(&StoreFamilies),
    ) -> Result<Bytes, std::fmt::Error> {
        let arrived = self.begun.load(Ordering::SeqCst);
        let mut last = self.scrape.lock().await;
        if let Some(done) = last.as_ref().filter(|done| done.number > arrived) {
            return Ok(done.text.clone());
        }
        let number = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        refresh(&self.store).await;
        let mut text = String::new();
        encode_registry(&mut text, super::registry())?;
        encode_registry(&mut text, &self.registry)?;
        encode_eof(&mut text)?;
        let text = Bytes::from(text);
        *last = Some(Rendered {
            number,
            text: text.clone(),
        });
        Ok(text)
    }
}

/// The queue metrics of DESIGN.md for work that passes through this server,
/// recorded in the process-wide families (`name` = process).
impl ServerMetrics {
    /// `workqueue_adds_total` for keys enqueued over HTTP: the distinct keys
    /// an enqueue wrote (pending or marked dirty), not the request's length.
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};

    use tokio::sync::Notify;

    use super::ServerMetrics;

    /// The render number a text was made by: each test refresh sets the
    /// pool's maximum to its own number.
    fn render_of(text: &[u8]) -> u32 {
        let text = std::str::from_utf8(text).expect("UTF-8");
        let line = text
            .lines()
            .find(|line| line.starts_with("drover_db_pool_max_connections "))
            .expect("the pool's maximum");
        line.rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a number")
    }

    /// A render that counts itself in `refreshes` and writes its number into
    /// the text, then waits for `release` if one is given.
    async fn scrape(
        metrics: &ServerMetrics,
        refreshes: &AtomicU32,
        release: Option<&Notify>,
    ) -> Vec<u8> {
        let text = metrics.render(async |families| {
            let number = refreshes.fetch_add(1, SeqCst) + 1;
            families.set_pool(0, 0, number);
            if let Some(release) = release {
                release.notified().await;
            }
        });
        text.await.expect("encodes").to_vec()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn scrapes_queued_behind_one_render_share_the_next_instead_of_each_reading_the_database()
    {
        let metrics = Arc::new(ServerMetrics::new());
        let refreshes = Arc::new(AtomicU32::new(0));
        let release = Arc::new(Notify::new());
        let first = tokio::spawn({
            let (metrics, refreshes, release) =
                (metrics.clone(), refreshes.clone(), release.clone());
            async move { scrape(&metrics, &refreshes, Some(&release)).await }
        });
        while refreshes.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Ten scrapes arrive while the first reads the database; each is
        // counted in the same poll that reads how many renders had begun.
        let arrived = Arc::new(AtomicUsize::new(0));
        let queued: Vec<_> = (0..10)
            .map(|_| {
                let (metrics, refreshes, arrived) =
                    (metrics.clone(), refreshes.clone(), arrived.clone());
                tokio::spawn(async move {
                    arrived.fetch_add(1, SeqCst);
                    scrape(&metrics, &refreshes, None).await
                })
            })
            .collect();
        while arrived.load(SeqCst) < 10 {
            tokio::task::yield_now().await;
        }
        release.notify_one();
        assert_eq!(render_of(&first.await.expect("first")), 1);
        for scrape in queued {
            // Not the first render's text: it began before they arrived.
            assert_eq!(render_of(&scrape.await.expect("queued")), 2);
        }
        assert_eq!(
            refreshes.load(SeqCst),
            2,
            "ten scrapes queued behind one render read the database once between them"
        );
        // A scrape arriving after every render finished reads afresh.
        assert_eq!(render_of(&scrape(&metrics, &refreshes, None).await), 3);
    }
}
