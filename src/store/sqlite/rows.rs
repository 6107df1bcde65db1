//! SQLite's rows: the shared rows ([`crate::store::rules::rows`]) with times as
//! integer milliseconds since the Unix epoch.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

use crate::store::StoreError;
use crate::store::rules::decode::corrupt;
use crate::store::rules::rows::Stamp as _;
pub(super) use crate::store::rules::rows::{
    duration_ms, item_columns, run_columns, running_columns,
};

/// Milliseconds since the epoch as a time (out-of-range values saturate).
pub(super) fn to_time(ms: i64) -> DateTime<Utc> {
    ms.time()
}

/// A time as milliseconds since the epoch.
pub(super) fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// An item row.
pub(super) type ItemRow = crate::store::rules::rows::ItemRow<i64>;
/// A running item with its process's backoff policy.
pub(super) type RunningRow = crate::store::rules::rows::RunningRow<i64>;
/// A `drover_runs` row.
pub(super) type RunRow = crate::store::rules::rows::RunRow<i64>;

/// The rows a statement returned as one JSON array (`json_group_array`), one
/// array per row, read back as `T`s; `what` names them in the error if the
/// text is not such an array.
///
/// The claim's ready rows and the completion's quick rows come back this way:
/// one value instead of a thousand rows of three to six. sqlx copies each
/// value of each row (`sqlite3_value_dup`, an allocation) on the thread of the
/// connection, which every write waits for, and the rows cross to the task
/// one by one, each freed there: with the runs' task on the other core, one
/// value instead took 6 % off the writer's thread's samples in a burn-down,
/// and a fifth off tokio's (`perf`, 2026-12-02, `docs/performance.md`). The
/// JSON is parsed where the rows are used.
pub(super) fn json_rows<T: DeserializeOwned>(json: &str, what: &str) -> Result<Vec<T>, StoreError> {
    serde_json::from_str(json).map_err(|e| corrupt(format!("{what} came back malformed: {e}")))
}
