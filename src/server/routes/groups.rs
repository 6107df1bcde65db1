//! Error groups and bulk actions: what keeps failing, and retry, park or
//! delete of every key a filter matches (an error group's signature, a state,
//! a key prefix), in batches, each key audited with the actor `admin`.

use axum::Json;
use axum::extract::State;

use crate::api::ErrorBody;
use crate::api::{
    BulkParkRequest, BulkRequest, BulkResponse, BulkState, ErrorGroupList, ErrorGroupsQuery,
};
use crate::server::auth::{Authorized, Manage, Read};
use crate::server::error::ApiError;
use crate::server::extract::{JsonBody, PathParams, QueryParams};
use crate::server::operations::page_limit;
use crate::server::role::Role;
use crate::server::state::AppState;
use crate::store::{
    ErrorGroups, ItemFilter, ItemsDelete, ItemsPark, ItemsRetry, StoreEngine as _, validate_process,
};

/// The reason a bulk park records when the request gives none.
const PARK_REASON: &str = "parked by an operator";

/// The failing keys' errors, grouped by signature, most keys first.
#[utoipa::path(
    get, operation_id = "list_error_groups", path = "/v1/processes/{process}/error-groups", tag = "read",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process"), ErrorGroupsQuery),
    responses(
        (status = 200, description = "The groups", body = ErrorGroupList),
        (status = 400, description = "Bad query parameter", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    _: Authorized<Read>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    QueryParams(query): QueryParams<ErrorGroupsQuery>,
) -> Result<Json<ErrorGroupList>, ApiError> {
    let limit = page_limit(query.limit, 50)?;
    validate_process(&process)?;
    let groups = state
        .store
        .error_groups(ErrorGroups { process, limit })
        .await?;
    Ok(Json(ErrorGroupList {
        groups: groups.into_iter().map(Into::into).collect(),
    }))
}

/// The store's filter for a request's conditions; the store refuses (400) a
/// filter with no condition or one holding a NUL before it reads anything.
fn filter(
    process: String,
    state: Option<BulkState>,
    error: Option<String>,
    key_prefix: Option<String>,
) -> Result<ItemFilter, ApiError> {
    validate_process(&process)?;
    Ok(ItemFilter {
        process,
        state: state.map(Into::into),
        error_signature: error,
        key_prefix,
    })
}

/// Makes every matching key that is not running pending at once (as the
/// single-key retry does), each with a `retried` row.
#[utoipa::path(
    post, operation_id = "retry_items", path = "/v1/processes/{process}/items:retry", tag = "admin",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    request_body = BulkRequest,
    responses(
        (status = 200, description = "How many keys changed", body = BulkResponse),
        (status = 400, description = "Malformed body or no condition", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn retry(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    JsonBody(body): JsonBody<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    let filter = filter(process, body.state, body.error, body.key_prefix)?;
    let params = ItemsRetry::new(filter, Role::Admin.to_string());
    let changed = state.store.items_retry_where(params).await?;
    Ok(Json(BulkResponse { changed }))
}

/// Parks every matching key that is not running, with the reason as its last
/// error, each with a `parked` row.
#[utoipa::path(
    post, operation_id = "park_items", path = "/v1/processes/{process}/items:park", tag = "admin",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    request_body = BulkParkRequest,
    responses(
        (status = 200, description = "How many keys changed", body = BulkResponse),
        (status = 400, description = "Malformed body or no condition", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn park(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    JsonBody(body): JsonBody<BulkParkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    let filter = filter(process, body.state, body.error, body.key_prefix)?;
    let reason = body.reason.unwrap_or_else(|| PARK_REASON.to_owned());
    let params = ItemsPark::new(filter, Role::Admin.to_string(), reason);
    let changed = state.store.items_park_where(params).await?;
    Ok(Json(BulkResponse { changed }))
}

/// Forgets every matching key that is not running, each with a `deleted` row.
#[utoipa::path(
    post, operation_id = "delete_items", path = "/v1/processes/{process}/items:delete", tag = "admin",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    request_body = BulkRequest,
    responses(
        (status = 200, description = "How many keys changed", body = BulkResponse),
        (status = 400, description = "Malformed body or no condition", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn delete(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    JsonBody(body): JsonBody<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    let filter = filter(process, body.state, body.error, body.key_prefix)?;
    let params = ItemsDelete::new(filter, Role::Admin.to_string());
    let changed = state.store.items_delete_where(params).await?;
    Ok(Json(BulkResponse { changed }))
}
