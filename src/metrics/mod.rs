//! Every drover metric family, and the process-wide Prometheus registry that a
//! `/metrics` page encodes.
//!
//! One file per layer's families, each built with its layer's feature:
//!
//! - queue: client-go's `workqueue_*` names, label `name` ([`QueueMetrics`]);
//! - runner: `drover_outcomes_total{process,outcome}`, `drover_sessions_active`,
//!   `drover_leases_reclaimed_total` ([`RunnerFamilies`]);
//! - server: `drover_http_requests_total` and `drover_http_request_duration_seconds`;
//! - store: `drover_items{process,state}`, `drover_oldest_pending_age_seconds`
//!   `drover_process_paused{process}` and the connection pool's gauges, set at
//!   scrape time from what the server read in the database;
//!   `drover_history_pruned_total{what}` ([`PruneMetrics`]),
//!   `drover_resync_enqueued_total{process}` ([`ResyncMetrics`]);
//! - trace export: `drover_trace_spans_total`,
//!   `drover_trace_spans_dropped_total{reason}`,
//!   `drover_trace_exports_total{result}` ([`TraceExportMetrics`]).
//!
//! The queue, the runner, the maintenance loops and the server import their
//! families from here; this module imports nothing from any layer (it is the
//! floor they all stand on), so metrics never form a cycle between layers. What
//! a family records comes in as plain values: a run's fencing token as its
//! number, a claim's queue wait as a duration, the database's counts as set by
//! the server's `/metrics` handler.
//!
//! Named queues ([`QueueBuilder::name`](crate::queue::QueueBuilder::name)) and
//! controllers report to [`registry`] unless given other metrics.

use std::sync::OnceLock;

use prometheus_client::registry::Registry;

mod queue;
#[cfg(feature = "_store")]
mod runner;
#[cfg(feature = "server")]
mod server;
#[cfg(feature = "_store")]
mod store;
#[cfg(feature = "otel")]
mod trace;

pub use queue::QueueMetrics;
pub(crate) use queue::{InFlight, MetricsHandle};
#[cfg(feature = "_store")]
pub use runner::RunnerFamilies;
#[cfg(feature = "_store")]
pub(crate) use runner::RunnerMetrics;
#[cfg(feature = "server")]
pub(crate) use server::{ServerMetrics, StoreFamilies};
#[cfg(feature = "_store")]
pub use store::{PruneMetrics, ResyncMetrics};
#[cfg(feature = "otel")]
pub use trace::{SpanDrop, TraceExportMetrics};

struct Global {
    registry: Registry,
    queue: QueueMetrics,
    #[cfg(feature = "_store")]
    runner: RunnerFamilies,
    #[cfg(feature = "_store")]
    pruned: PruneMetrics,
    #[cfg(feature = "_store")]
    resynced: ResyncMetrics,
    #[cfg(feature = "otel")]
    trace_export: TraceExportMetrics,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let mut registry = Registry::default();
        let queue = QueueMetrics::new(&mut registry);
        Global {
            #[cfg(feature = "_store")]
            runner: RunnerFamilies::new(&mut registry),
            #[cfg(feature = "_store")]
            pruned: PruneMetrics::new(&mut registry),
            #[cfg(feature = "_store")]
            resynced: ResyncMetrics::new(&mut registry),
            #[cfg(feature = "otel")]
            trace_export: TraceExportMetrics::new(&mut registry),
            queue,
            registry,
        }
    })
}

/// The registry holding every metric of this process.
///
/// ```
/// use drover::queue::Queue;
///
/// let queue: Queue<String> = Queue::builder().name("pods").build();
/// queue.add("default/web".to_string());
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, drover::metrics::registry())?;
/// assert!(text.contains(r#"workqueue_depth{name="pods"} 1"#));
/// # Ok::<(), std::fmt::Error>(())
/// ```
pub fn registry() -> &'static Registry {
    &global().registry
}

pub(crate) fn queue() -> &'static QueueMetrics {
    &global().queue
}

#[cfg(feature = "_store")]
pub(crate) fn runner() -> &'static RunnerFamilies {
    &global().runner
}

#[cfg(feature = "_store")]
pub(crate) fn pruned() -> &'static PruneMetrics {
    &global().pruned
}

#[cfg(feature = "_store")]
pub(crate) fn resynced() -> &'static ResyncMetrics {
    &global().resynced
}

#[cfg(feature = "otel")]
pub(crate) fn trace_export() -> &'static TraceExportMetrics {
    &global().trace_export
}
