//! The dashboard: server-rendered HTML (maud, which escapes every interpolated
//! value, so a key like `<script>` shows as text), no JavaScript, refreshed by a
//! `<meta http-equiv="refresh">`.
//!
//! - `/`: per process, a page of them by name with a link to the next —
//!   pending, backoff, running, parked, oldest pending age, runs finished and
//!   failed in the last five minutes — and a key search;
//! - `/ui/processes/{process}`: its fleet controls (paused or not, its
//!   concurrency and rate limits, with a Pause / Resume button for admins),
//!   its resync, its charts (runs per minute by outcome and the sampled queue
//!   depth over the last hour, inline SVG), its error groups (what its parked and
//!   backing-off keys failed with, with "retry all", "park all" and "delete
//!   all" buttons for admins) and its items, by state, paged;
//! - `/ui/workers`: the sessions, a page of them oldest first with a link to
//!   the next, who runs each, its heartbeat and deadline, the leases it
//!   holds; expired ones shown as awaiting reclaim;
//! - `/ui/processes/{process}/items/{key}`: any known key (converged ones
//!   included), its current run, its runs and last error, with retry and park
//!   buttons for admins; `/ui/item?process=…&key=…` the same, for a process or
//!   key named `.` or `..` (a browser drops such a path segment), as
//!   `/ui/process?process=…` is a process's page (and `/ui/process/…` its
//!   buttons) for such a process.
//!
//! It uses the API's route classes: viewers see it, admins get the buttons. In a
//! browser the token is the password of HTTP Basic auth (any user name).

// One file per page, the buttons' posts in one, and the pieces pages share.
mod actions;
mod item;
mod overview;
mod process;
mod workers;

mod cache;
mod charts;
mod layout;
mod names;

use axum::Router;
use axum::routing::{get, post};

use super::state::AppState;

pub(crate) use cache::SlowReads;
pub(crate) use layout::item_path;

/// The dashboard's routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview::overview))
        .route("/ui/search", get(overview::search))
        .route("/ui/workers", get(workers::workers))
        .route("/ui/processes/{process}", get(process::process))
        .route("/ui/processes/{process}/items/{key}", get(item::item))
        // An item whose names a browser cannot send as path segments (`..`).
        .route("/ui/item", get(item::item_by_query))
        .route("/ui/item/{action}", post(actions::item_by_query))
        .route(
            "/ui/processes/{process}/items/{key}/{action}",
            post(actions::item),
        )
        .route(
            "/ui/processes/{process}/errors/{action}",
            post(actions::group),
        )
        .route("/ui/processes/{process}/{action}", post(actions::switch))
        // A process a browser cannot name in a path (`.`, `..`).
        .route("/ui/process", get(process::process_by_query))
        .route("/ui/process/{action}", post(actions::switch_by_query))
        .route("/ui/process/errors/{action}", post(actions::group_by_query))
}
