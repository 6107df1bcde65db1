//! PostgreSQL's rows: the shared rows ([`crate::store::rules::rows`]) with times as
//! `TIMESTAMPTZ`.

use chrono::{DateTime, Utc};

use super::tid::Tid;
use crate::store::rules::holding::Held;
use crate::store::rules::settle::Running;

pub(super) use crate::store::rules::rows::{
    duration_ms, item_columns, run_columns, running_columns,
};

/// An item row.
pub(super) type ItemRow = crate::store::rules::rows::ItemRow<DateTime<Utc>>;
/// A running item with its process's backoff policy.
pub(super) type RunningRow = crate::store::rules::rows::RunningRow<DateTime<Utc>>;
/// A `drover_runs` row.
pub(super) type RunRow = crate::store::rules::rows::RunRow<DateTime<Utc>>;

/// A running row this transaction holds locked, with its `ctid`: how the
/// statements after the lock find it again (see [`Tid`]).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct LockedRow {
    pub(super) ctid: Tid,
    #[sqlx(flatten)]
    pub(super) row: RunningRow,
}

impl Held for LockedRow {
    /// The row's `id`: unique, so a row met twice in a batch is told apart.
    fn id(&self) -> i64 {
        self.row.id()
    }

    fn running(&self) -> Running {
        self.row.running()
    }
}
