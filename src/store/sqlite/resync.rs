//! Resync on SQLite: one batch of the shared walk per `BEGIN IMMEDIATE`
//! transaction, which every other writer of the file waits for, so two
//! walkers never interleave; a batch reads one window of keys and changes
//! only the due idle ones.

use super::engine::SqliteStore;
use super::error::Db as _;
use super::rows::{to_ms, to_time};
use crate::store::StoreError;
use crate::store::key::validate_process;
use crate::store::params::ResyncBatch;
use crate::store::resync::{self, Rules, Seen, Walk};
use crate::store::types::ResyncReport;

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
    key: String,
    idle: bool,
    base: i64,
}

/// The next `?3` keys of the process after `?2`, in key order, whatever
/// their state (so the read is bounded by the batch).
const WINDOW: &str = "
SELECT key, state = 'idle' AS idle, COALESCE(last_ended_at, enqueued_at) AS base
FROM drover_items WHERE process = ?1 AND key > ?2 ORDER BY key LIMIT ?3";

/// Makes the due keys (`?2`, a JSON array) pending at priority `?3`, pending
/// since `?4`, if still idle.
const RESYNC: &str = "
UPDATE drover_items SET state = 'pending', priority = ?3, ready_at = ?4, enqueued_at = ?4
WHERE process = ?1 AND key IN (SELECT value FROM json_each(?2)) AND state = 'idle'";

/// Stores the walk after a batch; `?7` ends the pass with `?8` keys resynced.
const SAVE: &str = "
UPDATE drover_resync SET walk_key = ?2, pass_started_at = ?3, pass_next_due = ?4,
    pass_resynced = ?5, next_due_at = ?6,
    last_pass_ended_at = CASE WHEN ?7 THEN ?9 ELSE last_pass_ended_at END,
    last_pass_resynced = CASE WHEN ?7 THEN ?8 ELSE last_pass_resynced END
WHERE process = ?1";

pub(super) async fn batch(
    store: &SqliteStore,
    params: &ResyncBatch,
) -> Result<ResyncReport, StoreError> {
    validate_process(&params.process)?;
    let process = params.process.as_str();
    let (mut tx, now_ms) = store.write().await?;
    let now = to_time(now_ms);
    let rules: Option<Rules> = sqlx::query_as(
        "SELECT resync_every_ms, resync_jitter, resync_priority
         FROM drover_processes WHERE process = ?1",
    )
    .bind(process)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    let rules = rules.ok_or_else(|| StoreError::UnknownProcess(process.to_owned()))?;
    let done = ResyncReport {
        resynced: 0,
        done: true,
    };
    let Some(every) = rules.every() else {
        return Ok(done);
    };
    sqlx::query("INSERT INTO drover_resync (process) VALUES (?1) ON CONFLICT DO NOTHING")
        .bind(process)
        .execute(&mut *tx)
        .await
        .db()?;
    let row: WalkRow = sqlx::query_as(
        "SELECT walk_key, pass_started_at, pass_next_due, pass_resynced, next_due_at
         FROM drover_resync WHERE process = ?1",
    )
    .bind(process)
    .fetch_one(&mut *tx)
    .await
    .db()?;
    let walk = Walk {
        walk_key: row.walk_key,
        pass_started_at: row.pass_started_at.map(to_time),
        pass_next_due: row.pass_next_due.map(to_time),
        pass_resynced: row.pass_resynced,
        next_due_at: row.next_due_at.map(to_time),
    };
    if !resync::walks(&walk, every, now, params.start) {
        tx.commit().await.db()?;
        return Ok(done);
    }
    let batch = resync::batch(params.batch);
    let rows: Vec<SeenRow> = sqlx::query_as(WINDOW)
        .bind(process)
        .bind(walk.walk_key.as_deref().unwrap_or(""))
        .bind(batch)
        .fetch_all(&mut *tx)
        .await
        .db()?;
    let rows: Vec<Seen> = rows
        .into_iter()
        .map(|r| Seen {
            key: r.key,
            idle: r.idle,
            base: to_time(r.base),
        })
        .collect();
    let window = resync::window(&rows, &rules, now, batch);
    let resynced = if window.due.is_empty() {
        0
    } else {
        let keys = serde_json::to_string(&window.due).expect("a list of keys always serializes");
        sqlx::query(RESYNC)
            .bind(process)
            .bind(keys)
            .bind(rules.resync_priority)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .db()?
            .rows_affected()
    };
    let (next, finished, total) = resync::advance(&walk, &window, resynced, now);
    sqlx::query(SAVE)
        .bind(process)
        .bind(&next.walk_key)
        .bind(next.pass_started_at.map(to_ms))
        .bind(next.pass_next_due.map(to_ms))
        .bind(next.pass_resynced)
        .bind(next.next_due_at.map(to_ms))
        .bind(finished)
        .bind(total)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    Ok(ResyncReport {
        resynced,
        done: finished,
    })
}
