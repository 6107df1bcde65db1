//! PostgreSQL's rows: the shared rows ([`crate::store::rules::rows`]) with times as
//! `TIMESTAMPTZ`.

use chrono::{DateTime, Utc};

pub(super) use crate::store::rules::rows::{
    duration_ms, item_columns, run_columns, running_columns,
};

/// An item row.
pub(super) type ItemRow = crate::store::rules::rows::ItemRow<DateTime<Utc>>;
/// A running item with its process's backoff policy.
pub(super) type RunningRow = crate::store::rules::rows::RunningRow<DateTime<Utc>>;
/// A `drover_runs` row.
pub(super) type RunRow = crate::store::rules::rows::RunRow<DateTime<Utc>>;
