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
pub(crate) mod traces;

use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::openapi::ApiDoc;
use super::state::AppState;

/// The JSON API and the operators' routes (the dashboard is added separately),
/// with their OpenAPI description. Each handler's path, method and responses
/// are written once, in its `#[utoipa::path]`: `routes!` takes the route from
/// there, and the document ([`openapi::document`](super::openapi::document))
/// is what this router describes. Handlers of one path go in one `routes!`.
pub(crate) fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(processes::list))
        .routes(routes!(items::list, items::enqueue))
        .routes(routes!(items::get, items::delete))
        .routes(routes!(items::triage))
        .routes(routes!(runs::list))
        .routes(routes!(series::get))
        .routes(routes!(settings::get, settings::configure))
        .routes(routes!(settings::pause))
        .routes(routes!(settings::resume))
        .routes(routes!(settings::pause_by_query))
        .routes(routes!(settings::resume_by_query))
        .routes(routes!(groups::list))
        .routes(routes!(groups::retry))
        .routes(routes!(groups::park))
        .routes(routes!(groups::delete))
        .routes(routes!(items::retry))
        .routes(routes!(items::park))
        .routes(routes!(sessions::list, sessions::start))
        .routes(routes!(sessions::close))
        .routes(routes!(sessions::heartbeat))
        .routes(routes!(leases::claim))
        .routes(routes!(leases::complete))
        .routes(routes!(leases::complete_batch))
        .routes(routes!(leases::release))
        .routes(routes!(traces::link))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(health::openapi))
}
