//! Enqueueing on PostgreSQL: one upsert for the whole batch, coalescing in SQL,
//! then a `NOTIFY` delivered on commit.

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::enqueue::checked_keys;
use crate::store::key::validate_process;
use crate::store::params::{ItemEnqueue, ProcessConfigure};
use crate::store::settle::later;
use crate::store::types::EnqueueReport;

/// DESIGN.md rule 2 in one statement, with the `enqueued` history. A pending key
/// keeps the earlier ready time (never earlier than its backoff unless `$6`
/// bypasses it) and the higher priority; a parked key is revived; a running key
/// is marked dirty, remembering the earliest ready time and highest priority.
const UPSERT: &str = "
WITH logged AS (
  INSERT INTO drover_history (at, process, key, event)
  SELECT $4, $1, k, 'enqueued' FROM UNNEST($5::text[]) AS k)
INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at)
SELECT $1, k, 'pending', $2, $3, $4 FROM UNNEST($5::text[]) AS k
ON CONFLICT (process, key) DO UPDATE SET
  priority = CASE i.state WHEN 'pending' THEN GREATEST(i.priority, EXCLUDED.priority)
                          WHEN 'parked' THEN EXCLUDED.priority ELSE i.priority END,
  ready_at = CASE i.state
      WHEN 'pending' THEN LEAST(i.ready_at, CASE WHEN $6 THEN EXCLUDED.ready_at
          ELSE GREATEST(EXCLUDED.ready_at, i.backoff_until) END)
      WHEN 'parked' THEN EXCLUDED.ready_at ELSE i.ready_at END,
  enqueued_at = CASE i.state WHEN 'parked' THEN EXCLUDED.enqueued_at ELSE i.enqueued_at END,
  dirty_since = CASE i.state WHEN 'running'
      THEN COALESCE(i.dirty_since, EXCLUDED.enqueued_at) ELSE i.dirty_since END,
  dirty_ready_at = CASE i.state WHEN 'running'
      THEN LEAST(i.dirty_ready_at, EXCLUDED.ready_at) ELSE i.dirty_ready_at END,
  dirty_priority = CASE i.state WHEN 'running'
      THEN GREATEST(i.dirty_priority, EXCLUDED.priority) ELSE i.dirty_priority END,
  state = CASE i.state WHEN 'running' THEN 'running' ELSE 'pending' END
RETURNING state";

pub(super) async fn enqueue(
    store: &PostgresStore,
    params: &ItemEnqueue,
) -> Result<EnqueueReport, StoreError> {
    let keys = checked_keys(&params.process, &params.keys)?;
    if keys.is_empty() {
        return Ok(EnqueueReport::default());
    }
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let states: Vec<String> = sqlx::query_scalar(UPSERT)
        .bind(&params.process)
        .bind(params.priority)
        .bind(later(now, params.after))
        .bind(now)
        .bind(&keys)
        .bind(params.bypass_backoff)
        .fetch_all(&mut *tx)
        .await
        .db()?;
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(PostgresStore::notify_channel(&params.process))
        .execute(&mut *tx)
        .await
        .db()?;
    commit(tx).await?;
    let dirty = states.iter().filter(|s| *s == "running").count() as u64;
    Ok(EnqueueReport {
        pending: states.len() as u64 - dirty,
        dirty,
    })
}

/// Makes a process known (so queries about it are not refused as unknown).
pub(super) async fn ensure_process(
    tx: &mut Tx,
    now: DateTime<Utc>,
    process: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO drover_processes (process, created_at) VALUES ($1, $2)
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
    store: &PostgresStore,
    params: &ProcessConfigure,
) -> Result<(), StoreError> {
    validate_process(&params.process)?;
    let b = params.backoff;
    let (mut tx, now) = store.write().await?;
    sqlx::query(
        "INSERT INTO drover_processes (process, backoff_initial_ms, backoff_factor,
             backoff_max_ms, backoff_jitter, created_at) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (process) DO UPDATE SET backoff_initial_ms = EXCLUDED.backoff_initial_ms,
             backoff_factor = EXCLUDED.backoff_factor, backoff_max_ms = EXCLUDED.backoff_max_ms,
             backoff_jitter = EXCLUDED.backoff_jitter",
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
    commit(tx).await?;
    Ok(())
}
