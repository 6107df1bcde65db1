//! Write-ahead log per key on PostgreSQL (issue 39): what a scenario's timed
//! part made the database write. Every index a claim or a completion touches,
//! every history row and every counts delta costs WAL, so this says where a
//! key's cost goes next to its keys per second.
//!
//! The bytes are the distance the log's insert position moved (exact and at
//! once; `pg_stat_wal` lags by up to ten seconds, until each connection
//! reports its counts). The records are counted by `pg_walinspect`'s
//! `pg_get_wal_stats` over the same range, when the database has that
//! extension (`CREATE EXTENSION pg_walinspect`, shipped with PostgreSQL 15 and
//! later). Both are the whole cluster's: on a busy server they include the
//! neighbours' writes.

use super::Figure;
use super::store::BenchError;
use crate::store::Store;

/// Where the log stood at one moment (PostgreSQL only): `pg_lsn` as text.
#[derive(Debug, Clone)]
pub(crate) struct WalMark(Option<String>);

impl WalMark {
    /// The log's insert position now; nothing on SQLite, whose WAL is a
    /// file of pages, not a stream of records.
    pub(crate) async fn now(store: &Store) -> Result<Self, BenchError> {
        let Some(pool) = store.postgres_pool() else {
            return Ok(Self(None));
        };
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .persistent(false)
            .fetch_one(pool)
            .await?;
        Ok(Self(Some(lsn)))
    }

    /// `figure` with the log written since this mark, per key of `keys`:
    /// `wal_bytes_per_key`, and `wal_records_per_key` where
    /// `pg_walinspect` is installed.
    pub(crate) async fn per_key(
        &self,
        store: &Store,
        keys: u64,
        figure: Figure,
    ) -> Result<Figure, BenchError> {
        let (Some(pool), Some(start)) = (store.postgres_pool(), &self.0) else {
            return Ok(figure);
        };
        let (bytes, inspect): (i64, Option<String>) = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint,
                    (SELECT quote_ident(n.nspname) FROM pg_proc p
                     JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE p.proname = 'pg_get_wal_stats' LIMIT 1)",
        )
        .bind(start)
        .persistent(false)
        .fetch_one(pool)
        .await?;
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let per_key = |n: i64| n as f64 / keys.max(1) as f64;
        let mut figure = figure.with("wal_bytes_per_key", format!("{:.0}", per_key(bytes)));
        if let Some(schema) = inspect {
            // Up to what is flushed: every commit of the timed part is.
            let sql = format!(
                "SELECT coalesce(sum(count), 0)::bigint
                 FROM {schema}.pg_get_wal_stats($1::pg_lsn, pg_current_wal_flush_lsn())"
            );
            let records: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(start)
                .persistent(false)
                .fetch_one(pool)
                .await?;
            figure = figure.with("wal_records_per_key", format!("{:.1}", per_key(records)));
        }
        Ok(figure)
    }
}
