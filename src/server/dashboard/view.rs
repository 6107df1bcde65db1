//! The dashboard's HTML, one function per page. maud escapes every `(value)`,
//! so user data (keys, process names, errors) is always shown as text.

use std::time::Duration;

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use super::{item_path, segment};
use crate::api::ProcessSummary;
use crate::store::{ErrorGroup, Item, ItemState, ProcessSettings, Run, Series, SessionInfo};

/// How often pages reload themselves, in seconds.
const REFRESH_SECONDS: u32 = 5;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem;color:#222}\
table{border-collapse:collapse;margin:1rem 0}th,td{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}\
td.n{text-align:right;font-variant-numeric:tabular-nums}.err{color:#a00;white-space:pre-wrap}\
form.inline{display:inline}figure.chart{margin:1rem 0;max-width:60rem}.legend{margin-right:.5rem}.hint{color:#666}nav a{margin-right:1rem}code{background:#f4f4f4;padding:0 .2rem}";

/// The frame every page shares.
pub(super) fn page(title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if refresh { meta http-equiv="refresh" content=(REFRESH_SECONDS); }
                title { (title) " · drover" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                nav { a href="/" { "drover" } a href="/ui/workers" { "workers" } a href="/openapi.json" { "API" } a href="/metrics" { "metrics" } }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// A duration as `1h 2m 3s`, whole seconds.
fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// Every process's resync, and the database clock to show it against.
#[derive(Debug)]
pub(super) struct Resyncs<'a> {
    /// Every process's stored settings.
    pub(super) settings: &'a [ProcessSettings],
    /// The database clock when the page was read.
    pub(super) now: DateTime<Utc>,
}

impl Resyncs<'_> {
    /// A process's resync in a few words: `every 1h +10%, next in 12m`,
    /// `every 1h +10%, next now` (a pass is due or under way), or `never`.
    fn describe(&self, process: &str) -> String {
        let Some(s) = self.settings.iter().find(|s| s.process == process) else {
            return "never".to_owned();
        };
        let Some(r) = s.resync else {
            return "never".to_owned();
        };
        let every = age(r.every);
        let jitter = (r.jitter * 100.0).round();
        let next = match s.next_resync {
            Some(at) if at > self.now => {
                format!(
                    "next in {}",
                    age((at - self.now).to_std().unwrap_or_default())
                )
            }
            Some(_) => "next now".to_owned(),
            None => "first pass pending".to_owned(),
        };
        format!("every {every} +{jitter}%, priority {}, {next}", r.priority)
    }
}

/// The overview: one row per process, and the key search.
pub(super) fn overview(processes: &[ProcessSummary], resyncs: &Resyncs<'_>) -> Markup {
    let body = html! {
        (search_form(processes))
        @if processes.is_empty() {
            p { "No processes yet: enqueue keys with " code { "drover enqueue PROCESS KEY" } " or "
                code { "POST /v1/processes/{process}/items" } "." }
        } @else {
            table id="processes" {
                tr { th { "process" } th { "pending" } th { "backoff" } th { "running" } th { "parked" }
                     th { "oldest pending" } th { "finished (5 min)" } th { "failed (5 min)" } th { "failure rate" }
                     th { "resync" } }
                @for p in processes { (process_row(p, resyncs)) }
            }
        }
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
            td { a href=(format!("/ui/processes/{}", segment(&p.process))) { (p.process) } }
            td.n.pending { (p.pending) } td.n.backoff { (p.backoff) } td.n.running { (p.running) }
            td.n.parked { (p.parked) } td.n { (oldest) } td.n { (p.recent_finished) }
            td.n { (p.recent_failed) } td.n { (rate) } td.resync { (resyncs.describe(&p.process)) }
        }
    }
}

fn search_form(processes: &[ProcessSummary]) -> Markup {
    html! {
        form action="/ui/search" method="get" {
            label { "Find a key in " select name="process" {
                @for p in processes { option value=(p.process) { (p.process) } }
            } }
            " " input type="search" name="key" placeholder="key" required;
            " " button type="submit" { "Find" }
        }
    }
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
    fn url(&self, base: &str, after: Option<&str>) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(s) = self.state {
            q.append_pair("state", s.as_str());
        }
        if let Some(p) = &self.prefix {
            q.append_pair("prefix", p);
        }
        if let Some(a) = after {
            q.append_pair("after", a);
        }
        let q = q.finish();
        if q.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{q}")
        }
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
pub(super) fn process(
    process: &str,
    fleet: Markup,
    (groups, age): (&[ErrorGroup], Option<Duration>),
    series: &Series,
    admin: bool,
    listing: &Listing<'_>,
    resyncs: &Resyncs<'_>,
) -> Markup {
    let base = format!("/ui/processes/{}", segment(process));
    let body = html! {
        (fleet)
        p id="resync" { "Resync: " (resyncs.describe(process)) }
        (super::charts::charts(series))
        (errors(&base, groups, age, admin))
        h2 { "Items" }
        (filters(&base, &listing.filter))
        p.hint { "Parked first, then backing off (soonest retry first), then pending in the order workers take them, then running and idle"
            @if listing.filter.prefix.is_some() { "; each state in key order under a prefix" } "." }
        table id="items" {
            tr { th { "key" } th { "state" } th { "priority" } th { "failures" } th { "ready at" } th { "last error" } }
            @for i in listing.items {
                tr { td.key { a href=(item_path(process, &i.key)) { (i.key) } } td.state { (i.state) } td.n { (i.priority) }
                     td.n { (i.failures) } td { (ready(i)) } td.err { (i.last_error.as_deref().unwrap_or("")) } }
            }
        }
        @if listing.items.is_empty() { p { "No items match." } }
        @if let Some(next) = listing.next {
            a id="next" href=(listing.filter.url(&base, Some(next))) { "next page" }
        }
    };
    page(process, true, body)
}

/// The "Errors" section: what the parked and backing-off keys failed with,
/// grouped by signature; admins get a retry, park and delete button for every
/// key of a group (running keys are never touched).
fn errors(base: &str, groups: &[ErrorGroup], age: Option<Duration>, admin: bool) -> Markup {
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
                        td.signature { code { (g.signature) } }
                        td.err.sample { (g.sample) }
                        @if admin { td { @for (action, label) in [("retry", "retry all"), ("park", "park all"), ("delete", "delete all")] {
                            form.inline method="post" action=(format!("{base}/errors/{action}")) {
                                input type="hidden" name="signature" value=(g.signature);
                                button type="submit" { (label) }
                            } " "
                        } } }
                    }
                }
            }
        }
    }
}

/// The state and key-prefix filter form (a GET, so the URL can be shared).
fn filters(base: &str, filter: &Filter) -> Markup {
    html! {
        form id="filters" action=(base) method="get" {
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

/// A time as the dashboard prints it (UTC, milliseconds).
pub(super) fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

/// An optional time, or a dash.
pub(super) fn at_or_dash(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), at)
}

/// A duration as the dashboard prints it: milliseconds below 10 s, seconds above.
fn span(d: Option<Duration>) -> String {
    match d {
        None => String::new(),
        Some(d) if d < Duration::from_secs(10) => format!("{} ms", d.as_millis()),
        Some(d) => format!("{:.1} s", d.as_secs_f64()),
    }
}

/// One known key with its runs, converged or not; admins get the retry and
/// park buttons.
pub(super) fn item(item: &Item, runs: &[Run], worker: Option<&SessionInfo>, admin: bool) -> Markup {
    let path = item_path(&item.process, &item.key);
    let running = item.state == ItemState::Running;
    let body = html! {
        p { "Process " a href=(format!("/ui/processes/{}", segment(&item.process))) { (item.process) } }
        table id="item" {
            tr { th { "key" } td.key { (item.key) } }
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
            tr { th { "last error" } td.err { (item.last_error.as_deref().unwrap_or("-")) } }
            @if running {
                tr { th { "current run" } td.current {
                    "attempt " (item.failures + 1) ", started " (at_or_dash(item.started_at))
                    ", fencing token " span.token { (item.lease_token.map(|t| t.to_string()).unwrap_or_default()) }
                    ", worker " a.worker href="/ui/workers" {
                        "session " (item.lease_session.map(|s| s.to_string()).unwrap_or_default())
                        @if let Some(w) = worker {
                            " (" (w.component)
                            @if let Some(host) = &w.identity.host { " on " (host) }
                            @if let Some(pid) = w.identity.pid { ", pid " (pid) }
                            ")"
                        }
                    }
                    @if item.dirty { ", runs again after it (changed while running)" } } }
            }
        }
        @if admin && !running {
            form.inline method="post" action=(format!("{path}/retry")) { button type="submit" { "Retry now" } }
            " "
            @if item.state != ItemState::Parked {
                form.inline method="post" action=(format!("{path}/park")) { button type="submit" { "Park" } }
            }
        }
        h2 { "Runs" }
        table id="runs" {
            tr { th { "ended" } th { "outcome" } th { "attempt" } th { "queue wait" } th { "duration" }
                 th { "token" } th { "by" } th { "error" } }
            @for r in runs {
                tr { td { (at(r.ended_at)) } td.outcome { (r.outcome) }
                     td.n { (r.attempt.map(|a| a.to_string()).unwrap_or_default()) }
                     td.n { (span(r.queue_wait())) } td.n { (span(r.duration())) }
                     td.n { (r.token.map(|t| t.to_string()).unwrap_or_default()) }
                     td { (r.actor.as_deref().unwrap_or("")) }
                     td.err { (r.error.as_deref().unwrap_or("")) } }
            }
        }
    };
    page(&format!("{} / {}", item.process, item.key), true, body)
}

/// A page for an error (404, 403, …), with its message escaped.
pub(super) fn error(title: &str, message: &str) -> Markup {
    page(
        title,
        false,
        html! { p.err { (message) } p { a href="/" { "Back to the overview" } } },
    )
}
