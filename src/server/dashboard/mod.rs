//! The dashboard: server-rendered HTML (maud, which escapes every interpolated
//! value, so a key like `<script>` shows as text), no JavaScript, refreshed by a
//! `<meta http-equiv="refresh">`.
//!
//! - `/`: per process — pending, backoff, running, parked, oldest pending age,
//!   runs finished and failed in the last five minutes — and a key search;
//! - `/ui/processes/{process}`: its fleet controls (paused or not, its
//!   concurrency and rate limits, with a Pause / Resume button for admins),
//!   its resync, its charts (runs per minute by outcome and the sampled queue
//!   depth over the last hour, inline SVG), its error groups (what its parked and
//!   backing-off keys failed with, with "retry all", "park all" and "delete
//!   all" buttons for admins) and its items, by state, paged;
//! - `/ui/workers`: every session, who runs it, its heartbeat and deadline,
//!   the leases it holds; expired ones shown as awaiting reclaim;
//! - `/ui/processes/{process}/items/{key}`: any known key (converged ones
//!   included), its current run, its runs and last error, with retry and park
//!   buttons for admins.
//!
//! It uses the API's route classes: viewers see it, admins get the buttons. In a
//! browser the token is the password of HTTP Basic auth (any user name).

mod actions;
mod cache;
mod charts;
mod fleet;
mod pages;
mod view;
mod workers;

use axum::Router;
use axum::routing::{get, post};

use super::state::AppState;

pub(crate) use cache::SlowReads;

/// The dashboard's routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::overview))
        .route("/ui/search", get(pages::search))
        .route("/ui/workers", get(workers::workers))
        .route("/ui/processes/{process}", get(pages::process))
        .route("/ui/processes/{process}/items/{key}", get(pages::item))
        .route(
            "/ui/processes/{process}/items/{key}/retry",
            post(actions::retry),
        )
        .route(
            "/ui/processes/{process}/items/{key}/park",
            post(actions::park),
        )
        .route(
            "/ui/processes/{process}/errors/{action}",
            post(actions::group),
        )
        .route("/ui/processes/{process}/pause", post(fleet::pause))
        .route("/ui/processes/{process}/resume", post(fleet::resume))
}

/// A path segment, percent-encoded (everything but RFC 3986's unreserved
/// characters), so any key round-trips through a link.
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The item page's path.
pub(crate) fn item_path(process: &str, key: &str) -> String {
    format!("/ui/processes/{}/items/{}", segment(process), segment(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_escape_everything_but_unreserved_characters() {
        assert_eq!(segment("ns/name"), "ns%2Fname");
        assert_eq!(segment("<a b>"), "%3Ca%20b%3E");
        assert_eq!(segment("ü"), "%C3%BC");
        assert_eq!(segment("a-b_c.d~"), "a-b_c.d~");
    }
}
