//! `/ui/workers`: the sessions, a page at a time, oldest first — who runs
//! each (component, host, pid, version), since when, its last heartbeat and
//! deadline — and the leases it holds (key, since, fencing token); sessions
//! past their deadline are shown as awaiting reclaim.

use axum::extract::State;
use axum::response::Html;
use maud::{Markup, html};

use super::item_path;
use super::layout::{HtmlError, at, at_or_dash, next_link, page, paged};
use super::names::name;
use crate::api::{MAX_PAGE, SESSION_PAGE, SessionListQuery};
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::QueryParams;
use crate::server::operations::session_page;
use crate::server::redact;
use crate::server::state::AppState;
use crate::store::SessionInfo;

/// `/ui/workers`: one page of the sessions (`after`, `limit` as `GET
/// /v1/sessions` takes them, a limit out of range brought within it as the
/// process page does).
pub(super) async fn workers(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    QueryParams(mut query): QueryParams<SessionListQuery>,
) -> Result<Html<String>, HtmlError> {
    let shown = redact::shows_tokens(&auth?);
    let asked = query.limit.map(|l| l.clamp(1, MAX_PAGE));
    query.limit = Some(asked.unwrap_or(SESSION_PAGE));
    let first = query.after.is_none();
    let sessions = session_page(&state, query).await?;
    let next = sessions
        .next
        .map(|n| next_link("/ui/workers", asked, &n.to_string()));
    Ok(Html(
        view(&sessions.items, first, next, shown).into_string(),
    ))
}

/// The page: its sessions, the link to the next page (`next`, when there is
/// one); fencing tokens only when `shown` (see `redact.rs`).
fn view(sessions: &[SessionInfo], first: bool, next: Option<Markup>, shown: bool) -> Markup {
    let table = (!sessions.is_empty()).then(|| {
        html! {
            table id="workers" {
                tr { th { "session" } th { "component" } th { "host" } th { "pid" } th { "version" }
                     th { "since" } th { "last heartbeat" } th { "deadline" } th { "leases" } }
                @for s in sessions { (row(s, shown)) }
            }
        }
    });
    let none = html! {
        "No sessions: no worker is running (start one with "
        code { "drover work PROCESS --exec CMD" } ")."
    };
    let body = paged(table, first, none, "sessions", next);
    page("Workers", true, body)
}

fn row(s: &SessionInfo, shown: bool) -> Markup {
    let dash = || "-".to_owned();
    html! {
        tr.session data-session=(s.id.0) {
            td.n { (s.id.0) } td.component { (name(&s.component)) }
            td.host { (name(&s.identity.host.clone().unwrap_or_else(dash))) }
            td.n { (s.identity.pid.map_or_else(dash, |p| p.to_string())) }
            td { (name(&s.identity.version.clone().unwrap_or_else(dash))) }
            td { (at(s.started_at)) } td { (at(s.heartbeat_at)) }
            td.deadline {
                (at(s.deadline))
                @if s.expired { " " strong.err.expired { "expired, awaiting reclaim" } }
            }
            td.n.leases { (s.lease_count) }
        }
        @if !s.leases.is_empty() {
            tr.held { td {} td colspan="8" {
                table.leases {
                    tr { th { "process" } th { "key" } th { "since" } th { "fencing token" } }
                    @for l in &s.leases {
                        tr { td { (name(&l.process)) } td.key { a href=(item_path(&l.process, &l.key)) { (name(&l.key)) } }
                             td { (at_or_dash(l.started_at)) } td.n.token { @if shown { (l.token) } @else { "hidden" } } }
                    }
                }
                @if s.lease_count > s.leases.len() as u64 {
                    p { "… and " (s.lease_count - s.leases.len() as u64) " more." }
                }
            } }
        }
    }
}
