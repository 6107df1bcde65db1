//! `/ui/processes/{process}`: a process's fleet controls, resync, charts, error
//! groups and items, by state, paged.

use std::time::Duration;

use axum::extract::State;
use axum::response::Html;
use maud::{Markup, html};

use super::item::ProcessName;
use super::layout::{
    HtmlError, Resyncs, at, dot_segment, item_path, named_page, process_action_path, process_path,
};
use super::names::name;
use crate::api::{MAX_PAGE, TriageQuery, path_segment};
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::{PathParams, QueryParams};
use crate::server::operations::{SERIES_WINDOW, triage_page};
use crate::server::role::Role;
use crate::server::state::AppState;
use crate::store::{
    ErrorGroup, ErrorGroups, FleetLimits, Item, ItemState, ProcessSeries, Series, StoreEngine as _,
};

/// Items per process page.
const PAGE: u32 = 100;

/// Error groups on a process page.
const GROUPS: u32 = 20;

/// `/ui/processes/{process}`: its error groups and its items.
pub(super) async fn process(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
    QueryParams(query): QueryParams<TriageQuery>,
) -> Result<Html<String>, HtmlError> {
    show(auth?, &state, process, query).await
}

/// `/ui/process?process=…`: the same page, for a process named `.` or `..`
/// (a browser cannot send those as a path segment).
pub(super) async fn process_by_query(
    auth: Result<Authorized<Read>, ApiError>,
    State(state): State<AppState>,
    QueryParams(name): QueryParams<ProcessName>,
    QueryParams(query): QueryParams<TriageQuery>,
) -> Result<Html<String>, HtmlError> {
    show(auth?, &state, name.process, query).await
}

/// The page of `process` with the items `query` asks for.
async fn show(
    auth: Authorized<Read>,
    state: &AppState,
    process: String,
    mut query: TriageQuery,
) -> Result<Html<String>, HtmlError> {
    let admin = auth.role >= Role::Admin;
    query.limit = Some(query.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE));
    query.prefix = query.prefix.filter(|p| !p.is_empty());
    let filter = Filter {
        state: query.state.map(Into::into),
        prefix: query.prefix.clone(),
    };
    let page = triage_page(state, process.clone(), query).await?;
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
            window: SERIES_WINDOW,
        }),
    );
    let ((groups, age), (series, _)) = tokio::try_join!(groups, series).map_err(ApiError::from)?;
    let next = page.next.map(|c| c.to_string());
    let listing = Listing {
        filter,
        items: &page.items,
        next: next.as_deref(),
    };
    let settings: Vec<_> = (state.store.process_get(&process).await)
        .map_err(ApiError::from)?
        .into_iter()
        .collect();
    let limits = settings.first().map(|s| &s.limits);
    let fleet = section(&process, limits, admin);
    let now = state.store.clock_now().await.map_err(ApiError::from)?;
    let resyncs = Resyncs {
        settings: &settings,
        now,
    };
    let page = view(
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

/// What a process page lists.
#[derive(Debug, Default)]
pub(super) struct Filter {
    /// Only this state (all when `None`).
    pub(super) state: Option<ItemState>,
    /// Only keys starting with this.
    pub(super) prefix: Option<String>,
}

impl Filter {
    /// The page's URL with these filters and `after`, every value encoded.
    fn url(&self, process: &str, after: Option<&str>) -> String {
        let mut pairs = Vec::new();
        if let Some(s) = self.state {
            pairs.push(("state", s.as_str()));
        }
        if let Some(p) = &self.prefix {
            pairs.push(("prefix", p.as_str()));
        }
        if let Some(a) = after {
            pairs.push(("after", a));
        }
        process_path(process, &pairs)
    }
}

/// One page of a process's items.
#[derive(Debug)]
pub(super) struct Listing<'a> {
    /// The filters.
    pub(super) filter: Filter,
    /// The items, parked first, then backing off, pending, running, idle.
    pub(super) items: &'a [Item],
    /// The next page's cursor, if any.
    pub(super) next: Option<&'a str>,
}

/// A process's error groups (with the bulk buttons for admins) and its
/// items, a page at a time.
fn view(
    process: &str,
    fleet: Markup,
    (groups, age): (&[ErrorGroup], Option<Duration>),
    series: &Series,
    admin: bool,
    listing: &Listing<'_>,
    resyncs: &Resyncs<'_>,
) -> Markup {
    let body = html! {
        (fleet)
        p id="resync" { "Resync: " (resyncs.describe(process)) }
        (super::charts::charts(series))
        (errors(process, groups, age, admin))
        h2 { "Items" }
        (filters(process, &listing.filter))
        p.hint { "Parked first, then backing off (soonest retry first), then pending in the order workers take them, then running and idle"
            @if listing.filter.prefix.is_some() { "; each state in key order under a prefix" } "." }
        table id="items" {
            tr { th { "key" } th { "state" } th { "priority" } th { "failures" } th { "ready at" } th { "last error" } }
            @for i in listing.items {
                tr { td.key { a href=(item_path(process, &i.key)) { (name(&i.key)) } } td.state { (i.state) } td.n { (i.priority) }
                     td.n { (i.failures) } td { (ready(i)) } td.err { (name(i.last_error.as_deref().unwrap_or(""))) } }
            }
        }
        @if listing.items.is_empty() { p { "No items match." } }
        @if let Some(next) = listing.next {
            a id="next" href=(listing.filter.url(process, Some(next))) { "next page" }
        }
    };
    named_page(&[process], true, body)
}

/// The "Errors" section: what the parked and backing-off keys failed with,
/// grouped by signature; admins get a retry, park and delete button for every
/// key of a group (running keys are never touched).
fn errors(process: &str, groups: &[ErrorGroup], age: Option<Duration>, admin: bool) -> Markup {
    html! {
        h2 { "Errors" }
        @if let Some(age) = age { p.hint { "As of " (age.as_secs()) " s ago (grouping this many failing keys is slow, so it is reused for 10 s)." } }
        @if groups.is_empty() {
            p id="errors" { "No parked or backing-off keys." }
        } @else {
            table id="errors" {
                tr { th { "keys" } th { "state" } th { "error (key as <key>, numbers as <n>)" } th { "sample" }
                     @if admin { th { "all of these" } } }
                @for g in groups {
                    tr.group {
                        td.n.count { (g.count) }
                        td.states { (g.states.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")) }
                        td.signature { code { (name(&g.signature)) } }
                        td.err.sample { (name(&g.sample)) }
                        // An empty error's group cannot be named by its
                        // signature (an empty filter is no filter): no
                        // buttons that would only be refused.
                        @if admin { td { @if g.signature.is_empty() {
                            span.hint { "an empty error: act on these keys one by one or by state" }
                        } @else { @for (action, label) in [("retry", "retry all"), ("park", "park all"), ("delete", "delete all")] {
                            // Percent-encoded: a browser sends the line
                            // breaks of a field as CRLF, whatever they were,
                            // and a command's error often has several.
                            form.inline method="post" action=(process_action_path(process, &format!("errors/{action}"))) {
                                input type="hidden" name="signature_encoded" value=(path_segment(&g.signature));
                                button type="submit" { (label) }
                            } " "
                        } } } }
                    }
                }
            }
        }
    }
}

/// The state and key-prefix filter form (a GET, so the URL can be shared;
/// a browser replaces the query of its action with the form's fields, so a
/// process named by the query is one of them).
fn filters(process: &str, filter: &Filter) -> Markup {
    let by_query = dot_segment(process);
    let action = if by_query {
        "/ui/process".to_owned()
    } else {
        process_path(process, &[])
    };
    html! {
        form id="filters" action=(action) method="get" {
            @if by_query { input type="hidden" name="process" value=(process); }
            label { "State " select name="state" {
                option value="" { "all" }
                @for s in [ItemState::Parked, ItemState::Backoff, ItemState::Pending, ItemState::Running, ItemState::Idle] {
                    option value=(s.as_str()) selected[filter.state == Some(s)] { (s.as_str()) }
                }
            } }
            " " label { "Key prefix " input type="search" name="prefix" value=(filter.prefix.as_deref().unwrap_or("")); }
            " " button type="submit" { "Filter" }
        }
    }
}

/// When a waiting item may run (a dash for the others).
fn ready(i: &Item) -> String {
    match i.state {
        ItemState::Pending | ItemState::Backoff => {
            at(i.ready_at.max(i.backoff_until.unwrap_or(i.ready_at)))
        }
        _ => "-".to_owned(),
    }
}

/// The section; `limits` is `None` for a process with no stored settings.
pub(super) fn section(process: &str, limits: Option<&FleetLimits>, admin: bool) -> Markup {
    let limits = limits.copied().unwrap_or_default();
    let concurrency = limits.concurrency.map_or_else(
        || "none".to_owned(),
        |n| format!("at most {n} running at once"),
    );
    let rate = limits.rate.map_or_else(
        || "none".to_owned(),
        |r| format!("{} runs/s, burst {}", r.per_second, r.burst),
    );
    html! {
        h2 { "Fleet controls" }
        table id="fleet" {
            tr { th { "state" } td.paused { @if limits.paused { strong { "paused" } " (no worker claims its keys)" } @else { "running" } }
                 @if admin { td {
                     @let (action, label) = if limits.paused { ("resume", "Resume") } else { ("pause", "Pause") };
                     form.inline method="post" action=(process_action_path(process, action)) {
                         button type="submit" id=(action) { (label) } } } } }
            tr { th { "concurrency limit" } td.concurrency { (concurrency) } }
            tr { th { "rate limit" } td.rate { (rate) } }
        }
    }
}
