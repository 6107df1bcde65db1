//! The store's span in a run's trace (issue 38: "store spans for slow
//! statements where they help"): writing the run's outcome, as a child of the
//! run's span, made only when the write was slow or did not go through at
//! once.
//!
//! Where a store span helps is where a run's own trace cannot say why it took
//! long: its reconcile returned, yet its span lasted seconds more, because its
//! outcome waited for the database (a lock held by another transaction, a
//! failover, a full disk). The claim needs no span of its own: a claim that
//! was slow shows as the run's `drover.queue_wait_ms`, and a claim serves
//! many runs at once, each in a trace of its own.
//!
//! A fast write (the common case) costs one clock read and nothing else: the
//! span is made after the fact, with the write's real start and end, through
//! OpenTelemetry's global tracer provider (which the binary sets to the one it
//! exports with), and only when the write took [`SLOW_WRITE`] or more, was
//! retried, or did not land.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Span;

use crate::store::Lease;

/// A write of an outcome that takes this long (from the run's return to the
/// commit of its outcome, waiting for a slot in the completer included) gets
/// a span: ten times what a batch's commit takes on a healthy database.
pub const SLOW_WRITE: Duration = Duration::from_millis(100);

/// How the write of an outcome ended, as the span's `drover.write_result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteEnd {
    /// Committed.
    Written,
    /// Refused: the lease was lost meanwhile, and the outcome is dropped.
    Refused,
    /// Failed for a TTL: the outcome is dropped and the key handed back.
    GivenUp,
    /// Stopped by the run's token (session lost, or the shutdown deadline).
    Stopped,
}

#[cfg(feature = "otel")]
impl WriteEnd {
    fn name(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Refused => "refused",
            Self::GivenUp => "given_up",
            Self::Stopped => "stopped",
        }
    }
}

/// The write of one run's outcome, timed for its span.
#[derive(Debug)]
pub(crate) struct OutcomeWrite {
    /// When the write began (monotonic and wall clock); `None` when the run
    /// is not traced, which makes every method here a no-op.
    began: Option<(Instant, std::time::SystemTime)>,
    /// The errors of the tries that failed, in order, with when each came.
    failures: Vec<(std::time::SystemTime, String)>,
}

impl OutcomeWrite {
    /// Starts timing the write of the outcome of the run whose span is `span`.
    pub(crate) fn begin(span: &Span) -> Self {
        let traced = cfg!(feature = "otel") && !span.is_disabled();
        Self {
            began: traced.then(|| (Instant::now(), std::time::SystemTime::now())),
            failures: Vec::new(),
        }
    }

    /// Notes a try that failed (the write is retried).
    pub(crate) fn failed(&mut self, error: &dyn std::fmt::Display) {
        if self.began.is_some() {
            self.failures
                .push((std::time::SystemTime::now(), error.to_string()));
        }
    }

    /// Ends the write: makes its span, a child of `span`, if it was slow, was
    /// retried or did not land.
    pub(crate) fn end(self, span: &Span, lease: &Lease, end: WriteEnd) {
        let Some((began, _)) = self.began else {
            return;
        };
        if began.elapsed() < SLOW_WRITE && self.failures.is_empty() && end == WriteEnd::Written {
            return;
        }
        #[cfg(feature = "otel")]
        self.export(span, lease, end);
        #[cfg(not(feature = "otel"))]
        let _ = (span, lease);
    }

    #[cfg(feature = "otel")]
    fn export(self, span: &Span, lease: &Lease, end: WriteEnd) {
        use opentelemetry::KeyValue;
        use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;

        let Some((_, started)) = self.began else {
            return;
        };
        let tracer = opentelemetry::global::tracer("drover");
        let tries = i64::try_from(self.failures.len()).map_or(i64::MAX, |n| n + 1);
        let mut write = tracer
            .span_builder(format!("{} settle", lease.process))
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_attributes([
                KeyValue::new("messaging.system", "drover"),
                KeyValue::new("messaging.operation.type", "settle"),
                KeyValue::new("messaging.operation.name", "complete"),
                KeyValue::new("messaging.destination.name", lease.process.clone()),
                KeyValue::new("drover.key", lease.key.clone()),
                KeyValue::new("drover.fencing_token", lease.token.0),
                KeyValue::new("drover.write_tries", tries),
                KeyValue::new("drover.write_result", end.name()),
            ])
            .start_with_context(&tracer, &span.context());
        let last = self.failures.last().map(|(_, e)| e.clone());
        for (at, error) in self.failures {
            write.add_event_with_timestamp(
                "write failed",
                at,
                vec![KeyValue::new("error.message", error)],
            );
        }
        if end != WriteEnd::Written {
            let why = last.unwrap_or_else(|| end.name().to_owned());
            write.set_attribute(KeyValue::new("error.type", end.name()));
            write.set_status(Status::error(why));
        }
        write.end();
    }
}
