//! SQLite's rows: the shared rows ([`crate::store::rules::rows`]) with times as
//! integer milliseconds since the Unix epoch.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

use crate::store::StoreError;
use crate::store::rules::decode::corrupt;
use crate::store::rules::rows::Stamp as _;
pub(super) use crate::store::rules::rows::{duration_ms, run_columns, running_columns};

/// Milliseconds since the epoch as a time (out-of-range values saturate).
pub(super) fn to_time(ms: i64) -> DateTime<Utc> {
    ms.time()
}

/// A time as milliseconds since the epoch.
pub(super) fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// `SELECT <this> FROM drover_items` yields an [`ItemRow`]: PostgreSQL's
/// columns (`item_columns!` in `src/store/rules/rows.rs`), each
/// number read as SQLite reads a value as an integer (`CAST(… AS INTEGER)`,
/// an `i32` clamped), as the claim reads them (see [`SqlInt`]).
///
/// SQL straight into `drover_items` checks no types, and a fraction there (a
/// `backoff_until` of `1.5`) failed every list, read and operator action
/// that met the row with a `ColumnDecode` error, so the operator could not
/// even see the key to fix it. Only where rows are read back whole: the
/// statements' own conditions and orders still read the stored values.
macro_rules! item_columns {
    () => {
        "process, key, state, \
         MAX(-2147483648, MIN(2147483647, CAST(priority AS INTEGER))) AS priority, \
         CAST(ready_at AS INTEGER) AS ready_at, CAST(enqueued_at AS INTEGER) AS enqueued_at, \
         MAX(-2147483648, MIN(2147483647, CAST(failures AS INTEGER))) AS failures, \
         CAST(backoff_until AS INTEGER) AS backoff_until, last_error, \
         CAST(dirty_since AS INTEGER) AS dirty_since, \
         CAST(lease_session AS INTEGER) AS lease_session, \
         CAST(lease_token AS INTEGER) AS lease_token, \
         CAST(started_at AS INTEGER) AS started_at, \
         CAST(first_enqueued_at AS INTEGER) AS first_enqueued_at, \
         CAST(last_enqueued_at AS INTEGER) AS last_enqueued_at, \
         CAST(enqueue_count AS INTEGER) AS enqueue_count, last_outcome, \
         CAST(last_ended_at AS INTEGER) AS last_ended_at"
    };
}
pub(super) use item_columns;

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

/// A number of an item's row read back through JSON ([`json_rows`]) as
/// SQLite reads a value as an integer, so a row no drover write made (SQL
/// straight into `drover_items`, which checks no types: text, a fraction, a
/// huge REAL) is read as sqlx reads the same column, not refused. Refused, it
/// failed every claim of its process after the claim had committed its
/// leases. An integer is read as it is; a fraction is cut toward zero and
/// saturates; text that is a number is that number, other text and `null` are
/// 0, as `CAST(… AS INTEGER)` makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SqlInt(pub(super) i64);

impl SqlInt {
    /// The value clamped to an `i32` (a priority).
    pub(super) fn to_i32(self) -> i32 {
        i32::try_from(self.0).unwrap_or(if self.0 < 0 { i32::MIN } else { i32::MAX })
    }
}

impl<'de> Deserialize<'de> for SqlInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SqlIntVisitor)
    }
}

/// Reads any JSON scalar as [`SqlInt`].
struct SqlIntVisitor;

impl Visitor<'_> for SqlIntVisitor {
    type Value = SqlInt;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, or text or null read as one")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<SqlInt, E> {
        Ok(SqlInt(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<SqlInt, E> {
        Ok(SqlInt(i64::try_from(v).unwrap_or(i64::MAX)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<SqlInt, E> {
        // `as` cuts toward zero and saturates; NaN (SQLite has none) is 0.
        #[allow(clippy::cast_possible_truncation)]
        Ok(SqlInt(v as i64))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<SqlInt, E> {
        Ok(SqlInt(i64::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<SqlInt, E> {
        let v = v.trim();
        match v.parse::<i64>() {
            Ok(n) => Ok(SqlInt(n)),
            Err(_) => self.visit_f64(v.parse::<f64>().unwrap_or(0.0)),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<SqlInt, E> {
        Ok(SqlInt(0))
    }
}

#[cfg(test)]
mod tests {
    use super::SqlInt;

    fn read(json: &str) -> i64 {
        serde_json::from_str::<SqlInt>(json).expect("read").0
    }

    #[test]
    fn a_number_is_read_as_sqlite_reads_a_value_as_an_integer() {
        assert_eq!(read("7"), 7);
        assert_eq!(read("-7"), -7);
        assert_eq!(read("2.9"), 2);
        assert_eq!(read("-2.9"), -2);
        assert_eq!(read("1e300"), i64::MAX);
        assert_eq!(read("18446744073709551615"), i64::MAX);
        assert_eq!(read(r#"" 12 ""#), 12);
        assert_eq!(read(r#""1.5e3""#), 1500);
        assert_eq!(read(r#""x""#), 0);
        assert_eq!(read("null"), 0);
        assert_eq!(SqlInt(1 << 40).to_i32(), i32::MAX);
        assert_eq!(SqlInt(-(1 << 40)).to_i32(), i32::MIN);
        assert_eq!(SqlInt(-5).to_i32(), -5);
    }
}
