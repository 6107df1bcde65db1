//! Resync's steps on SQLite (see [`ResyncSteps`]): the batch's `BEGIN
//! IMMEDIATE` transaction holds the file's write lock, so two walkers never
//! interleave, and nothing changes between reading a window and writing it.

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::rows::{to_ms, to_time};
use crate::store::StoreError;
use crate::store::rules::resync::{ResyncSteps, Rules, Seen, Walk};
use crate::store::rules::rows::Lossy;

/// The walk's row, as stored.
#[derive(Debug, sqlx::FromRow)]
struct WalkRow {
    walk_key: Option<String>,
    pass_started_at: Option<i64>,
    pass_next_due: Option<i64>,
    pass_resynced: i64,
    next_due_at: Option<i64>,
}

/// A row of the window.
#[derive(Debug, sqlx::FromRow)]
struct SeenRow {
    key: Lossy,
    /// The key's bytes in hex (see [`Seen::cursor`]).
    cursor: String,
    idle: bool,
    /// Read as SQLite reads a value as an integer (see `base!`).
    base: i64,
}

/// When a key's last run ended (its enqueue, if it never ran), as SQLite
/// reads the value as an integer: SQL straight into `drover_items` checks no
/// types, and read as it was stored, one fraction there failed the window
/// with a `ColumnDecode` error, and so every batch of the process's resync,
/// stuck at that window for good. [`RESYNC`] checks the same value.
macro_rules! base {
    () => {
        "CAST(COALESCE(last_ended_at, enqueued_at) AS INTEGER)"
    };
}

/// The next `?3` keys of the process after the key whose bytes are the hex
/// `?2`, in key order, whatever their state (so the read is bounded by the
/// batch). Walked by the exact bytes: a key that is not UTF-8 is read with
/// U+FFFD, which sorts before its bad bytes, and a walk going on from that
/// would read it again.
const WINDOW: &str = concat!(
    "SELECT key, hex(key) AS cursor, state = 'idle' AS idle, ",
    base!(),
    " AS base
FROM drover_items WHERE process = ?1 AND key > CAST(unhex(?2) AS TEXT) ORDER BY key LIMIT ?3"
);

/// Makes the due keys (`?2`, a JSON array of their bytes in hex) pending at
/// priority `?3`, pending since `?4`, if still idle and not run since `?5`.
const RESYNC: &str = concat!(
    "
UPDATE drover_items SET state = 'pending', priority = ?3, ready_at = ?4, enqueued_at = ?4
WHERE process = ?1 AND key IN (SELECT CAST(unhex(value) AS TEXT) FROM json_each(?2))
    AND state = 'idle' AND ",
    base!(),
    " <= ?5"
);

/// Stores the walk after a batch; `?7` ends the pass with `?8` keys resynced.
const SAVE: &str = "
UPDATE drover_resync SET walk_key = ?2, pass_started_at = ?3, pass_next_due = ?4,
    pass_resynced = ?5, next_due_at = ?6,
    last_pass_ended_at = CASE WHEN ?7 THEN ?9 ELSE last_pass_ended_at END,
    last_pass_resynced = CASE WHEN ?7 THEN ?8 ELSE last_pass_resynced END
WHERE process = ?1";

impl ResyncSteps for SqliteStore {
    type Tx = Tx;

    async fn begin(&self) -> Result<(Tx, DateTime<Utc>), StoreError> {
        let (tx, now) = self.write().await?;
        Ok((tx, to_time(now)))
    }

    async fn rules(&self, tx: &mut Tx, process: &str) -> Result<Option<Rules>, StoreError> {
        sqlx::query_as(
            "SELECT resync_every_ms, resync_jitter, resync_priority
             FROM drover_processes WHERE process = ?1",
        )
        .bind(process)
        .fetch_optional(&mut **tx)
        .await
        .db()
    }

    async fn walk(&self, tx: &mut Tx, process: &str) -> Result<Option<Walk>, StoreError> {
        sqlx::query("INSERT INTO drover_resync (process) VALUES (?1) ON CONFLICT DO NOTHING")
            .bind(process)
            .exec(&mut **tx)
            .await?;
        let r: WalkRow = sqlx::query_as(
            "SELECT walk_key, pass_started_at, pass_next_due, pass_resynced, next_due_at
             FROM drover_resync WHERE process = ?1",
        )
        .bind(process)
        .fetch_one(&mut **tx)
        .await
        .db()?;
        Ok(Some(Walk {
            walk_key: r.walk_key,
            pass_started_at: r.pass_started_at.map(to_time),
            pass_next_due: r.pass_next_due.map(to_time),
            pass_resynced: r.pass_resynced,
            next_due_at: r.next_due_at.map(to_time),
        }))
    }

    async fn window(
        &self,
        tx: &mut Tx,
        process: &str,
        after: &str,
        batch: u32,
    ) -> Result<Vec<Seen>, StoreError> {
        let rows: Vec<SeenRow> = sqlx::query_as(WINDOW)
            .bind(process)
            .bind(after)
            .bind(batch)
            .fetch_all(&mut **tx)
            .await
            .db()?;
        Ok(rows
            .into_iter()
            .map(|r| Seen {
                key: r.key.0,
                cursor: r.cursor,
                idle: r.idle,
                base: to_time(r.base),
            })
            .collect())
    }

    async fn resync(
        &self,
        tx: &mut Tx,
        process: &str,
        keys: &[String],
        (priority, now, since): (i32, DateTime<Utc>, DateTime<Utc>),
    ) -> Result<u64, StoreError> {
        let keys = serde_json::to_string(keys).expect("a list of keys always serializes");
        sqlx::query(RESYNC)
            .bind(process)
            .bind(keys)
            .bind(priority)
            .bind(to_ms(now))
            .bind(to_ms(since))
            .exec(&mut **tx)
            .await
    }

    async fn save(
        &self,
        tx: &mut Tx,
        process: &str,
        walk: &Walk,
        (finished, total, now): (bool, i64, DateTime<Utc>),
    ) -> Result<(), StoreError> {
        sqlx::query(SAVE)
            .bind(process)
            .bind(&walk.walk_key)
            .bind(walk.pass_started_at.map(to_ms))
            .bind(walk.pass_next_due.map(to_ms))
            .bind(walk.pass_resynced)
            .bind(walk.next_due_at.map(to_ms))
            .bind(finished)
            .bind(total)
            .bind(to_ms(now))
            .exec(&mut **tx)
            .await?;
        Ok(())
    }

    async fn commit(&self, tx: Tx, _process: &str, _wake: bool) -> Result<(), StoreError> {
        // Waiters in this process are woken by `Store`; SQLite has no other
        // nodes to tell.
        tx.commit().await.db()
    }
}
