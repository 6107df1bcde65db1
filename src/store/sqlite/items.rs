//! Enqueueing on SQLite: one insert of the whole batch into the view
//! `drover_enqueue`, whose trigger coalesces in SQL.
//! An enqueue writes no history row: the item counts its enqueues and keeps
//! the first and last one's time.

use sqlx::SqliteConnection;

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::enqueue::checked_keys;
use crate::store::params::ItemEnqueue;
use crate::store::types::EnqueueReport;

/// DESIGN.md rule 2, as the view `drover_enqueue`'s `INSTEAD OF INSERT`
/// trigger (migration 0006) writes it, one key per row: the same SQL other
/// programs run inside their own transactions, and triggers on watched tables.
/// It makes the process known and coalesces each key into its item. `?5` is
/// the test clock's offset, `?6` the keys as a JSON array.
const ENQUEUE: &str = "
INSERT INTO drover_enqueue (process, key, priority, delay_ms, bypass_backoff, clock_offset_ms)
SELECT ?1, j.value, ?2, ?3, ?4, ?5 FROM json_each(?6) AS j";

/// How many keys of the batch `?2` are running (the upsert marks them dirty).
/// Every other key ends up pending, so this and the batch's size give the
/// report without `RETURNING` a row per key (a tenth of the enqueue's time).
/// `state IN ('running', 'parked')` lets the planner probe the small partial
/// index of running and parked rows once per key; with `state = 'running'`
/// alone it walked every row of the process in the unique index instead, so
/// each batch cost time in proportion to the backlog (18 ms per 10,000 keys at
/// 50,000 pending, growing without bound).
pub(super) const RUNNING: &str = "
SELECT count(*) FROM drover_items
WHERE process = ?1 AND state IN ('running', 'parked')
    AND key IN (SELECT value FROM json_each(?2)) AND state = 'running'";

/// Validates the batch, then writes it in one write transaction.
pub(super) async fn enqueue(
    store: &SqliteStore,
    params: ItemEnqueue,
) -> Result<EnqueueReport, StoreError> {
    let mut tx = store.writer.begin_with("BEGIN IMMEDIATE").await.db()?;
    let report = coalesce(store, &mut tx, &params).await?;
    tx.commit().await.db()?;
    Ok(report)
}

/// Checks the batch and coalesces it into the items with [`ENQUEUE`] on
/// `conn`: the store's own transaction or a caller's.
pub(super) async fn coalesce(
    store: &SqliteStore,
    conn: &mut SqliteConnection,
    params: &ItemEnqueue,
) -> Result<EnqueueReport, StoreError> {
    let keys = checked_keys(&params.process, &params.keys)?;
    if keys.is_empty() {
        return Ok(EnqueueReport::default());
    }
    let count = keys.len() as u64;
    // Straight to text: no intermediate `serde_json::Value` (a string per key).
    let keys = serde_json::to_string(&keys).expect("a list of strings always serializes");
    let running: i64 = sqlx::query_scalar(RUNNING)
        .bind(&params.process)
        .bind(&keys)
        .fetch_one(&mut *conn)
        .await
        .db()?;
    sqlx::query(ENQUEUE)
        .bind(&params.process)
        .bind(params.priority)
        .bind(duration_ms(params.after))
        .bind(params.bypass_backoff)
        .bind(store.clock.offset_ms())
        .bind(&keys)
        .execute(&mut *conn)
        .await
        .db()?;
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
