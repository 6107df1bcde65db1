//! Counting what the trace export loses (`drover_trace_spans_dropped_total`,
//! `drover_trace_exports_total`, see [`TraceExportMetrics`]): the SDK's batch
//! processor keeps its own count of the spans its full queue refuses to
//! itself, so [`Gate`] keeps the queue's bound in front of it and counts what
//! it refuses, and [`Counted`] counts each export's result.
//!
//! The bound is on the spans handed to the batch processor and not yet given
//! to an export (queued, or in the batch being gathered), which is never
//! fewer than the processor's own queue holds: with the same size, the
//! processor never refuses a span itself, and every refusal is counted here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use drover::metrics::{SpanDrop, TraceExportMetrics};
use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};

/// The spans handed on and not yet given to an export, and the most there may be.
#[derive(Debug)]
pub(crate) struct Queue {
    waiting: AtomicUsize,
    bound: usize,
    metrics: TraceExportMetrics,
}

impl Queue {
    /// A queue of at most `bound` spans, counted in the process-wide families.
    pub(crate) fn new(bound: usize) -> Arc<Self> {
        let metrics = TraceExportMetrics::global();
        metrics.start();
        Arc::new(Self {
            waiting: AtomicUsize::new(0),
            bound,
            metrics,
        })
    }
}

/// A span processor in front of the batch processor `P` that refuses (and
/// counts) a span when its [`Queue`] is full.
#[derive(Debug)]
pub(crate) struct Gate<P> {
    pub(crate) inner: P,
    pub(crate) queue: Arc<Queue>,
}

impl<P: SpanProcessor> SpanProcessor for Gate<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let queue = &self.queue;
        queue.metrics.ended();
        if queue.waiting.fetch_add(1, Ordering::AcqRel) >= queue.bound {
            queue.waiting.fetch_sub(1, Ordering::AcqRel);
            queue.metrics.dropped(SpanDrop::QueueFull, 1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter `E`, counting each export's result and taking its spans off
/// the [`Queue`] as it starts.
#[derive(Debug)]
pub(crate) struct Counted<E> {
    pub(crate) inner: E,
    pub(crate) queue: Arc<Queue>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.queue.waiting.fetch_sub(spans, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        self.queue.metrics.exported(result.is_ok(), spans as u64);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
