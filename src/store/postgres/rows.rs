//! PostgreSQL's rows: the shared rows ([`crate::store::rules::rows`]) with times as
//! `TIMESTAMPTZ`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backoff::clamp_delay;
pub(super) use crate::store::rules::rows::{item_columns, run_columns, running_columns};

/// A duration as whole milliseconds, clamped to drover's maximum delay.
pub(super) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(clamp_delay(d).as_millis()).unwrap_or(i64::MAX)
}

/// An item row.
pub(super) type ItemRow = crate::store::rules::rows::ItemRow<DateTime<Utc>>;
/// A running item with its process's backoff policy.
pub(super) type RunningRow = crate::store::rules::rows::RunningRow<DateTime<Utc>>;
/// A `drover_runs` row.
pub(super) type RunRow = crate::store::rules::rows::RunRow<DateTime<Utc>>;
