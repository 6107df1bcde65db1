//! `/ui/processes/{process}/items/{key}`: any known key, converged ones included:
//! its current run, its runs and last error, with retry and park buttons for
//! admins.

use axum::extract::State;
use axum::response::Html;
use maud::{Markup, html};

use serde::Deserialize;

use super::layout::{HtmlError, at, at_or_dash, item_action_path, named_page, process_path, span};
use super::names::name;
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::{PathParams, QueryParams};
use crate::server::redact;
use crate::server::role::Role;
use crate::server::state::AppState;
use crate::server::trace_url::TraceUrl;
use crate::store::{
    Item, ItemGet, ItemState, Run, SessionId, SessionInfo, SessionList, StoreEngine as _, TraceId,
};

/// Runs on an item page.
const RUNS: u32 = 50;

/// An item's names, as the query of `/ui/item` and `/ui/item/{action}`
/// (see [`item_path`](super::item_path)).
#[derive(Debug, Deserialize)]
pub(super) struct ItemName {
    /// The process.
    pub(super) process: String,
    /// The key.
    pub(super) key: String,
}

/// A process's name, as the query of `/ui/process` and `/ui/process/…`
/// (see [`process_path`](super::layout::process_path)).
#[derive(Debug, Deserialize)]
pub(super) struct ProcessName {
    /// The process.
    pub(super) process: String,
}

/// `/ui/processes/{process}/items/{key}`: one item and its runs.
pub(super) async fn item(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Html<String>, HtmlError> {
    show(auth?, &state, process, key).await
}

/// `/ui/item?process=…&key=…`: the same page, for names a browser cannot
/// send as path segments.
pub(super) async fn item_by_query(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    QueryParams(name): QueryParams<ItemName>,
) -> Result<Html<String>, HtmlError> {
    show(auth?, &state, name.process, name.key).await
}

/// The page of the item `key` of `process`.
async fn show(
    auth: Authorized<Read>,
    state: &AppState,
    process: String,
    key: String,
) -> Result<Html<String>, HtmlError> {
    let mut detail = state
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
    if !redact::shows_tokens(&auth) {
        detail.item.lease_token = None;
        for run in &mut detail.runs {
            run.token = None;
        }
    }
    let worker = match detail.item.lease_session {
        // The one session from a page of one starting just before it: a seek,
        // not a read of every session.
        Some(id) => {
            let sessions = state
                .store
                .session_list(SessionList {
                    after: Some(SessionId(id.0.saturating_sub(1))),
                    limit: 1,
                    leases_per_session: 0,
                })
                .await
                .map_err(ApiError::from)?;
            sessions.items.into_iter().find(|s| s.id == id)
        }
        None => None,
    };
    let traces = state.options.trace_url.as_ref();
    let page = view(&detail.item, &detail.runs, worker.as_ref(), admin, traces);
    Ok(Html(page.into_string()))
}

/// One known key with its runs, converged or not; admins get the retry and
/// park buttons. A traced run's trace id links to `traces` when given; the
/// trace column shows only when a run on the page was traced.
fn view(
    item: &Item,
    runs: &[Run],
    worker: Option<&SessionInfo>,
    admin: bool,
    traces: Option<&TraceUrl>,
) -> Markup {
    let running = item.state == ItemState::Running;
    let traced = runs.iter().any(|r| r.trace_id.is_some());
    let body = html! {
        p { "Process " a href=(process_path(&item.process, &[])) { (name(&item.process)) } }
        table id="item" {
            tr { th { "key" } td.key { (name(&item.key)) } }
            tr { th { "state" } td.state { (item.state) } }
            tr { th { "priority" } td { (item.priority) } }
            tr { th { "failed attempts" } td.failures { (item.failures) } }
            tr { th { "pending since" } td { (at(item.enqueued_at)) } }
            @if item.state == ItemState::Pending || item.state == ItemState::Backoff {
                tr { th { "ready at" } td { (at(item.ready_at)) } }
            }
            tr { th { "enqueues" } td.n { (item.enqueue_count) " (first " (at_or_dash(item.first_enqueued_at))
                 ", last " (at_or_dash(item.last_enqueued_at)) ")" } }
            tr { th { "last outcome" } td.outcome {
                (item.last_outcome.map_or("-", |o| o.as_str())) " " (at_or_dash(item.last_ended_at)) } }
            tr { th { "last error" } td.err { (name(item.last_error.as_deref().unwrap_or("-"))) } }
            @if running {
                tr { th { "current run" } td.current {
                    "attempt " (item.failures + 1) ", started " (at_or_dash(item.started_at))
                    ", fencing token " span.token { (item.lease_token.map(|t| t.to_string()).unwrap_or_default()) }
                    ", worker " a.worker href="/ui/workers" {
                        "session " (item.lease_session.map(|s| s.to_string()).unwrap_or_default())
                        @if let Some(w) = worker {
                            " (" (name(&w.component))
                            @if let Some(host) = &w.identity.host { " on " (name(host)) }
                            @if let Some(pid) = w.identity.pid { ", pid " (pid) }
                            ")"
                        }
                    }
                    @if item.dirty { ", runs again after it (changed while running)" } } }
            }
        }
        @if admin && !running {
            form.inline method="post" action=(item_action_path(&item.process, &item.key, "retry")) { button type="submit" { "Retry now" } }
            " "
            @if item.state != ItemState::Parked {
                form.inline method="post" action=(item_action_path(&item.process, &item.key, "park")) { button type="submit" { "Park" } }
            }
        }
        h2 { "Runs" }
        table id="runs" {
            tr { th { "ended" } th { "outcome" } th { "attempt" } th { "queue wait" } th { "duration" }
                 th { "token" } th { "by" } @if traced { th { "trace" } } th { "error" } }
            @for r in runs {
                tr { td { (at(r.ended_at)) } td.outcome { (r.outcome) }
                     td.n { (r.attempt.map(|a| a.to_string()).unwrap_or_default()) }
                     td.n { (span(r.queue_wait())) } td.n { (span(r.duration())) }
                     td.n.token { (r.token.map(|t| t.to_string()).unwrap_or_default()) }
                     td { (name(r.actor.as_deref().unwrap_or(""))) }
                     @if traced { td.trace { (trace(r.trace_id, traces)) } }
                     td.err { (name(r.error.as_deref().unwrap_or(""))) } }
            }
        }
    };
    named_page(&[&item.process, &item.key], true, body)
}

/// A run's trace id: a link into the tracing UI when there is a template,
/// the id as text otherwise, nothing for an untraced run.
fn trace(id: Option<TraceId>, traces: Option<&TraceUrl>) -> Markup {
    html! {
        @match (id, traces) {
            (Some(id), Some(url)) => a.trace href=(url.link(id)) { (id) },
            (Some(id), None) => code { (id) },
            (None, _) => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_a_link_with_a_template_and_text_without() {
        let id = TraceId::parse("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        let url = TraceUrl::parse("https://ui.example/t/{trace_id}?a&b").unwrap();
        assert_eq!(
            trace(Some(id), Some(&url)).into_string(),
            "<a class=\"trace\" href=\"https://ui.example/t/4bf92f3577b34da6a3ce929d0e0e4736?a&amp;b\">\
             4bf92f3577b34da6a3ce929d0e0e4736</a>"
        );
        assert_eq!(
            trace(Some(id), None).into_string(),
            "<code>4bf92f3577b34da6a3ce929d0e0e4736</code>"
        );
        assert_eq!(trace(None, Some(&url)).into_string(), "");
    }
}
