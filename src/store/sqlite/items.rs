//! Enqueueing on SQLite: one upsert for the whole batch, coalescing in SQL.

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::enqueue::checked_keys;
use crate::store::key::validate_process;
use crate::store::params::{ItemEnqueue, ProcessConfigure};
use crate::store::types::EnqueueReport;

/// DESIGN.md rule 2 in one statement. A pending key keeps the earlier ready time
/// (never earlier than its backoff unless `?6` bypasses it, which also clears
/// the backoff, so status and `lease_lock` agree the key is ready) and the
/// higher priority; a parked key is revived; a running key is marked dirty, remembering
/// the earliest ready time and highest priority asked for.
const UPSERT: &str = "
INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at)
SELECT ?1, j.value, 'pending', ?2, ?3, ?4 FROM json_each(?5) AS j WHERE true
ON CONFLICT (process, key) DO UPDATE SET
  priority = CASE i.state WHEN 'pending' THEN MAX(i.priority, excluded.priority)
                          WHEN 'parked' THEN excluded.priority ELSE i.priority END,
  ready_at = CASE i.state
      WHEN 'pending' THEN MIN(i.ready_at, CASE WHEN ?6 THEN excluded.ready_at
          ELSE MAX(excluded.ready_at, COALESCE(i.backoff_until, excluded.ready_at)) END)
      WHEN 'parked' THEN excluded.ready_at ELSE i.ready_at END,
  enqueued_at = CASE i.state WHEN 'parked' THEN excluded.enqueued_at ELSE i.enqueued_at END,
  backoff_until = CASE WHEN ?6 AND i.state = 'pending' THEN NULL ELSE i.backoff_until END,
  dirty_since = CASE i.state WHEN 'running'
      THEN COALESCE(i.dirty_since, excluded.enqueued_at) ELSE i.dirty_since END,
  dirty_ready_at = CASE i.state WHEN 'running'
      THEN MIN(COALESCE(i.dirty_ready_at, excluded.ready_at), excluded.ready_at)
      ELSE i.dirty_ready_at END,
  dirty_priority = CASE i.state WHEN 'running'
      THEN MAX(COALESCE(i.dirty_priority, excluded.priority), excluded.priority)
      ELSE i.dirty_priority END,
  state = CASE i.state WHEN 'running' THEN 'running' ELSE 'pending' END";

/// How many keys of the batch `?2` are running (the upsert marks them dirty).
/// Every other key ends up pending, so this and the batch's size give the
/// report without `RETURNING` a row per key (a tenth of the enqueue's time).
/// `state <> 'pending'` lets the planner probe the small partial index of
/// running and parked rows once per key; with `state = 'running'` alone it
/// walked every row of the process in the unique index instead, so each batch
/// cost time in proportion to the backlog (18 ms per 10,000 keys at 50,000
/// pending, growing without bound).
pub(super) const RUNNING: &str = "
SELECT count(*) FROM drover_items
WHERE process = ?1 AND state <> 'pending' AND key IN (SELECT value FROM json_each(?2))
    AND state = 'running'";

pub(super) async fn enqueue(
    store: &SqliteStore,
    params: ItemEnqueue,
) -> Result<EnqueueReport, StoreError> {
    let keys = checked_keys(&params.process, &params.keys)?;
    if keys.is_empty() {
        return Ok(EnqueueReport::default());
    }
    let count = keys.len() as u64;
    // Straight to text: no intermediate `serde_json::Value` (a string per key).
    let keys = serde_json::to_string(&keys).expect("a list of strings always serializes");
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let running: i64 = sqlx::query_scalar(RUNNING)
        .bind(&params.process)
        .bind(&keys)
        .fetch_one(&mut *tx)
        .await
        .db()?;
    let ready_at = now.saturating_add(duration_ms(params.after));
    sqlx::query(UPSERT)
        .bind(&params.process)
        .bind(params.priority)
        .bind(ready_at)
        .bind(now)
        .bind(&keys)
        .bind(params.bypass_backoff)
        .execute(&mut *tx)
        .await
        .db()?;
    sqlx::query(
        "INSERT INTO drover_history (at, process, key, event)
         SELECT ?1, ?2, j.value, 'enqueued' FROM json_each(?3) AS j",
    )
    .bind(now)
    .bind(&params.process)
    .bind(&keys)
    .execute(&mut *tx)
    .await
    .db()?;
    tx.commit().await.db()?;
    // A count of rows is never negative.
    let dirty = running.unsigned_abs();
    Ok(EnqueueReport {
        pending: count - dirty,
        dirty,
    })
}

/// Makes a process known (so queries about it are not refused as unknown).
pub(super) async fn ensure_process(tx: &mut Tx, now: i64, process: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO drover_processes (process, created_at) VALUES (?1, ?2)
         ON CONFLICT (process) DO NOTHING",
    )
    .bind(process)
    .bind(now)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

pub(super) async fn configure(
    store: &SqliteStore,
    params: ProcessConfigure,
) -> Result<(), StoreError> {
    validate_process(&params.process)?;
    let b = params.backoff;
    let (mut tx, now) = store.write().await?;
    sqlx::query(
        "INSERT INTO drover_processes (process, backoff_initial_ms, backoff_factor,
             backoff_max_ms, backoff_jitter, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (process) DO UPDATE SET backoff_initial_ms = excluded.backoff_initial_ms,
             backoff_factor = excluded.backoff_factor, backoff_max_ms = excluded.backoff_max_ms,
             backoff_jitter = excluded.backoff_jitter",
    )
    .bind(&params.process)
    .bind(duration_ms(b.initial()))
    .bind(b.factor())
    .bind(duration_ms(b.max()))
    .bind(b.jitter())
    .bind(now)
    .execute(&mut *tx)
    .await
    .db()?;
    tx.commit().await.db()?;
    Ok(())
}
