//! The OTLP/gRPC span exporter and the tokio runtime it needs.
//!
//! tonic's channel does its I/O in a worker task that it spawns onto the
//! current tokio runtime when it is built (the connection, its HTTP/2 tasks
//! and the per-call timeout all live there); an export only hands a request
//! to that task and waits for the answer, so the batch processor's plain
//! thread can run it. But the exporter is built in
//! [`init`](super::otel::init), before drover's runtime exists, and must
//! outlive it to flush the last spans. So it gets a runtime of its own: one
//! worker thread, `drover-otlp`, which a slow or silent collector holds and
//! drover's own runtime never waits on.

use opentelemetry_otlp::WithExportConfig as _;
use tokio::runtime::Runtime;

/// Builds the exporter from the standard variables (endpoint, headers,
/// timeout, compression), with the runtime that drives its channel: keep
/// the runtime until the exporter is shut down.
pub(crate) fn exporter() -> Result<(opentelemetry_otlp::SpanExporter, Runtime), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("drover-otlp")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the gRPC exporter's runtime: {e}"))?;
    let built = {
        // The channel connects lazily, but its worker task is spawned now.
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_protocol(opentelemetry_otlp::Protocol::Grpc)
            .build()
    };
    Ok((built.map_err(|e| e.to_string())?, runtime))
}
