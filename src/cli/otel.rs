//! The binary's logging and trace export. Traces go out over OTLP only when
//! an endpoint is configured, and only through OpenTelemetry's standard
//! variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_PROTOCOL` (or
//! `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`), `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME` (default `drover`),
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`/`_ARG`, `OTEL_BSP_*`,
//! and `OTEL_SDK_DISABLED=true` to turn it off.
//!
//! The protocol is `http/protobuf` (the default; the endpoint gets
//! `/v1/traces` appended) or `grpc` (the endpoint as given, e.g.
//! `http://collector:4317`; built with the `otlp-grpc` feature, on by
//! default), see [`otlp_protocol`](super::otlp_protocol). Any other value,
//! `http/json` included, is refused with one line on stderr and no traces
//! are exported; the command runs as usual. Plain `http://` endpoints only:
//! neither transport is built with TLS.
//!
//! Spans leave through a batch processor on a thread of its own with a
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048): a slow or unreachable
//! collector drops spans, never slows or fails a run, and what it drops is
//! counted on `/metrics` (`drover_trace_spans_dropped_total`, see
//! [`span_export`](super::span_export)). The gRPC exporter adds a runtime
//! of its own with one thread, see [`otlp_grpc`](super::otlp_grpc).
//!
//! Three kinds of spans go out: each run's ([`RUN_TARGET`]), a slow outcome
//! write's under its run (see [`SLOW_WRITE`](drover::runner::SLOW_WRITE)) and,
//! in `drover serve`, each HTTP request's ([`HTTP_TARGET`]).

use std::time::Duration;

use drover::runner::RUN_TARGET;
use drover::server::HTTP_TARGET;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT, SdkTracerProvider, SpanExporter,
};

use super::otlp_protocol::Protocol;
use super::say::errln;
use super::span_export::{Counted, Gate, Queue};
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How long the exit waits for the last spans to go out.
const FLUSH_WITHIN: Duration = Duration::from_secs(3);

/// The installed logging and, when configured, the trace exporter; dropping
/// it flushes and stops the exporter.
#[derive(Default)]
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
    /// The gRPC exporter's runtime, stopped once the provider is.
    runtime: Option<tokio::runtime::Runtime>,
}

/// Installs the global subscriber: logs on stderr filtered by `DROVER_LOG`
/// (default `warn`), and the run spans to the OTLP exporter when configured.
/// Call it before the async runtime starts (the exporters run on threads of
/// their own: the HTTP client blocks on one, gRPC has its own runtime).
pub(crate) fn init() -> Telemetry {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(super::streams::LogWriter)
        // Off, as by default: a log line stderr cannot take is lost.
        // Reported, it would be written with `eprintln!` to that same
        // stderr, which panics on a closed pipe (see `say`) and waits on a
        // slow one (see `streams`).
        .log_internal_errors(false)
        // Colours only on a terminal: a log piped to a file or a journal
        // would otherwise carry escape codes on every line.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            EnvFilter::try_from_env("DROVER_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        );
    let telemetry = if configured() {
        exporting()
    } else {
        Telemetry::default()
    };
    if let Some(provider) = &telemetry.provider {
        // The runner's store spans (a slow outcome write) are made after the
        // fact through the global provider: the same one, so the same export.
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    let traces = telemetry.provider.as_ref().map(|provider| {
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
    telemetry
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown_with_timeout(FLUSH_WITHIN)
        {
            errln!("warning: traces not all exported: {e}");
        }
        // Its last export is over (or given up): nothing left to wait for,
        // and this may run inside another runtime, where a blocking drop
        // would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
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

/// The exporter the variables ask for under its provider, or nothing (with
/// one line on stderr) when they do not make one.
fn exporting() -> Telemetry {
    let built = match Protocol::from_env() {
        Ok(Protocol::HttpProtobuf) => http(),
        #[cfg(feature = "otlp-grpc")]
        Ok(Protocol::Grpc) => grpc(),
        Err(refused) => Err(refused.to_string()),
    };
    built.unwrap_or_else(|e| {
        errln!("warning: traces are not exported: {e}");
        Telemetry::default()
    })
}

/// Over OTLP/HTTP with protobuf bodies.
fn http() -> Result<Telemetry, String> {
    // The HTTP client is built without TLS and would fail every export to
    // an `https://` endpoint, each counted dropped: refuse it at start, as
    // the gRPC exporter does.
    let endpoint = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find_map(|name| {
        let value = std::env::var(name).ok()?;
        (!value.trim().is_empty()).then_some((name, value))
    });
    if let Some((name, value)) = endpoint
        && value
            .trim()
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    {
        return Err(format!(
            "{name}={value:?} uses HTTPS, but drover is built without TLS: \
             send to a local OpenTelemetry Collector over http:// and let it forward"
        ));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Telemetry {
        provider: Some(provider(exporter)),
        runtime: None,
    })
}

/// Over OTLP/gRPC, on the exporter's own runtime.
#[cfg(feature = "otlp-grpc")]
fn grpc() -> Result<Telemetry, String> {
    let (exporter, runtime) = super::otlp_grpc::exporter()?;
    Ok(Telemetry {
        provider: Some(provider(exporter)),
        runtime: Some(runtime),
    })
}

/// The tracer provider over `exporter`: its spans counted through the
/// [`Gate`] and the batch processor's export.
fn provider<E: SpanExporter + 'static>(exporter: E) -> SdkTracerProvider {
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
    SdkTracerProvider::builder()
        .with_span_processor(Gate {
            inner: batch,
            queue,
        })
        .with_resource(resource.build())
        .build()
}
