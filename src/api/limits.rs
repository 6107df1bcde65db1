//! The API's limits and units: how much one request may carry, and durations as
//! whole milliseconds on the wire.

use std::time::Duration;

/// The longest session TTL the API accepts: one day.
pub const MAX_TTL_MS: u64 = 86_400_000;

/// The most leases one claim answers with; a claim may ask for more (a worker's
/// parallelism), and claims again for the rest.
pub const MAX_CLAIM: u32 = 1000;

/// The most keys one enqueue request carries (the body's own limit, 1 MiB by
/// default, stops shorter keys first; `--max-body` can raise it past this).
pub const MAX_ENQUEUE_KEYS: usize = 100_000;

/// The most completions one batch request carries.
pub const MAX_COMPLETE_BATCH: usize = 4096;

/// The most items, events, processes or sessions one page holds.
pub const MAX_PAGE: u32 = 1000;

/// How many processes `GET /v1/processes` (and the dashboard's overview)
/// lists when no `limit` is given: a full page, because a server lets
/// workers create at most `--max-processes` (1,000 by default) processes, so
/// a client written before the list was paged, which reads one answer and
/// knows no `next`, still sees every process of a server with default
/// options.
#[cfg(feature = "server")] // read by the server only
pub(crate) const PROCESS_PAGE: u32 = MAX_PAGE;

/// How many sessions `GET /v1/sessions` (and the workers page) lists when no
/// `limit` is given: a screenful, as the triage's items; each session carries
/// up to 100 leases, so a page stays small.
#[cfg(feature = "server")] // read by the server only
pub(crate) const SESSION_PAGE: u32 = 100;

/// Milliseconds as a duration.
#[cfg(feature = "server")] // read by the server only
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A duration as whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `MAX_DELAY` in milliseconds, for validation messages.
#[cfg(feature = "server")] // read by the server only
pub(crate) fn max_delay_ms() -> u64 {
    millis(crate::backoff::MAX_DELAY)
}
