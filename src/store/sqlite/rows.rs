//! SQLite's rows: the shared rows ([`crate::store::rows`]) with times as
//! integer milliseconds since the Unix epoch.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backoff::clamp_delay;
use crate::store::rows::Stamp as _;
pub(super) use crate::store::rows::{item_columns, run_columns, running_columns};

/// Milliseconds since the epoch as a time (out-of-range values saturate).
pub(super) fn to_time(ms: i64) -> DateTime<Utc> {
    ms.time()
}

/// A time as milliseconds since the epoch.
pub(super) fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// A duration as whole milliseconds, clamped to drover's maximum delay.
pub(super) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(clamp_delay(d).as_millis()).unwrap_or(i64::MAX)
}

/// An item row.
pub(super) type ItemRow = crate::store::rows::ItemRow<i64>;
/// A running item with its process's backoff policy.
pub(super) type RunningRow = crate::store::rows::RunningRow<i64>;
/// A `drover_runs` row.
pub(super) type RunRow = crate::store::rows::RunRow<i64>;
