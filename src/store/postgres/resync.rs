//! Resync on PostgreSQL: one batch of the shared walk per transaction. The
//! walk's row is taken `FOR UPDATE SKIP LOCKED`, so two nodes never walk the
//! same process at once and neither waits for the other; the window is read
//! without locks (claims and completions never wait for it), and only the
//! due keys are locked, by the update, in key order as enqueues lock them.

use chrono::{DateTime, Utc};

use super::engine::PostgresStore;
use super::error::{Db as _, commit};
use crate::store::StoreError;
use crate::store::key::validate_process;
use crate::store::params::ResyncBatch;
use crate::store::resync::{self, Rules, Seen, Walk};
use crate::store::settle::earlier;
use crate::store::types::ResyncReport;

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

pub(super) async fn batch(
    store: &PostgresStore,
    params: &ResyncBatch,
) -> Result<ResyncReport, StoreError> {
    validate_process(&params.process)?;
    let process = params.process.as_str();
    let (mut tx, now) = store.write().await?;
    let rules: Option<Rules> = sqlx::query_as(
        "SELECT resync_every_ms, resync_jitter, resync_priority
         FROM drover_processes WHERE process = $1",
    )
    .bind(process)
    .fetch_optional(&mut tx)
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
    sqlx::query("INSERT INTO drover_resync (process) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(process)
        .execute(&mut tx)
        .await
        .db()?;
    let row: Option<WalkRow> = sqlx::query_as(
        "SELECT walk_key, pass_started_at, pass_next_due, pass_resynced, next_due_at
         FROM drover_resync WHERE process = $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(process)
    .fetch_optional(&mut tx)
    .await
    .db()?;
    // Locked: another node is walking this process right now.
    let Some(row) = row else { return Ok(done) };
    let walk = Walk {
        walk_key: row.walk_key,
        pass_started_at: row.pass_started_at,
        pass_next_due: row.pass_next_due,
        pass_resynced: row.pass_resynced,
        next_due_at: row.next_due_at,
    };
    if !resync::walks(&walk, every, now, params.start) {
        commit(tx).await?;
        return Ok(done);
    }
    let batch = resync::batch(params.batch);
    let rows: Vec<SeenRow> = sqlx::query_as(WINDOW)
        .bind(process)
        .bind(walk.walk_key.as_deref().unwrap_or(""))
        .bind(i64::from(batch))
        .fetch_all(&mut tx)
        .await
        .db()?;
    let rows: Vec<Seen> = rows
        .into_iter()
        .map(|r| Seen {
            key: r.key,
            idle: r.idle,
            base: r.base,
        })
        .collect();
    let window = resync::window(&rows, &rules, now, batch);
    let resynced = if window.due.is_empty() {
        0
    } else {
        sqlx::query(RESYNC)
            .bind(process)
            .bind(&window.due)
            .bind(rules.resync_priority)
            .bind(now)
            .bind(earlier(now, every))
            .execute(&mut tx)
            .await
            .db()?
            .rows_affected()
    };
    let (next, finished, total) = resync::advance(&walk, &window, resynced, now);
    sqlx::query(SAVE)
        .bind(process)
        .bind(&next.walk_key)
        .bind(next.pass_started_at)
        .bind(next.pass_next_due)
        .bind(next.pass_resynced)
        .bind(next.next_due_at)
        .bind(finished)
        .bind(total)
        .bind(now)
        .execute(&mut tx)
        .await
        .db()?;
    if resynced > 0 {
        PostgresStore::notify_ready(&mut tx, process).await?;
    }
    commit(tx).await?;
    Ok(ResyncReport {
        resynced,
        done: finished,
    })
}
