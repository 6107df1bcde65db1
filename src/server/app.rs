//! [`Server`]: the router with its layers, and serving it until shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::RequestBodyDeadlineLayer;
use tower_http::trace::TraceLayer;

use super::connections;
use super::dashboard;
use super::host;
use super::options::ServerOptions;
use super::origin;
use super::routes;
use super::spans;
use super::state::AppState;
use crate::metrics::ServerMetrics;
use crate::runner::{Pruner, Resyncer};
use crate::store::{DepthSample, Store, StoreEngine as _};

/// drover's HTTP server over one store: the JSON API under `/v1`, `/openapi.json`,
/// `/metrics`, `/healthz`, `/readyz` and the dashboard at `/`.
///
/// Any number of servers may share one PostgreSQL database: everything they
/// know lives there, and each reclaims expired sessions' leases.
#[derive(Debug)]
pub struct Server {
    state: AppState,
}

impl Server {
    /// A server over `store`. Call it inside a Tokio runtime: on PostgreSQL it
    /// starts the task that listens for other nodes' enqueues, which runs until
    /// [`stop`](Self::stop) or the end of [`serve`](Self::serve).
    #[must_use]
    pub fn new(store: Store, options: ServerOptions) -> Self {
        let shared = options
            .tokens
            .as_ref()
            .is_some_and(|tokens| tokens.workers() > 1);
        let waiting = Arc::new(super::waiting::Waiting::new(
            options.max_waiting_claims,
            shared,
        ));
        let state = AppState {
            store,
            slow_reads: super::dashboard::SlowReads::default(),
            options: Arc::new(options),
            metrics: Arc::new(ServerMetrics::new()),
            shutdown: CancellationToken::new(),
            owners: Arc::default(),
            handed: Arc::default(),
            waiting,
            known: Arc::default(),
        };
        Self { state }
    }

    /// The complete application, for serving or for driving in tests with
    /// `tower::ServiceExt::oneshot`.
    pub fn router(&self) -> Router {
        let state = self.state.clone();
        let (api, _) = routes::api().split_for_parts();
        api.merge(dashboard::routes())
            .fallback(routes::health::not_found)
            .method_not_allowed_fallback(routes::health::method_not_allowed)
            .layer(DefaultBodyLimit::max(state.options.body_limit))
            // The whole body within the client timeout, however it trickles
            // (408 from the extractors, `extract::body_of`).
            .layer(RequestBodyDeadlineLayer::new(state.options.client_timeout))
            // Inside `record`, so refusals are counted like any response.
            .layer(middleware::from_fn(origin::guard))
            .layer(middleware::from_fn_with_state(state.clone(), host::guard))
            // No other site may frame a page of drover's: a click in a framed
            // page is same-origin to the cross-origin guard (clickjacking).
            // drover's own origin may (its browser test clicks real buttons
            // through a frame of its own).
            .layer(SetResponseHeaderLayer::if_not_present(
                header::X_FRAME_OPTIONS,
                HeaderValue::from_static("SAMEORIGIN"),
            ))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("frame-ancestors 'self'"),
            ))
            .layer(middleware::from_fn_with_state(state.clone(), record))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(spans::request_span)
                    .on_response(spans::record_response),
            )
            .with_state(state)
    }

    /// Ends waiting claims and background tasks (what [`serve`](Self::serve)
    /// does on shutdown). Idempotent.
    pub fn stop(&self) {
        self.state.shutdown.cancel();
    }

    /// Serves on `listener` until `shutdown` fires, then stops accepting,
    /// answers waiting claims with no leases, lets in-flight requests finish (for
    /// 10 s at most) and returns. Connections are bounded by the options'
    /// [`max_connections`](ServerOptions::max_connections) and
    /// [`client_timeout`](ServerOptions::client_timeout). Reclaims expired
    /// sessions' leases and applies every process's retention ([`Pruner`]) and
    /// resync ([`Resyncer`]) in the background meanwhile.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let app = self.router();
        let stop = self.state.shutdown.clone();
        let reclaim = tokio::spawn(reclaim_loop(self.state.clone()));
        let sampler = tokio::spawn(sample_loop(self.state.clone()));
        let pruner = Pruner::new(self.state.store.clone())
            .every(self.state.options.prune_interval)
            .run(stop.clone());
        let pruner = tokio::spawn(pruner);
        let resyncer = tokio::spawn(Resyncer::new(self.state.store.clone()).run(stop.clone()));
        let relay = tokio::spawn({
            let stop = stop.clone();
            let shutdown = shutdown.clone();
            async move {
                tokio::select! {
                    () = shutdown.cancelled() => stop.cancel(),
                    () = stop.cancelled() => {}
                }
            }
        });
        let limits = connections::Limits {
            max_connections: self.state.options.max_connections,
            client_timeout: self.state.options.client_timeout,
        };
        let result = connections::serve(listener, app, limits, shutdown).await;
        stop.cancel();
        relay.await.ok();
        reclaim.await.ok();
        sampler.await.ok();
        pruner.await.ok();
        resyncer.await.ok();
        result
    }
}

/// Reclaims the leases of expired sessions every `reclaim_interval`.
async fn reclaim_loop(state: AppState) {
    let mut tick = tokio::time::interval(state.options.reclaim_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = state.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match state.store.session_reclaim().await {
            Ok(report) if report.leases > 0 || report.sessions > 0 => {
                tracing::info!(
                    sessions = report.sessions,
                    leases = report.leases,
                    "reclaimed expired sessions"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot reclaim expired sessions"),
        }
    }
}

/// How long depth samples are kept.
const KEEP_SAMPLES: Duration = Duration::from_secs(24 * 3600);

/// Samples every process's queue depth every `sample_interval`, from the
/// first tick on, for the depth chart.
async fn sample_loop(state: AppState) {
    let every = state.options.sample_interval;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let params = DepthSample {
        keep: KEEP_SAMPLES,
        min_gap: every / 2,
    };
    loop {
        tokio::select! {
            () = state.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = state.store.depth_sample(params).await {
            tracing::warn!(error = %e, "cannot sample the queue depth");
        }
    }
}

/// Counts each request by method, route template (never the raw path, so keys
/// do not become label values) and status.
async fn record(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = match *req.method() {
        Method::GET | Method::POST | Method::DELETE | Method::PUT | Method::HEAD => {
            req.method().as_str().to_owned()
        }
        _ => "other".to_owned(),
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let start = Instant::now();
    let response = next.run(req).await;
    let elapsed: Duration = start.elapsed();
    state
        .metrics
        .observe(&method, &route, response.status().as_u16(), elapsed);
    response
}
