//! A process page's "Fleet controls" section: whether the process is paused,
//! its concurrency and rate limits, and for admins a Pause / Resume button
//! (a form post, refused cross-origin like every other button).

use axum::extract::State;
use axum::response::Redirect;
use maud::{Markup, html};

use super::pages::HtmlError;
use super::segment;
use crate::server::auth::{Authorized, Manage};
use crate::server::error::ApiError;
use crate::server::extract::PathParams;
use crate::server::routes::settings::switch;
use crate::server::state::AppState;
use crate::store::FleetLimits;

/// The section; `limits` is `None` for a process with no stored settings.
pub(super) fn section(process: &str, limits: Option<&FleetLimits>, admin: bool) -> Markup {
    let limits = limits.copied().unwrap_or_default();
    let base = format!("/ui/processes/{}", segment(process));
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
                     form.inline method="post" action=(format!("{base}/{action}")) {
                         button type="submit" id=(action) { (label) } } } } }
            tr { th { "concurrency limit" } td.concurrency { (concurrency) } }
            tr { th { "rate limit" } td.rate { (rate) } }
        }
    }
}

/// `POST /ui/processes/{process}/pause`: pauses it, then back to its page.
pub(super) async fn pause(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
) -> Result<Redirect, HtmlError> {
    switched(auth, &state, process, true).await
}

/// `POST /ui/processes/{process}/resume`: resumes it, then back to its page.
pub(super) async fn resume(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
) -> Result<Redirect, HtmlError> {
    switched(auth, &state, process, false).await
}

async fn switched(
    auth: Result<Authorized<Manage>, ApiError>,
    state: &AppState,
    process: String,
    paused: bool,
) -> Result<Redirect, HtmlError> {
    auth?;
    let back = format!("/ui/processes/{}", segment(&process));
    switch(state, process, paused).await?;
    Ok(Redirect::to(&back))
}
