//! The HTTP routes, one file per resource, assembled into one [`axum::Router`].
//!
//! | class | routes | least role |
//! | --- | --- | --- |
//! | open | `/healthz`, `/readyz`, `/openapi.json` | none |
//! | read | `GET /v1/processes…` (items, runs, error groups, settings), `/metrics`, the dashboard | viewer |
//! | work | enqueue, `/v1/sessions…`, `/v1/leases/…` | worker |
//! | admin | retry, park, delete, of one key or by filter (API and dashboard buttons); process settings, pause, resume | admin |

pub(crate) mod groups;
pub(crate) mod health;
pub(crate) mod items;
pub(crate) mod leases;
pub(crate) mod processes;
pub(crate) mod runs;
pub(crate) mod series;
pub(crate) mod sessions;
pub(crate) mod settings;

use axum::Router;
use axum::routing::{delete, get, post};

use super::state::AppState;

/// The JSON API and the operators' routes (the dashboard is added separately).
pub(crate) fn api() -> Router<AppState> {
    Router::new()
        .route("/v1/processes", get(processes::list))
        .route(
            "/v1/processes/{process}/items",
            get(items::list).post(items::enqueue),
        )
        .route(
            "/v1/processes/{process}/items/{key}",
            get(items::get).delete(items::delete),
        )
        .route("/v1/processes/{process}/triage", get(items::triage))
        .route("/v1/processes/{process}/runs", get(runs::list))
        .route("/v1/processes/{process}/series", get(series::get))
        .route(
            "/v1/processes/{process}/settings",
            get(settings::get).patch(settings::configure),
        )
        .route("/v1/processes/{process}/pause", post(settings::pause))
        .route("/v1/processes/{process}/resume", post(settings::resume))
        .route("/v1/processes/{process}/error-groups", get(groups::list))
        .route("/v1/processes/{process}/items:retry", post(groups::retry))
        .route("/v1/processes/{process}/items:park", post(groups::park))
        .route("/v1/processes/{process}/items:delete", post(groups::delete))
        .route(
            "/v1/processes/{process}/items/{key}/retry",
            post(items::retry),
        )
        .route(
            "/v1/processes/{process}/items/{key}/park",
            post(items::park),
        )
        .route("/v1/sessions", get(sessions::list).post(sessions::start))
        .route("/v1/sessions/{session}", delete(sessions::close))
        .route(
            "/v1/sessions/{session}/heartbeat",
            post(sessions::heartbeat),
        )
        .route("/v1/sessions/{session}/claim", post(leases::claim))
        .route("/v1/leases/complete", post(leases::complete))
        .route("/v1/leases/complete-batch", post(leases::complete_batch))
        .route("/v1/leases/release", post(leases::release))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(health::openapi))
}
