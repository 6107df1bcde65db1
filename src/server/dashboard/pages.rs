//! The dashboard's pages: read the store, render [`view`](super::view).

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{item_path, segment, view};
use crate::api::{MAX_PAGE, TriageQuery};
use crate::server::auth::{Authorized, Read, Role};
use crate::server::error::ApiError;
use crate::server::extract::{PathParams, QueryParams};
use crate::server::routes::items::triage_page;
use crate::server::routes::processes::summaries;
use crate::server::state::AppState;
use crate::store::{ErrorGroups, ItemGet, ProcessSeries, SessionList, StoreEngine as _};

/// Items per process page.
const PAGE: u32 = 100;
/// Runs on an item page.
const RUNS: u32 = 50;
/// Error groups on a process page.
const GROUPS: u32 = 20;

/// An [`ApiError`] shown as an HTML page (with the Basic-auth challenge on 401,
/// so a browser asks for the token).
#[derive(Debug)]
pub(super) struct HtmlError(pub(super) ApiError);

impl From<ApiError> for HtmlError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for HtmlError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let page = view::error(title, &self.0.to_string());
        let mut response = (status, Html(page.into_string())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Basic realm="drover""#),
            );
        }
        response
    }
}

/// `/`: every process and the key search.
pub(super) async fn overview(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
) -> Result<Html<String>, HtmlError> {
    auth?;
    let processes = summaries(&state).await?;
    let settings = state.store.process_list().await.map_err(ApiError::from)?;
    let now = state.store.clock_now().await.map_err(ApiError::from)?;
    let resyncs = view::Resyncs {
        settings: &settings,
        now,
    };
    Ok(Html(view::overview(&processes, &resyncs).into_string()))
}

/// The key search form's parameters.
#[derive(Debug, Deserialize)]
pub(super) struct Search {
    process: String,
    #[serde(default)]
    key: String,
}

/// `/ui/search`: to the item's page (or the process's, without a key).
pub(super) async fn search(
    auth: Result<Authorized<Read>, ApiError>,
    QueryParams(search): QueryParams<Search>,
) -> Result<Redirect, HtmlError> {
    auth?;
    let key = search.key.trim();
    if key.is_empty() {
        return Ok(Redirect::to(&format!(
            "/ui/processes/{}",
            segment(&search.process)
        )));
    }
    Ok(Redirect::to(&item_path(&search.process, key)))
}

/// `/ui/processes/{process}`: its error groups and its items.
pub(super) async fn process(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    QueryParams(mut query): QueryParams<TriageQuery>,
) -> Result<Html<String>, HtmlError> {
    let admin = auth?.role >= Role::Admin;
    query.limit = Some(query.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE));
    query.prefix = query.prefix.filter(|p| !p.is_empty());
    let filter = view::Filter {
        state: query.state.map(Into::into),
        prefix: query.prefix.clone(),
    };
    let page = triage_page(&state, process.clone(), query).await?;
    let reads = &state.slow_reads;
    let store = &state.store;
    let groups = reads.groups(
        &process,
        store.error_groups(ErrorGroups {
            process: process.clone(),
            limit: GROUPS,
        }),
    );
    let series = reads.series(
        &process,
        store.process_series(ProcessSeries {
            process: process.clone(),
            window: crate::server::routes::series::WINDOW,
        }),
    );
    let ((groups, age), (series, _)) = tokio::try_join!(groups, series).map_err(ApiError::from)?;
    let next = page.next.map(|c| c.to_string());
    let listing = view::Listing {
        filter,
        items: &page.items,
        next: next.as_deref(),
    };
    let settings = state.store.process_list().await.map_err(ApiError::from)?;
    let limits = settings
        .iter()
        .find(|s| s.process == process)
        .map(|s| &s.limits);
    let fleet = super::fleet::section(&process, limits, admin);
    let now = state.store.clock_now().await.map_err(ApiError::from)?;
    let resyncs = view::Resyncs {
        settings: &settings,
        now,
    };
    let page = view::process(
        &process,
        fleet,
        (&groups, age),
        &series,
        admin,
        &listing,
        &resyncs,
    );
    Ok(Html(page.into_string()))
}

/// `/ui/processes/{process}/items/{key}`: one item and its runs.
pub(super) async fn item(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Html<String>, HtmlError> {
    let auth = auth?;
    let detail = state
        .store
        .item_get(ItemGet {
            process,
            key,
            runs_limit: RUNS,
        })
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::NotFound("no such item".into()))?;
    let admin = auth.role >= Role::Admin;
    let worker = match detail.item.lease_session {
        Some(id) => {
            let sessions = state
                .store
                .session_list(SessionList {
                    leases_per_session: 0,
                })
                .await
                .map_err(ApiError::from)?;
            sessions.into_iter().find(|s| s.id == id)
        }
        None => None,
    };
    let page = view::item(&detail.item, &detail.runs, worker.as_ref(), admin);
    Ok(Html(page.into_string()))
}
