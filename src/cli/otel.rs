//! The binary's logging and trace export. Traces go out over OTLP
//! (HTTP/protobuf) only when an endpoint is configured, and only through
//! OpenTelemetry's standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME` (default `drover`),
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`/`_ARG`, `OTEL_BSP_*`,
//! and `OTEL_SDK_DISABLED=true` to turn it off.
//!
//! Spans leave through a batch processor on a thread of its own with a
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048): a slow or unreachable
//! collector drops spans, never slows or fails a run, and what it drops is
//! counted on `/metrics` (`drover_trace_spans_dropped_total`, see
//! [`span_export`](super::span_export)).
//!
//! Three kinds of spans go out: each run's ([`RUN_TARGET`]), a slow outcome
//! write's under its run (see [`SLOW_WRITE`](drover::runner::SLOW_WRITE)) and,
//! in `drover serve`, each HTTP request's ([`HTTP_TARGET`]).

use std::time::Duration;

use drover::runner::RUN_TARGET;
use drover::server::HTTP_TARGET;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT, SdkTracerProvider,
};

use super::span_export::{Counted, Gate, Queue};
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How long the exit waits for the last spans to go out.
const FLUSH_WITHIN: Duration = Duration::from_secs(3);

/// The installed logging and, when configured, the trace exporter; dropping
/// it flushes and stops the exporter.
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the global subscriber: logs on stderr filtered by `DROVER_LOG`
/// (default `warn`), and the run spans to the OTLP exporter when configured.
/// Call it before the async runtime starts (the exporter's HTTP client
/// blocks on a thread of its own).
pub(crate) fn init() -> Telemetry {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log piped to a file or a journal
        // would otherwise carry escape codes on every line.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            EnvFilter::try_from_env("DROVER_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        );
    let provider = configured().then(provider).flatten();
    if let Some(provider) = &provider {
        // The runner's store spans (a slow outcome write) are made after the
        // fact through the global provider: the same one, so the same export.
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    let traces = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("drover"))
            .with_filter(
                Targets::new()
                    .with_target(RUN_TARGET, LevelFilter::INFO)
                    .with_target(HTTP_TARGET, LevelFilter::INFO),
            )
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    Telemetry { provider }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown_with_timeout(FLUSH_WITHIN)
        {
            eprintln!("warning: traces not all exported: {e}");
        }
    }
}

/// Whether traces are to be exported: an OTLP endpoint is set and the SDK
/// is not disabled.
fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The tracer provider over the OTLP/HTTP exporter, or `None` (with one
/// line on stderr) when the variables do not make one.
fn provider() -> Option<SdkTracerProvider> {
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("warning: traces are not exported: {e}");
            return None;
        }
    };
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("drover");
    }
    // The gate keeps the batch processor's own bound (read as the SDK reads
    // it), so the processor never drops a span the gate did not count.
    let bound = std::env::var(OTEL_BSP_MAX_QUEUE_SIZE)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT);
    let queue = Queue::new(bound);
    let exporter = Counted {
        inner: exporter,
        queue: queue.clone(),
    };
    let config = BatchConfigBuilder::default().with_max_queue_size(bound);
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(config.build())
        .build();
    Some(
        SdkTracerProvider::builder()
            .with_span_processor(Gate {
                inner: batch,
                queue,
            })
            .with_resource(resource.build())
            .build(),
    )
}
