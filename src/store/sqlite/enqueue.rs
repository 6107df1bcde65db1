//! Enqueueing on SQLite: one set-based upsert of the whole batch, coalescing
//! in SQL by the same rules as the view `drover_enqueue` that other programs
//! insert into (whose trigger coalesces one key per row, at about half the
//! speed on bulk batches). A store connected with
//! [`StoreOptions::sqlite_enqueue_through_view`](crate::store::StoreOptions::sqlite_enqueue_through_view)
//! inserts into the view instead, so the contract suite runs both.
//! An enqueue writes no history row: the item counts its enqueues and keeps
//! the first and last one's time.

use crate::store::exec::Exec as _;
use sqlx::SqliteConnection;

use super::engine::{SqliteStore, clock_ms};
use super::error::Db as _;
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::params::ItemEnqueue;
use crate::store::rules::enqueue::checked_keys;
use crate::store::types::EnqueueReport;

/// DESIGN.md rule 2 in one statement for the whole batch `?5` (a JSON array),
/// the clock read once (`?4` is the test clock's offset). A pending key keeps
/// the earlier ready time (never earlier than its backoff unless `?6` bypasses
/// it, which also clears the backoff, so status and `lease_lock` agree the key
/// is ready) and the higher priority; a parked or idle key becomes pending
/// (pending since now); a running key is marked dirty, remembering the
/// earliest ready time and highest priority asked for. Every key counts the
/// enqueue. The view's trigger (migrations 0006 and 0010) says the same per
/// key; the contract suite runs through both.
pub(super) const UPSERT: &str = concat!(
    "
INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at,
    first_enqueued_at, last_enqueued_at, enqueue_count)
SELECT ?1, j.value, 'pending', ?2, t.now + ?3, t.now, t.now, t.now, 1
FROM (SELECT ",
    clock_ms!(),
    " + ?4 AS now) AS t, json_each(?5) AS j
WHERE true
ON CONFLICT (process, key) DO UPDATE SET
  priority = CASE i.state WHEN 'pending' THEN MAX(i.priority, excluded.priority)
                          WHEN 'running' THEN i.priority ELSE excluded.priority END,
  ready_at = CASE i.state
      WHEN 'pending' THEN MIN(i.ready_at, CASE WHEN ?6 THEN excluded.ready_at
          ELSE MAX(excluded.ready_at, COALESCE(i.backoff_until, excluded.ready_at)) END)
      WHEN 'running' THEN i.ready_at ELSE excluded.ready_at END,
  enqueued_at = CASE i.state WHEN 'parked' THEN excluded.enqueued_at
                             WHEN 'idle' THEN excluded.enqueued_at ELSE i.enqueued_at END,
  backoff_until = CASE WHEN ?6 AND i.state = 'pending' THEN NULL ELSE i.backoff_until END,
  dirty_since = CASE i.state WHEN 'running'
      THEN COALESCE(i.dirty_since, excluded.enqueued_at) ELSE i.dirty_since END,
  dirty_ready_at = CASE i.state WHEN 'running'
      THEN MIN(COALESCE(i.dirty_ready_at, excluded.ready_at), excluded.ready_at)
      ELSE i.dirty_ready_at END,
  dirty_priority = CASE i.state WHEN 'running'
      THEN MAX(COALESCE(i.dirty_priority, excluded.priority), excluded.priority)
      ELSE i.dirty_priority END,
  first_enqueued_at = COALESCE(i.first_enqueued_at, excluded.enqueued_at),
  last_enqueued_at = excluded.enqueued_at,
  enqueue_count = i.enqueue_count + 1,
  state = CASE i.state WHEN 'running' THEN 'running' ELSE 'pending' END"
);

/// Makes the process of the batch known (`?2`: the test clock's offset).
const PROCESS: &str = concat!(
    "
INSERT INTO drover_processes (process, created_at)
VALUES (?1, ",
    clock_ms!(),
    " + ?2)
ON CONFLICT (process) DO NOTHING"
);

/// DESIGN.md rule 2, as the view `drover_enqueue`'s `INSTEAD OF INSERT`
/// trigger (migrations 0006 and 0010) writes it, one key per row: the same SQL
/// other programs run inside their own transactions, and triggers on watched
/// tables; the store runs it only when connected to test it. It makes the
/// process known and coalesces each key into its item. `?5` is
/// the test clock's offset, `?6` the keys as a JSON array.
const ENQUEUE: &str = "
INSERT INTO drover_enqueue (process, key, priority, delay_ms, bypass_backoff, clock_offset_ms)
SELECT ?1, j.value, ?2, ?3, ?4, ?5 FROM json_each(?6) AS j";

/// How many keys of the batch `?2` are running (the upsert marks them dirty).
/// Every other key ends up pending, so this and the batch's size give the
/// report without `RETURNING` a row per key (a tenth of the enqueue's time).
/// The batch's keys are distinct ([`checked_keys`]). The `CROSS JOIN` fixes
/// the order: each key of the batch probes the unique `(process, key)` index
/// once. Left to choose, the planner walked every row of the process in that
/// index instead, so each batch cost time in proportion to the backlog
/// (18 ms per 10,000 keys at 50,000 pending, growing without bound).
pub(super) const RUNNING: &str = "
SELECT count(*) FROM json_each(?2) AS j CROSS JOIN drover_items AS i
WHERE i.process = ?1 AND i.key = j.value AND i.state = 'running'";

/// Validates the batch, then writes it in one write transaction.
pub(super) async fn enqueue(
    store: &SqliteStore,
    params: ItemEnqueue,
) -> Result<EnqueueReport, StoreError> {
    let mut tx = store.begin().await?;
    let report = coalesce(store, &mut tx, &params).await?;
    tx.commit().await.db()?;
    Ok(report)
}

/// Checks the batch and coalesces it into the items on `conn` (the store's
/// own transaction or a caller's): with [`UPSERT`], or with [`ENQUEUE`]
/// through the view when the store was asked to.
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
    if store.enqueue_through_view {
        sqlx::query(ENQUEUE)
            .bind(&params.process)
            .bind(params.priority)
            .bind(duration_ms(params.after))
            .bind(params.bypass_backoff)
            .bind(store.clock.offset_ms())
            .bind(&keys)
            .exec(&mut *conn)
            .await?;
    } else {
        sqlx::query(PROCESS)
            .bind(&params.process)
            .bind(store.clock.offset_ms())
            .exec(&mut *conn)
            .await?;
        sqlx::query(UPSERT)
            .bind(&params.process)
            .bind(params.priority)
            .bind(duration_ms(params.after))
            .bind(store.clock.offset_ms())
            .bind(&keys)
            .bind(params.bypass_backoff)
            .exec(&mut *conn)
            .await?;
    }
    if let Some(context) = &params.trace {
        super::trace::link(conn, &params.process, &keys, context).await?;
    }
    // A count of rows is never negative.
    let dirty = running.unsigned_abs();
    Ok(EnqueueReport {
        pending: count - dirty,
        dirty,
    })
}
