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

use sqlx::{ConnectOptions as _, Connection as _, PgConnection, PgPool};

use super::Figure;
use super::store::BenchError;
use crate::store::Store;

/// SQLSTATE `undefined_file`: `pg_walinspect` asked for a segment of the log
/// that a checkpoint had already removed.
const SEGMENT_REMOVED: &str = "58P01";

/// Where the log stood at one moment (PostgreSQL only): `pg_lsn` as text,
/// and the connection that holds the log from there on, where it could.
///
/// A checkpoint removes the segments before its start, and the timed part
/// can span one (a neighbour's `CHECKPOINT`, or the five-minute timer):
/// `pg_get_wal_stats` then fails on the missing segment. A temporary physical
/// replication slot, reserved when the mark is taken, keeps every segment
/// after it until its connection closes. Creating one needs a superuser or
/// the `REPLICATION` attribute and a free slot (`max_replication_slots`);
/// without one the records are counted where the log is still there and
/// left out of the figure where it is not.
#[derive(Debug)]
pub(crate) struct WalMark(Option<(String, Option<PgConnection>)>);

impl WalMark {
    /// The log's insert position now; nothing on SQLite, whose WAL is a
    /// file of pages, not a stream of records.
    pub(crate) async fn now(store: &Store) -> Result<Self, BenchError> {
        match store.postgres() {
            // Through a pooler in transaction mode the slot would stay with a
            // server connection the pooler keeps, holding the log long after.
            Some(pg) => Ok(Self::at(pg.pool(), !pg.pooled).await?),
            None => Ok(Self(None)),
        }
    }

    /// The insert position of the server behind `pool` now, the log held
    /// from there (when `hold` and the server allows it).
    async fn at(pool: &PgPool, hold: bool) -> Result<Self, sqlx::Error> {
        let holder = if hold { hold_the_log(pool).await } else { None };
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .persistent(false)
            .fetch_one(pool)
            .await?;
        Ok(Self(Some((lsn, holder))))
    }

    /// `figure` with the log written since this mark, per key of `keys`:
    /// `wal_bytes_per_key`, and `wal_records_per_key` where
    /// `pg_walinspect` is installed and the log since the mark is still
    /// there. Releases the log this mark held.
    pub(crate) async fn per_key(
        self,
        store: &Store,
        keys: u64,
        figure: Figure,
    ) -> Result<Figure, BenchError> {
        match store.postgres_pool() {
            Some(pool) => Ok(self.per_key_on(pool, keys, figure).await?),
            None => Ok(figure),
        }
    }

    /// [`per_key`](Self::per_key) on the server behind `pool`.
    async fn per_key_on(
        self,
        pool: &PgPool,
        keys: u64,
        figure: Figure,
    ) -> Result<Figure, sqlx::Error> {
        let Some((start, holder)) = self.0 else {
            return Ok(figure);
        };
        let (bytes, inspect): (i64, Option<String>) = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint,
                    (SELECT quote_ident(n.nspname) FROM pg_proc p
                     JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE p.proname = 'pg_get_wal_stats' LIMIT 1)",
        )
        .bind(&start)
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
            let records = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
                .bind(&start)
                .persistent(false)
                .fetch_one(pool)
                .await;
            match records {
                Ok(records) => {
                    figure = figure.with("wal_records_per_key", format!("{:.1}", per_key(records)));
                }
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(SEGMENT_REMOVED) => {
                    tracing::warn!(
                        "a checkpoint removed part of the log the timing wrote: its records are \
                         not counted (a superuser's bench holds the log with a replication slot)"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(holder) = holder {
            // Closing the connection drops its temporary slot.
            let _ = holder.close().await;
        }
        Ok(figure)
    }
}

/// A connection of its own holding the log from now on with a temporary
/// replication slot (dropped when it closes), or none where the server
/// refuses one.
async fn hold_the_log(pool: &PgPool) -> Option<PgConnection> {
    let mut conn = match pool.connect_options().connect().await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!(error = %e, "no connection to hold the log with");
            return None;
        }
    };
    let reserved = sqlx::query(
        "SELECT pg_create_physical_replication_slot(
             'drover_bench_' || pg_backend_pid(), true, true)",
    )
    .persistent(false)
    .execute(&mut conn)
    .await;
    match reserved {
        Ok(_) => Some(conn),
        Err(e) => {
            tracing::debug!(error = %e, "the log is not held: a checkpoint may cost the record count");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    //! Needs `DROVER_TEST_POSTGRES_URL` (a superuser, as CI's is): without
    //! it the tests skip with a printed reason; set, an unreachable database
    //! fails them.

    use sqlx::Executor as _;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    use super::{Figure, PgPool, WalMark};

    const POSTGRES_ENV: &str = "DROVER_TEST_POSTGRES_URL";

    /// Taken by each test for its whole run: one test's slot would hold the
    /// log for the other.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// The test server's options, `pg_walinspect` installed.
    async fn server() -> Option<(PgConnectOptions, PgPool)> {
        let Ok(url) = std::env::var(POSTGRES_ENV) else {
            eprintln!("skipping: {POSTGRES_ENV} is not set");
            return None;
        };
        let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .expect("the test server answers");
        // Another test binary may be creating it too: a lost race is fine.
        let created = admin
            .execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public")
            .await;
        if created.is_err() {
            admin
                .execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public")
                .await
                .expect("pg_walinspect");
        }
        Some((options, admin))
    }

    /// Moves the log on past two checkpoints, each after a switch to a new
    /// segment: a segment before them is removed (or recycled under another
    /// name) unless something holds it.
    async fn turn_the_log(admin: &PgPool) {
        for _ in 0..2 {
            admin
                .execute("SELECT pg_logical_emit_message(false, 'drover', 'turn')")
                .await
                .expect("a record");
            admin
                .execute("SELECT pg_switch_wal()")
                .await
                .expect("switch");
            admin.execute("CHECKPOINT").await.expect("checkpoint");
        }
    }

    /// A mark taken by a superuser holds the log: the records written across
    /// two checkpoints are still counted (without the slot `pg_get_wal_stats`
    /// fails on the removed segment, as it did in CI).
    #[tokio::test]
    async fn a_held_log_is_counted_across_checkpoints() {
        let _alone = ONE_AT_A_TIME.lock().await;
        let Some((_, admin)) = server().await else {
            return;
        };
        let mark = WalMark::at(&admin, true).await.expect("mark");
        let held = mark.0.as_ref().is_some_and(|(_, holder)| holder.is_some());
        assert!(held, "a superuser's mark holds the log");
        turn_the_log(&admin).await;
        let figure = mark
            .per_key_on(&admin, 1, Figure::new("wal"))
            .await
            .expect("the log since the mark is read");
        let records: f64 = figure
            .get("wal_records_per_key")
            .expect("records counted")
            .parse()
            .expect("a number");
        assert!(records >= 4.0, "{figure}");
        // A temporary slot goes as its connection's server process exits,
        // a moment after the close returns (on a loaded machine, after the
        // next statement of another connection): asked again until then.
        let gone = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let slots: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_replication_slots \
                     WHERE slot_name LIKE 'drover_bench_%'",
                )
                .fetch_one(&admin)
                .await
                .expect("slots");
                if slots == 0 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the slot went with its connection");
    }

    /// A role that may not hold the log still gets its figure after a
    /// checkpoint took the segments: the bytes, and no record count, not an
    /// error.
    #[tokio::test]
    async fn a_log_no_one_held_loses_the_record_count_not_the_figure() {
        let _alone = ONE_AT_A_TIME.lock().await;
        let Some((options, admin)) = server().await else {
            return;
        };
        let role = format!("drover_wal_{}", std::process::id());
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE ROLE {role} LOGIN IN ROLE pg_read_server_files"
            )))
            .await
            .expect("a plain role");
        let plain = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.username(&role))
            .await
            .expect("the plain role connects");
        let mark = WalMark::at(&plain, true).await.expect("mark");
        let held = mark.0.as_ref().is_some_and(|(_, holder)| holder.is_some());
        turn_the_log(&admin).await;
        let figure = mark.per_key_on(&plain, 1, Figure::new("wal")).await;
        plain.close().await;
        admin
            .execute(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
            .await
            .expect("drop the role");
        let figure = figure.expect("a figure, not an error");
        assert!(!held, "a plain role cannot reserve a slot");
        assert!(figure.get("wal_bytes_per_key").is_some(), "{figure}");
        assert_eq!(figure.get("wal_records_per_key"), None, "{figure}");
    }
}
