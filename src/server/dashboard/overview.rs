//! `/`: the processes, a page at a time, with their counts, recent
//! throughput and failures, and the key search (`/ui/search`).

use std::time::Duration;

use axum::extract::State;
use axum::response::{Html, Redirect};
use maud::{Markup, html};
use serde::Deserialize;

use super::actions::percent_decoded;
use super::layout::{HtmlError, Resyncs, age, item_path, next_link, page, paged, process_path};
use super::names::{isolated, name};
use crate::api::path_segment;
use crate::api::{MAX_PAGE, PROCESS_PAGE, ProcessList, ProcessListQuery, ProcessSummary};
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::QueryParams;
use crate::server::operations::process_summaries;
use crate::server::state::AppState;
use crate::store::{ProcessPage, StoreEngine as _};

/// `/`: one page of the processes (`after`, `limit` as `GET /v1/processes`
/// takes them, a limit out of range brought within it as the process page
/// does) and the key search.
pub(super) async fn overview(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    QueryParams(mut query): QueryParams<ProcessListQuery>,
) -> Result<Html<String>, HtmlError> {
    auth?;
    let asked = query.limit.map(|l| l.clamp(1, MAX_PAGE));
    query.limit = Some(asked.unwrap_or(PROCESS_PAGE));
    let first = query.after.is_none();
    let page = ProcessPage {
        after: query.after.clone(),
        limit: query.limit.unwrap_or(PROCESS_PAGE),
    };
    let list = process_summaries(&state, query).await?;
    // The settings of the page's processes only (of those made since the
    // counts were read, a row shows `never` until the next view).
    let settings = (state.store.process_settings(page).await)
        .map_err(ApiError::from)?
        .items;
    let now = state.store.clock_now().await.map_err(ApiError::from)?;
    let resyncs = Resyncs {
        settings: &settings,
        now,
    };
    let next = list.next.as_deref().map(|n| next_link("/", asked, n));
    Ok(Html(view(&list, first, next, &resyncs).into_string()))
}

/// The overview: one row per process of the page, the link to the next page
/// (`next`, when there is one), and the key search.
fn view(list: &ProcessList, first: bool, next: Option<Markup>, resyncs: &Resyncs<'_>) -> Markup {
    let processes = &list.processes;
    let table = (!processes.is_empty()).then(|| {
        html! {
            table id="processes" {
                tr { th { "process" } th { "pending" } th { "backoff" } th { "running" } th { "parked" }
                     th { "oldest pending" } th { "finished (5 min)" } th { "failed (5 min)" } th { "failure rate" }
                     th { "resync" } }
                @for p in processes { (process_row(p, resyncs)) }
            }
        }
    });
    let none = html! {
        "No processes yet: enqueue keys with " code { "drover enqueue PROCESS KEY" } " or "
        code { "POST /v1/processes/{process}/items" } "."
    };
    let body = html! {
        (search_form(processes))
        (paged(table, first, none, "processes", next))
    };
    page("Processes", true, body)
}

fn process_row(p: &ProcessSummary, resyncs: &Resyncs<'_>) -> Markup {
    let ended = p.recent_finished + p.recent_failed;
    let rate = if ended == 0 {
        "-".to_owned()
    } else {
        format!("{:.0}%", p.recent_failed as f64 * 100.0 / ended as f64)
    };
    let oldest = p
        .oldest_pending_age_ms
        .map_or_else(|| "-".to_owned(), |ms| age(Duration::from_millis(ms)));
    html! {
        tr data-process=(p.process) {
            td { a href=(process_path(&p.process, &[])) { (name(&p.process)) } }
            td.n.pending { (p.pending) } td.n.backoff { (p.backoff) } td.n.running { (p.running) }
            td.n.parked { (p.parked) } td.n { (oldest) } td.n { (p.recent_finished) }
            td.n { (p.recent_failed) } td.n { (rate) } td.resync { (resyncs.describe(&p.process)) }
        }
    }
}

/// The key search, over the processes of the page shown (a process of
/// another page is reached from its page, or by `/ui/search?process=…`).
/// Each process is sent percent-encoded: a browser sends a form field's
/// line breaks as CRLF, whatever they were (and its HTML parser reads a
/// lone CR in an attribute as a line feed), so a name holding one would
/// reach another process.
fn search_form(processes: &[ProcessSummary]) -> Markup {
    html! {
        form action="/ui/search" method="get" {
            label { "Find a key in " select name="process_encoded" {
                @for p in processes { option value=(path_segment(&p.process)) { (isolated(&p.process)) } }
            } }
            " " input type="search" name="key" placeholder="key" required;
            " " button type="submit" { "Find" }
        }
    }
}

/// The key search form's parameters: the process as text (a link's
/// `?process=…`) or percent-encoded (the form's), and the key exactly as
/// typed (a key may begin or end with a space).
#[derive(Debug, Deserialize)]
pub(super) struct Search {
    process: Option<String>,
    process_encoded: Option<String>,
    #[serde(default)]
    key: String,
}

impl Search {
    /// The process the search names.
    fn process(&self) -> Result<String, ApiError> {
        match (&self.process, &self.process_encoded) {
            (Some(text), None) => Ok(text.clone()),
            (None, Some(encoded)) => percent_decoded(encoded).ok_or_else(|| {
                ApiError::field("process_encoded", "a percent-encoded UTF-8 process name")
            }),
            _ => Err(ApiError::field(
                "process",
                "a process (or a process_encoded), not both",
            )),
        }
    }
}

/// `/ui/search`: to the item's page (or the process's, without a key).
pub(super) async fn search(
    auth: Result<Authorized<Read>, ApiError>,
    QueryParams(search): QueryParams<Search>,
) -> Result<Redirect, HtmlError> {
    auth?;
    let process = search.process()?;
    if search.key.is_empty() {
        return Ok(Redirect::to(&process_path(&process, &[])));
    }
    Ok(Redirect::to(&item_path(&process, &search.key)))
}
