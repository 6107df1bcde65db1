//! The trace export's families: what became of the spans this process
//! handed to its OTLP exporter, so a collector that refuses, fails or never
//! answers shows on `/metrics` instead of only in a missing trace.
//!
//! - `drover_trace_spans_dropped_total{reason}`: spans that never reached a
//!   collector. `reason="queue_full"`: refused when it ended, because the
//!   export queue (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048: spans waiting
//!   for an export or in one) was full; `reason="export_failed"`: in a batch
//!   the collector did not accept (an error answer such as a 500, a refused
//!   connection, or no answer within `OTEL_EXPORTER_OTLP_TIMEOUT`).
//! - `drover_trace_spans_total`: spans handed to the export as they ended
//!   (runs', slow outcome writes', HTTP requests'): every one of them is
//!   exported or counted in `drover_trace_spans_dropped_total`, so the
//!   difference is what reached a collector or is still on its way.
//! - `drover_trace_exports_total{result}`: export requests (one per batch
//!   of up to `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` spans), `result="ok"` or
//!   `"failed"`.
//!
//! Spans a sampler left out are not counted (they are never exported), nor
//! are those still queued when the process stops and not flushed within its
//! exit's bound (the exit says so on stderr). The series exist, at 0, from
//! the moment traces are exported ([`TraceExportMetrics::start`]); with
//! tracing off there are none.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

type OneLabel = [(&'static str, &'static str); 1];

/// Why a span was dropped (`reason` of `drover_trace_spans_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanDrop {
    /// The export queue was full when the span ended.
    QueueFull,
    /// The span's batch was not accepted by the collector.
    ExportFailed,
}

impl SpanDrop {
    fn label(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::ExportFailed => "export_failed",
        }
    }
}

/// The trace export's families (see the module doc), in the process-wide
/// [`registry`](super::registry); clones share the counters.
#[derive(Debug, Clone)]
pub struct TraceExportMetrics {
    spans: Counter,
    dropped: Family<OneLabel, Counter>,
    exports: Family<OneLabel, Counter>,
}

impl TraceExportMetrics {
    /// Registers the families in `registry`.
    pub(super) fn new(registry: &mut Registry) -> Self {
        let spans = Counter::default();
        registry.register(
            "drover_trace_spans",
            "Spans handed to the trace export as they ended (exported or counted dropped)",
            spans.clone(),
        );
        let dropped = Family::<OneLabel, Counter>::default();
        registry.register(
            "drover_trace_spans_dropped",
            "Spans that never reached the trace collector, by reason (queue_full, export_failed)",
            dropped.clone(),
        );
        let exports = Family::<OneLabel, Counter>::default();
        registry.register(
            "drover_trace_exports",
            "Trace export requests to the collector, by result (ok, failed)",
            exports.clone(),
        );
        Self {
            spans,
            dropped,
            exports,
        }
    }

    /// The process-wide families.
    #[must_use]
    pub fn global() -> Self {
        super::trace_export().clone()
    }

    /// Creates every series at 0: called once when traces start to be
    /// exported, so a dashboard sees them before anything goes wrong.
    pub fn start(&self) {
        for reason in [SpanDrop::QueueFull, SpanDrop::ExportFailed] {
            self.dropped(reason, 0);
        }
        for result in ["ok", "failed"] {
            self.exports.get_or_create(&[("result", result)]).inc_by(0);
        }
    }

    /// Counts one span handed to the export as it ended.
    pub fn ended(&self) {
        self.spans.inc();
    }

    /// Counts `spans` dropped for `reason`.
    pub fn dropped(&self, reason: SpanDrop, spans: u64) {
        self.dropped
            .get_or_create(&[("reason", reason.label())])
            .inc_by(spans);
    }

    /// Counts one export request, and its spans as dropped when it failed.
    pub fn exported(&self, ok: bool, spans: u64) {
        let result = if ok { "ok" } else { "failed" };
        self.exports.get_or_create(&[("result", result)]).inc();
        if !ok {
            self.dropped(SpanDrop::ExportFailed, spans);
        }
    }
}
