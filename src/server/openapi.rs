//! The OpenAPI 3 document, generated from the handlers' annotations and the
//! model's types, so it cannot drift from the code.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::auth::Role;
use super::error::ErrorBody;
use super::model::{
    BulkParkRequest, BulkRequest, BulkResponse, BulkState, ClaimRequest, ClaimResponse,
    CloseResponse, CompleteBatchRequest, CompleteBatchResponse, CompleteRequest, CompletionResult,
    DepthPointBody, EnqueueRequest, EnqueueResponse, ErrorGroupBody, ErrorGroupList, Health,
    HeartbeatResponse, HeldLeaseBody, ItemBody, ItemDetailBody, ItemPage, LeaseBody, LeaseRef,
    OutcomeBody, OutcomeName, ProcessList, ProcessSummary, ReleaseRequest, RunBody, RunBucketBody,
    RunPage, SeriesBody, SessionBody, SessionInfoBody, SessionListBody, SessionRequest, StateName,
    TriagePageBody,
};
use super::model::{PauseResponse, ProcessConfigureRequest, ProcessSettingsBody};
use super::routes::{groups, health, items, leases, processes, runs, series, sessions, settings};

/// The API description served at `/openapi.json`.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "drover",
        description = "Keyed work with coalescing, durable per-key backoff and fenced leases. \
            Send `Authorization: Bearer TOKEN` when the server has tokens (roles: viewer reads, \
            worker also enqueues and works, admin also retries, parks and deletes). \
            Keys in paths are percent-encoded. \
            Every request but GET, HEAD and OPTIONS that a browser marks as another \
            site's (`Sec-Fetch-Site` other than `same-origin` or `none`; without it, an \
            `Origin` whose host is not the request's `Host`) is refused with 403 \
            `cross_origin` before authentication; programs that send neither header \
            are not affected."
    ),
    paths(
        processes::list,
        items::enqueue, items::list, items::triage, items::get, items::retry, items::park, items::delete,
        runs::list, series::get,
        groups::list, groups::retry, groups::park, groups::delete,
        settings::get, settings::configure, settings::pause, settings::resume,
        sessions::list, sessions::start, sessions::heartbeat, sessions::close,
        leases::claim, leases::complete, leases::complete_batch, leases::release,
        health::healthz, health::readyz, health::metrics, health::openapi,
    ),
    components(schemas(
        ErrorBody, Role, EnqueueRequest, EnqueueResponse, ProcessList, ProcessSummary,
        StateName, ItemBody, ItemPage, TriagePageBody, RunBody, RunPage, OutcomeName,
        ItemDetailBody, SessionRequest, SessionBody, SessionListBody, SessionInfoBody,
        HeldLeaseBody, SeriesBody, RunBucketBody, DepthPointBody,
        HeartbeatResponse, CloseResponse, ClaimRequest, ClaimResponse, LeaseBody, LeaseRef,
        OutcomeBody, CompleteRequest, CompleteBatchRequest, CompleteBatchResponse,
        CompletionResult, ReleaseRequest, Health, ErrorGroupBody, ErrorGroupList, BulkRequest,
        BulkParkRequest, BulkState, BulkResponse,
        ProcessSettingsBody, ProcessConfigureRequest, PauseResponse,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "work", description = "Producers and workers: enqueue, sessions, leases"),
        (name = "read", description = "Processes and items"),
        (name = "admin", description = "Operators' actions on items, one key or every key a filter matches, and on processes (settings, pause, resume)"),
        (name = "ops", description = "Health, readiness, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme the paths refer to.
#[derive(Debug)]
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document.
#[must_use]
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
