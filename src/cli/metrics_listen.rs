//! `drover work --metrics-listen ADDR`: the worker's own `/metrics` (its queue
//! and runner families: outcomes, work durations, sessions, reclaims) and
//! `/healthz`, on either backend, for Prometheus to scrape each worker.

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The OpenMetrics text format prometheus-client writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` (so a taken port fails the command at once) and serves until
/// `stop` fires. Returns the address bound: with port 0 the system picks a
/// free one, and the caller says which (a test or a supervisor reads it
/// instead of guessing a free port, which another socket could take first).
pub(crate) async fn start(addr: SocketAddr, stop: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for --metrics-listen"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("cannot read the address bound for --metrics-listen {addr}"))?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }));
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(bound)
}

async fn metrics() -> impl IntoResponse {
    let mut text = String::new();
    match encode(&mut text, drover::metrics::registry()) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
