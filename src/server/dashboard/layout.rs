//! The frame and the pieces every dashboard page shares: the page frame, how
//! times and durations read, an error as a page, links to items and to a
//! list's next page, and a process's resync line.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use super::names::{isolated, name};
use crate::api::path_segment;
use crate::server::error::ApiError;
use crate::store::ProcessSettings;

/// How often pages reload themselves, in seconds.
const REFRESH_SECONDS: u32 = 5;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem;color:#222}\
table{border-collapse:collapse;margin:1rem 0}th,td{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}\
td.n{text-align:right;font-variant-numeric:tabular-nums}.err{color:#a00;white-space:pre-wrap}\
form.inline{display:inline}figure.chart{margin:1rem 0;max-width:60rem}.legend{margin-right:.5rem}.hint{color:#666}nav a{margin-right:1rem}code{background:#f4f4f4;padding:0 .2rem}";

/// The frame every page shares, titled by fixed words.
pub(super) fn page(title: &str, refresh: bool, body: Markup) -> Markup {
    frame(title, html! { (title) }, refresh, body)
}

/// The frame of a page titled by callers' names (a process, or a process
/// and a key), each isolated (see [`names`](super::names)).
pub(super) fn named_page(names: &[&str], refresh: bool, body: Markup) -> Markup {
    let title: Vec<String> = names.iter().map(|n| isolated(n)).collect();
    let heading = html! {
        @for (at, n) in names.iter().enumerate() { @if at > 0 { " / " } (name(n)) }
    };
    frame(&title.join(" / "), heading, refresh, body)
}

/// The frame: `title` in the `<title>`, `heading` as the `<h1>`.
fn frame(title: &str, heading: Markup, refresh: bool, body: Markup) -> Markup {
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
                h1 { (heading) }
                (body)
            }
        }
    }
}

/// The link to the next page of a list shown a page at a time: `base` with
/// `after` (the page's `next`) and, when the page was asked for a size, that
/// `limit`, every value percent-encoded (a process name may hold `&`, `#` or
/// spaces), the whole escaped as an attribute by maud.
pub(super) fn next_link(base: &str, limit: Option<u32>, after: &str) -> Markup {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("after", after);
    if let Some(limit) = limit {
        query.append_pair("limit", &limit.to_string());
    }
    let href = format!("{base}?{}", query.finish());
    html! { a id="next" href=(href) { "next page" } }
}

/// One page of a list shown a page at a time: its `table`, or when the
/// page is empty, `none` on the first page and "No more {what}." on a later
/// one; then the link to the next page, when there is one.
pub(super) fn paged(
    table: Option<Markup>,
    first: bool,
    none: Markup,
    what: &str,
    next: Option<Markup>,
) -> Markup {
    html! {
        @if let Some(table) = table {
            (table)
        } @else if first {
            p { (none) }
        } @else {
            p { "No more " (what) "." }
        }
        @if let Some(next) = next { (next) }
    }
}

/// A duration as `1h 2m 3s`, whole seconds.
pub(super) fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
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
pub(super) fn span(d: Option<Duration>) -> String {
    match d {
        None => String::new(),
        Some(d) if d < Duration::from_secs(10) => format!("{} ms", d.as_millis()),
        Some(d) => format!("{:.1} s", d.as_secs_f64()),
    }
}

/// The shown processes' resyncs, and the database clock to show them against.
#[derive(Debug)]
pub(super) struct Resyncs<'a> {
    /// The stored settings of the processes the page shows (a process not
    /// among them shows `never`).
    pub(super) settings: &'a [ProcessSettings],
    /// The database clock when the page was read.
    pub(super) now: DateTime<Utc>,
}

impl Resyncs<'_> {
    /// A process's resync in a few words: `every 1h +10%, next in 12m`,
    /// `every 1h +10%, next now` (a pass is due or under way), or `never`.
    pub(super) fn describe(&self, process: &str) -> String {
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

/// A page for an error (404, 403, …), with its message escaped.
pub(super) fn error(title: &str, message: &str) -> Markup {
    page(
        title,
        false,
        html! { p.err { (message) } p { a href="/" { "Back to the overview" } } },
    )
}

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
        let page = error(title, &self.0.to_string());
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

/// The item page's path: its names as path segments, or, when a browser
/// would take one of them for a dot segment (a name `.` or `..`, which it
/// removes from the path, as `%2e` too, before it sends it), as the query
/// of `/ui/item`.
pub(crate) fn item_path(process: &str, key: &str) -> String {
    if dot_segment(process) || dot_segment(key) {
        return format!("/ui/item?{}", item_query(process, key));
    }
    format!(
        "/ui/processes/{}/items/{}",
        path_segment(process),
        path_segment(key)
    )
}

/// Where an item's button `action` (`retry`, `park`) posts: after its page's
/// path, or, for the names of [`item_path`]'s query, to `/ui/item/{action}`
/// with that query.
pub(super) fn item_action_path(process: &str, key: &str, action: &str) -> String {
    if dot_segment(process) || dot_segment(key) {
        return format!("/ui/item/{action}?{}", item_query(process, key));
    }
    format!("{}/{action}", item_path(process, key))
}

/// A process page's path, with `pairs` as its query (filters, a page's
/// `after`), every value percent-encoded: its name as a path segment, or,
/// for a process named `.` or `..` (see [`item_path`]), as the `process` of
/// `/ui/process`'s query.
pub(super) fn process_path(process: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    let path = if dot_segment(process) {
        query.append_pair("process", process);
        "/ui/process".to_owned()
    } else {
        format!("/ui/processes/{}", path_segment(process))
    };
    for (name, value) in pairs {
        query.append_pair(name, value);
    }
    let query = query.finish();
    if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    }
}

/// Where a process page's button `action` (`pause`, `errors/retry`, …)
/// posts: after the page's path, or, for the names of [`process_path`]'s
/// query, to `/ui/process/{action}` with that query.
pub(super) fn process_action_path(process: &str, action: &str) -> String {
    if dot_segment(process) {
        return format!("/ui/process/{action}?{}", process_query(process));
    }
    format!("/ui/processes/{}/{action}", path_segment(process))
}

/// `process=…`, percent-encoded.
fn process_query(process: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("process", process)
        .finish()
}

/// Whether `name` as a path segment is one a browser drops or climbs with.
pub(super) fn dot_segment(name: &str) -> bool {
    name == "." || name == ".."
}

/// `process=…&key=…`, both percent-encoded.
fn item_query(process: &str, key: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("process", process)
        .append_pair("key", key)
        .finish()
}
