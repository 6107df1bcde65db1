//! `/healthz`, `/readyz`, `/metrics` and `/openapi.json`: the routes operators'
//! tools call.

use std::sync::LazyLock;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use serde_json::Value;

use crate::api::Health;
use crate::metrics::StoreFamilies;
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::openapi;
use crate::server::state::AppState;
use crate::store::rules::pages;
use crate::store::{Store, StoreEngine as _};

/// The process is up (no database call; never needs a token).
#[utoipa::path(
    get, path = "/healthz", tag = "ops",
    responses((status = 200, description = "Up", body = Health))
)]
pub(crate) async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        database: state.store.engine_name().into(),
    })
}

/// The database answers (one clock query; never needs a token). 503 when it
/// does not, so load balancers stop routing here.
#[utoipa::path(
    get, path = "/readyz", tag = "ops",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "The database does not answer", body = Health),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let database = state.store.engine_name().to_owned();
    match state.store.clock_now().await {
        Ok(_) => (
            StatusCode::OK,
            Json(Health {
                status: "ok".into(),
                database,
            }),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            let status = "unavailable".into();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health { status, database }),
            )
        }
    }
}

/// Prometheus metrics (OpenMetrics text): queue and runner metrics of this
/// process, HTTP request counts and latencies, pool gauges, item counts.
#[utoipa::path(
    get, path = "/metrics", tag = "ops",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "OpenMetrics text", body = String,
         content_type = "application/openmetrics-text"),
    )
)]
pub(crate) async fn metrics(
    _: Authorized<Read>,
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let store = &state.store;
    let text = state.metrics.render(async |families| {
        read_store(store, families, state.options.metrics_max_processes).await
    });
    let text = text.await.map_err(|_| {
        tracing::error!("cannot encode metrics");
        ApiError::Internal
    })?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}

/// This API's OpenAPI 3 document (never needs a token). A server without
/// tokens serves it without security requirements, as it checks none.
#[utoipa::path(
    get, path = "/openapi.json", tag = "ops",
    responses((status = 200, description = "The OpenAPI document", body = Object))
)]
pub(crate) async fn openapi(State(state): State<AppState>) -> Response {
    static WITH_TOKENS: LazyLock<Value> = LazyLock::new(openapi::document);
    static WITHOUT_TOKENS: LazyLock<Value> = LazyLock::new(openapi::document_without_tokens);
    let document = if state.options.requires_tokens() {
        &*WITH_TOKENS
    } else {
        &*WITHOUT_TOKENS
    };
    Json(document).into_response()
}

/// Any route the server does not have: a JSON 404.
pub(crate) async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

/// A known route with a method it does not take: a JSON 405.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Sets the store's scrape-time gauges from what the database holds now. A
/// failing query leaves its gauges out rather than failing the scrape (the
/// pool figures and the rest still help).
///
/// Only the first `max` processes in name order get series (DESIGN.md rule
/// 13): a database a store or `drover enqueue` filled past the server's
/// process cap made every scrape read each process (an oldest-item query
/// each) and write about 35 lines each, 2.4 KB: 4.8 MB at 2,000 processes,
/// about 240 MB at 100,000, and as many queue handles kept for good.
async fn read_store(store: &Store, families: &StoreFamilies, max: usize) {
    let pool = store.pool_stats();
    families.set_pool(pool.idle, pool.size.saturating_sub(pool.idle), pool.max);
    let counts = pages::first_processes(|page| store.process_counts(page), max).await;
    families.clear_items();
    let mut truncated = false;
    match counts {
        Ok((counts, more)) => {
            truncated |= more;
            for c in counts {
                let states = [
                    ("pending", c.pending),
                    ("backoff", c.backoff),
                    ("running", c.running),
                    ("parked", c.parked),
                ];
                let oldest = c.oldest_pending_age.unwrap_or_default();
                families.set_items(&c.process, states, oldest);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count items for /metrics"),
    }
    let settings = pages::first_processes(|page| store.process_settings(page), max).await;
    families.clear_paused();
    match settings {
        Ok((settings, more)) => {
            truncated |= more;
            for s in settings {
                families.set_paused(&s.process, s.limits.paused);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read process settings for /metrics"),
    }
    families.set_truncated(truncated);
}
