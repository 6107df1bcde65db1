//! Items of a process: enqueue, list, read one with its runs, and the admin
//! actions retry, park and delete.
//!
//! Keys travel in the path percent-encoded (`ns%2Fname` for `ns/name`).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use crate::api::ErrorBody;
use crate::api::{
    EnqueueRequest, EnqueueResponse, ItemBody, ItemDetailBody, ItemGetQuery, ItemListQuery,
    ItemPage, MAX_ENQUEUE_KEYS, MAX_PAGE, TriagePageBody, TriageQuery, max_delay_ms, ms,
};
use crate::server::auth::{Authorized, Manage, Read, Work};
use crate::server::error::ApiError;
use crate::server::extract::{JsonBody, PathParams, QueryParams};
use crate::server::operations::{page_limit, triage_page};
use crate::server::redact;
use crate::server::role::Role;
use crate::server::spans::enqueue_context;
use crate::server::state::AppState;
use crate::store::{
    ItemDelete, ItemEnqueue, ItemGet, ItemList, ItemPark, ItemRetry, StoreEngine as _,
    validate_key, validate_process,
};

/// The reason an operator's park records.
const PARK_REASON: &str = "parked by an operator";

/// Enqueues keys for a process, coalescing with pending and running ones. All
/// keys are checked first: one invalid key (422) means none is written.
#[utoipa::path(
    post, operation_id = "enqueue", path = "/v1/processes/{process}/items", tag = "work",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process (control loop)")),
    request_body = EnqueueRequest,
    responses(
        (status = 200, description = "Enqueued", body = EnqueueResponse),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 422, description = "Invalid key or process name, or a new process over the server's limit", body = ErrorBody),
    )
)]
pub(crate) async fn enqueue(
    _: Authorized<Work>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<EnqueueRequest>,
) -> Result<Json<EnqueueResponse>, ApiError> {
    validate_process(&process)?;
    if body.after_ms > max_delay_ms() {
        return Err(ApiError::field(
            "after_ms",
            format!("after_ms must be at most {}", max_delay_ms()),
        ));
    }
    if body.keys.len() > MAX_ENQUEUE_KEYS {
        return Err(ApiError::field(
            "keys",
            format!(
                "an enqueue holds at most {MAX_ENQUEUE_KEYS} keys, got {}: send them in several",
                body.keys.len()
            ),
        ));
    }
    for (i, key) in body.keys.iter().enumerate() {
        validate_key(key).map_err(|e| ApiError::Unprocessable {
            code: "invalid_key",
            field: "keys",
            message: format!("keys[{i}]: {e}"),
        })?;
    }
    if body.keys.is_empty() {
        // Creates nothing, so it takes none of the room `max_processes`
        // leaves for new processes (see `known.rs`).
        return Ok(Json(EnqueueResponse {
            pending: 0,
            dirty: 0,
        }));
    }
    let admitted = state
        .known
        .admit(&state.store, &process, state.options.max_processes);
    if let Err(e) = admitted.await {
        if matches!(e, ApiError::TooManyProcesses(_)) {
            state.metrics.enqueue_refused();
        }
        return Err(e);
    }
    let params = ItemEnqueue::new(process.clone(), body.keys)
        .after(ms(body.after_ms))
        .priority(body.priority)
        .bypass_backoff(body.bypass_backoff)
        .trace(enqueue_context(&headers));
    let report = state.store.item_enqueue(params).await?;
    // The keys written, each once: a key given twice in the body is one add.
    state
        .metrics
        .enqueued(&process, report.pending + report.dirty);
    Ok(Json(EnqueueResponse {
        pending: report.pending,
        dirty: report.dirty,
    }))
}

/// Lists a process's items in key order, optionally in one state, a page at a
/// time.
#[utoipa::path(
    get, operation_id = "list_items", path = "/v1/processes/{process}/items", tag = "read",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process"), ItemListQuery),
    responses(
        (status = 200, description = "A page of items", body = ItemPage),
        (status = 400, description = "Bad query parameter", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    auth: Authorized<Read>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    QueryParams(query): QueryParams<ItemListQuery>,
) -> Result<Json<ItemPage>, ApiError> {
    let limit = page_limit(query.limit, 100)?;
    validate_process(&process)?;
    if let Some(after) = &query.after_key {
        // A bad cursor is a bad query parameter (400), as triage's is.
        validate_key(after).map_err(|e| ApiError::field("after_key", e.to_string()))?;
    }
    let items = state
        .store
        .item_list(ItemList {
            process,
            state: query.state.map(Into::into),
            after_key: query.after_key,
            limit,
        })
        .await?;
    let next_after_key = (items.len() == limit as usize)
        .then(|| items.last().map(|i| i.key.clone()))
        .flatten();
    let items = items.into_iter().map(Into::into).collect();
    Ok(Json(ItemPage {
        items: redact::items(items, redact::shows_tokens(&auth)),
        next_after_key,
    }))
}

/// Lists a process's items in the order an operator looks at them: parked
/// first, then backing off (soonest retry first), then pending in the order
/// workers take them (highest priority, longest waiting), then running, then
/// idle; optionally one state and keys with a prefix (each state then in key
/// order). Paged by an opaque cursor, so every page costs the same.
#[utoipa::path(
    get, operation_id = "triage", path = "/v1/processes/{process}/triage", tag = "read",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process"), TriageQuery),
    responses(
        (status = 200, description = "A page of items", body = TriagePageBody),
        (status = 400, description = "Bad query parameter or cursor", body = ErrorBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn triage(
    auth: Authorized<Read>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    QueryParams(query): QueryParams<TriageQuery>,
) -> Result<Json<TriagePageBody>, ApiError> {
    let page = triage_page(&state, process, query).await?;
    let items = page.items.into_iter().map(Into::into).collect();
    Ok(Json(TriagePageBody {
        items: redact::items(items, redact::shows_tokens(&auth)),
        next: page.next.map(|c| c.to_string()),
    }))
}

/// One known key (idle ones included) with its newest runs.
#[utoipa::path(
    get, operation_id = "get_item", path = "/v1/processes/{process}/items/{key}", tag = "read",
    security(("bearer" = [])),
    params(
        ("process" = String, Path, description = "The process"),
        ("key" = String, Path, description = "The key, percent-encoded"),
        ItemGetQuery,
    ),
    responses(
        (status = 200, description = "The item and its runs", body = ItemDetailBody),
        (status = 400, description = "Bad query parameter", body = ErrorBody),
        (status = 404, description = "No such item", body = ErrorBody),
    )
)]
pub(crate) async fn get(
    auth: Authorized<Read>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
    QueryParams(query): QueryParams<ItemGetQuery>,
) -> Result<Json<ItemDetailBody>, ApiError> {
    let runs_limit = query.runs_limit.unwrap_or(50);
    if runs_limit > MAX_PAGE {
        return Err(ApiError::field(
            "runs_limit",
            "runs_limit must be at most 1000",
        ));
    }
    let detail = state
        .store
        .item_get(ItemGet {
            process,
            key,
            runs_limit,
        })
        .await?
        .ok_or_else(no_item)?;
    Ok(Json(redact::item(
        detail.into(),
        redact::shows_tokens(&auth),
    )))
}

fn no_item() -> ApiError {
    ApiError::NotFound("no such item".into())
}

/// Makes an item pending at once: its backoff or park is cut short, its failure
/// count kept. Refused (409) while a worker holds it.
#[utoipa::path(
    post, operation_id = "retry_item", path = "/v1/processes/{process}/items/{key}/retry", tag = "admin",
    security(("bearer" = [])),
    params(
        ("process" = String, Path, description = "The process"),
        ("key" = String, Path, description = "The key, percent-encoded"),
    ),
    responses(
        (status = 200, description = "The item, pending now", body = ItemBody),
        (status = 400, description = "Malformed path", body = ErrorBody),
        (status = 404, description = "No such item", body = ErrorBody),
        (status = 409, description = "The item is running", body = ErrorBody),
    )
)]
pub(crate) async fn retry(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Json<ItemBody>, ApiError> {
    let item = state
        .store
        .item_retry(ItemRetry {
            process,
            key,
            actor: Role::Admin.to_string(),
        })
        .await?
        .ok_or_else(no_item)?;
    Ok(Json(item.into()))
}

/// Parks an item: it does not run until the next enqueue or retry. Refused (409)
/// while a worker holds it.
#[utoipa::path(
    post, operation_id = "park_item", path = "/v1/processes/{process}/items/{key}/park", tag = "admin",
    security(("bearer" = [])),
    params(
        ("process" = String, Path, description = "The process"),
        ("key" = String, Path, description = "The key, percent-encoded"),
    ),
    responses(
        (status = 200, description = "The item, parked", body = ItemBody),
        (status = 400, description = "Malformed path", body = ErrorBody),
        (status = 404, description = "No such item", body = ErrorBody),
        (status = 409, description = "The item is running", body = ErrorBody),
    )
)]
pub(crate) async fn park(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Json<ItemBody>, ApiError> {
    let params = ItemPark {
        process,
        key,
        reason: PARK_REASON.to_owned(),
        actor: Role::Admin.to_string(),
    };
    let item = state.store.item_park(params).await?.ok_or_else(no_item)?;
    Ok(Json(item.into()))
}

/// Forgets a key: its item is deleted, its runs stay until retention removes
/// them. Refused (409) while a worker holds it.
#[utoipa::path(
    delete, operation_id = "delete_item", path = "/v1/processes/{process}/items/{key}", tag = "admin",
    security(("bearer" = [])),
    params(
        ("process" = String, Path, description = "The process"),
        ("key" = String, Path, description = "The key, percent-encoded"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Malformed path", body = ErrorBody),
        (status = 404, description = "No such item", body = ErrorBody),
        (status = 409, description = "The item is running", body = ErrorBody),
    )
)]
pub(crate) async fn delete(
    _: Authorized<Manage>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let params = ItemDelete {
        process,
        key,
        actor: Role::Admin.to_string(),
    };
    if state.store.item_delete(params).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_item())
    }
}
