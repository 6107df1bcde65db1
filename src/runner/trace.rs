//! A run's span (DESIGN.md rule 14), after the OpenTelemetry messaging
//! conventions for a consumer that processes a batch: `{process} process`,
//! kind consumer, no parent, a link to each enqueue the run absorbed (and to
//! the failed attempt a retry follows), drover's own attributes, and an
//! error status when the run fails.
//!
//! With no subscriber interested in the `drover::run` target the span is
//! disabled: nothing below builds, reads or writes anything.

use tracing::Span;
use tracing::field::Empty;

use crate::store::{Lease, Outcome, TraceId, WorkerBackend};

/// The target of the run spans: a subscriber enables it to record them (the
/// CLI does when it exports traces).
pub const RUN_TARGET: &str = "drover::run";

/// The run's span, not yet entered; disabled when nothing records it.
pub(crate) fn run_span(lease: &Lease) -> Span {
    let span = tracing::info_span!(
        target: RUN_TARGET,
        parent: None,
        "run",
        otel.name = %format_args!("{} process", lease.process),
        otel.kind = "consumer",
        otel.status_code = Empty,
        otel.status_description = Empty,
        messaging.system = "drover",
        "messaging.operation.type" = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %lease.process,
        messaging.batch.message_count = Empty,
        "error.type" = Empty,
        drover.process = %lease.process,
        drover.key = %lease.key,
        // Signed: the bridge exports an unsigned integer as text.
        drover.attempt = i64::from(lease.attempt),
        drover.fencing_token = lease.token.0,
        drover.queue_wait_ms = Empty,
        drover.links_dropped = Empty,
        drover.outcome = Empty,
    );
    if !span.is_disabled() {
        let waited = (lease.started_at - lease.enqueued_at).num_milliseconds();
        span.record("drover.queue_wait_ms", waited.max(0));
    }
    span
}

/// Whether claims should bring each lease's trace links
/// ([`LeaseClaim::trace_links`](crate::store::LeaseClaim::trace_links)):
/// when a subscriber records the run spans. A subscriber that records them
/// without OpenTelemetry (a log at `info`) makes the claims read one column
/// more, which nothing then uses.
pub(crate) fn links_wanted() -> bool {
    cfg!(feature = "otel") && tracing::span_enabled!(target: RUN_TARGET, tracing::Level::INFO)
}

/// Links the span to the enqueues the run absorbed, which its claim brought
/// ([`Lease::trace_links`], taken from the lease: the run needs them no
/// more), when the span is part of an OpenTelemetry trace.
pub(crate) fn link_enqueues(span: &Span, lease: &mut Lease) {
    let Some(links) = lease.trace_links.take() else {
        return;
    };
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        if links.is_empty() || context_of(span).is_none() {
            return;
        }
        // Signed: the bridge exports an unsigned integer as text.
        let dropped = i64::try_from(links.dropped).unwrap_or(i64::MAX);
        let count = (links.links.len() as i64).saturating_add(dropped);
        span.record("messaging.batch.message_count", count);
        if dropped > 0 {
            span.record("drover.links_dropped", dropped);
        }
        for link in &links.links {
            span.add_link(link.span_context());
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, links);
}

/// Records how the run ended: its outcome, and an error status with the
/// error's text when it failed.
pub(crate) fn record_outcome(span: &Span, outcome: &Outcome) {
    if span.is_disabled() {
        return;
    }
    record_ended(span, outcome.name());
    if let Outcome::Transient(error) | Outcome::Permanent(error) = outcome {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", error.as_str());
        span.record("error.type", outcome.name());
    }
}

/// Records an end without an outcome (`canceled`, `lost`).
pub(crate) fn record_ended(span: &Span, name: &str) {
    span.record("drover.outcome", name);
}

/// Before a transient failure is written: adds the run's own context to the
/// key's next run, so the retry's span links to this attempt.
pub(crate) async fn link_retry<B: WorkerBackend>(span: &Span, backend: &B, lease: &Lease) {
    #[cfg(feature = "otel")]
    if let Some(context) = context_of(span)
        && let Err(e) = backend.item_trace_link(lease, &context).await
    {
        tracing::debug!(key = %lease.key, error = %e, "cannot link the retry to this attempt");
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, backend, lease);
}

/// The trace id the run's history row keeps: its span's, when the span is
/// sampled (so exported); `None` when tracing is off.
pub(crate) fn trace_id(span: &Span) -> Option<TraceId> {
    #[cfg(feature = "otel")]
    if let Some(context) = context_of(span)
        && context.sampled()
    {
        return TraceId::parse(context.trace_id()).ok();
    }
    #[cfg(not(feature = "otel"))]
    let _ = span;
    None
}

/// The span's W3C context when it is recorded into an OpenTelemetry trace.
#[cfg(feature = "otel")]
fn context_of(span: &Span) -> Option<crate::store::TraceContext> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return None;
    }
    crate::store::TraceContext::of_span(span.context().span().span_context())
}
