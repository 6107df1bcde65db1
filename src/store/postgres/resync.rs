//! Resync's steps on PostgreSQL (see [`ResyncSteps`]). The walk's row is
//! taken `FOR UPDATE SKIP LOCKED`, so two nodes never walk the same process
//! at once and neither waits for the other; the window is read without locks
//! (claims and completions never wait for it), and only the due keys are
//! locked, by the update, in key order as enqueues lock them.

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use crate::store::StoreError;
use crate::store::rules::resync::{ResyncSteps, Rules, Seen, Walk};

/// The walk's row, as stored.
#[derive(Debug, sqlx::FromRow)]
struct WalkRow {
    walk_key: Option<String>,
    pass_started_at: Option<DateTime<Utc>>,
    pass_next_due: Option<DateTime<Utc>>,
    pass_resynced: i64,
    next_due_at: Option<DateTime<Utc>>,
}

/// A row of the window.
#[derive(Debug, sqlx::FromRow)]
struct SeenRow {
    key: String,
    idle: bool,
    base: DateTime<Utc>,
}

/// The next `$3` keys of the process after `$2`, in key order, whatever
/// their state (so the read is bounded by the batch).
const WINDOW: &str = "
SELECT key, state = 'idle' AS idle, COALESCE(last_ended_at, enqueued_at) AS base
FROM drover_items WHERE process = $1 AND key > $2 ORDER BY key LIMIT $3";

/// Makes the due keys `$2` pending at priority `$3`, pending since `$4`; a
/// key that stopped being idle, or ran again, after the window was read
/// (its last run ended after `$5`, now − the interval) is left alone.
const RESYNC: &str = "
UPDATE drover_items SET state = 'pending', priority = $3, ready_at = $4, enqueued_at = $4
WHERE process = $1 AND key = ANY($2::text[]) AND state = 'idle'
    AND COALESCE(last_ended_at, enqueued_at) <= $5";

/// Stores the walk after a batch; `$7` ends the pass with `$8` keys resynced.
const SAVE: &str = "
UPDATE drover_resync SET walk_key = $2, pass_started_at = $3, pass_next_due = $4,
    pass_resynced = $5, next_due_at = $6,
    last_pass_ended_at = CASE WHEN $7 THEN $9 ELSE last_pass_ended_at END,
    last_pass_resynced = CASE WHEN $7 THEN $8 ELSE last_pass_resynced END
WHERE process = $1";

impl ResyncSteps for PostgresStore {
    type Tx = Tx;

    async fn begin(&self) -> Result<(Tx, DateTime<Utc>), StoreError> {
        self.write().await
    }

    async fn rules(&self, tx: &mut Tx, process: &str) -> Result<Option<Rules>, StoreError> {
        sqlx::query_as(
            "SELECT resync_every_ms, resync_jitter, resync_priority
             FROM drover_processes WHERE process = $1",
        )
        .bind(process)
        .fetch_optional(tx)
        .await
        .db()
    }

    async fn walk(&self, tx: &mut Tx, process: &str) -> Result<Option<Walk>, StoreError> {
        sqlx::query("INSERT INTO drover_resync (process) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(process)
            .exec(&mut *tx)
            .await?;
        let row: Option<WalkRow> = sqlx::query_as(
            "SELECT walk_key, pass_started_at, pass_next_due, pass_resynced, next_due_at
             FROM drover_resync WHERE process = $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(process)
        .fetch_optional(tx)
        .await
        .db()?;
        Ok(row.map(|r| Walk {
            walk_key: r.walk_key,
            pass_started_at: r.pass_started_at,
            pass_next_due: r.pass_next_due,
            pass_resynced: r.pass_resynced,
            next_due_at: r.next_due_at,
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
            .bind(i64::from(batch))
            .fetch_all(tx)
            .await
            .db()?;
        Ok(rows
            .into_iter()
            .map(|r| Seen {
                cursor: r.key.clone(),
                key: r.key,
                idle: r.idle,
                base: r.base,
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
        sqlx::query(RESYNC)
            .bind(process)
            .bind(keys)
            .bind(priority)
            .bind(now)
            .bind(since)
            .exec(tx)
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
            .bind(walk.pass_started_at)
            .bind(walk.pass_next_due)
            .bind(walk.pass_resynced)
            .bind(walk.next_due_at)
            .bind(finished)
            .bind(total)
            .bind(now)
            .exec(tx)
            .await?;
        Ok(())
    }

    async fn commit(&self, mut tx: Tx, process: &str, wake: bool) -> Result<(), StoreError> {
        if wake {
            PostgresStore::notify_ready(&mut tx, process).await?;
        }
        commit(tx).await
    }
}
