//! The API's limits and units: how much one request may carry, and durations as
//! whole milliseconds on the wire.

use std::time::Duration;

/// The longest session TTL the API accepts: one day.
pub const MAX_TTL_MS: u64 = 86_400_000;

/// The most leases one claim answers with; a claim may ask for more (a worker's
/// parallelism), and claims again for the rest.
pub const MAX_CLAIM: u32 = 1000;

/// The most completions one batch request carries.
pub const MAX_COMPLETE_BATCH: usize = 4096;

/// The most items or events one page holds.
pub const MAX_PAGE: u32 = 1000;

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
