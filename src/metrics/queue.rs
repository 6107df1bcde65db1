//! Prometheus metrics of named queues, with client-go's names so existing
//! workqueue dashboards work unchanged.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The label set of every queue metric: `name` = the queue's name.
type NameLabel = [(&'static str, String); 1];

type HistogramFamily = Family<NameLabel, Histogram, fn() -> Histogram>;

/// client-go's buckets: 10 ns to 10 s, ×10.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// A queue as the scrape-time collector sees it: its name and the processing
/// times of the keys it has handed out.
pub(crate) trait InFlight: Send + Sync {
    /// The queue's name (the `name` label).
    fn name(&self) -> &str;
    /// Sum and maximum, in seconds, of the time the keys now processing have been
    /// processed so far.
    fn in_flight(&self) -> (f64, f64);
}

/// The families of the queue metrics, registered once in a [`Registry`] and shared
/// by every queue that reports to it (each with its own `name` label).
///
/// `workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`,
/// `workqueue_work_duration_seconds` and `workqueue_retries_total` are updated as
/// keys move; `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds` are computed at scrape time from
/// the keys being processed, so they are exact without a background task.
#[derive(Clone)]
pub struct QueueMetrics {
    families: Arc<Families>,
}

struct Families {
    depth: Family<NameLabel, Gauge>,
    adds: Family<NameLabel, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    retries: Family<NameLabel, Counter>,
    queues: Mutex<Vec<Weak<dyn InFlight>>>,
}

impl fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueMetrics").finish_non_exhaustive()
    }
}

impl QueueMetrics {
    /// Registers the queue metric families in `registry`. Register once per
    /// registry and pass the result to every queue's builder.
    pub fn new(registry: &mut Registry) -> Self {
        let histogram: fn() -> Histogram = duration_histogram;
        let families = Arc::new(Families {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(histogram),
            work_duration: Family::new_with_constructor(histogram),
            retries: Family::default(),
            queues: Mutex::new(Vec::new()),
        });
        let f = &families;
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            f.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            f.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            f.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            f.work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            f.retries.clone(),
        );
        registry.register_collector(Box::new(InFlightCollector(Arc::downgrade(&families))));
        Self { families }
    }

    /// The process-wide metrics that [`QueueBuilder::name`](crate::queue::QueueBuilder::name)
    /// uses when no other [`QueueMetrics`] is given; they live in
    /// [`registry`](super::registry).
    pub fn global() -> &'static QueueMetrics {
        super::queue()
    }

    /// The metric handles of one named queue.
    pub(crate) fn handle(&self, name: &str) -> MetricsHandle {
        let f = &self.families;
        let label = [("name", name.to_owned())];
        MetricsHandle {
            depth: f.depth.get_or_create(&label).clone(),
            adds: f.adds.get_or_create(&label).clone(),
            queue_duration: f.queue_duration.get_or_create(&label).clone(),
            work_duration: f.work_duration.get_or_create(&label).clone(),
            retries: f.retries.get_or_create(&label).clone(),
        }
    }

    /// Makes `queue` visible to the scrape-time gauges until it is dropped.
    pub(crate) fn track(&self, queue: Weak<dyn InFlight>) {
        let mut queues = self
            .families
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        queues.retain(|q| q.strong_count() > 0);
        queues.push(queue);
    }
}

/// One queue's metric handles, cloned out of the families once so the hot path
/// touches atomics only, never the family maps.
#[derive(Debug, Clone)]
pub(crate) struct MetricsHandle {
    pub(crate) depth: Gauge,
    pub(crate) adds: Counter,
    pub(crate) queue_duration: Histogram,
    pub(crate) work_duration: Histogram,
    pub(crate) retries: Counter,
}

/// Computes the two in-flight gauges at scrape time.
struct InFlightCollector(Weak<Families>);

impl fmt::Debug for InFlightCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InFlightCollector")
    }
}

impl Collector for InFlightCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Some(families) = self.0.upgrade() else {
            return Ok(());
        };
        let queues: Vec<_> = {
            let queues = families
                .queues
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            queues.iter().filter_map(Weak::upgrade).collect()
        };
        let figures: Vec<_> = queues.iter().map(|q| (q.name(), q.in_flight())).collect();
        let gauges = [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
            ),
        ];
        for (index, (metric, help)) in gauges.into_iter().enumerate() {
            let mut family = encoder.encode_descriptor(metric, help, None, MetricType::Gauge)?;
            for (name, (sum, longest)) in &figures {
                let label = [("name", *name)];
                let value = if index == 0 { *sum } else { *longest };
                let gauge = ConstGauge::new(value);
                gauge.encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}
