//! Read-side operations on SQLite: items, history, counts; and history pruning.

use std::time::Duration;

use super::engine::SqliteStore;
use super::error::Db as _;
use super::rows::{HistoryRow, ItemRow, duration_ms, item_columns};
use crate::store::StoreError;
use crate::store::decode::{backing_off, stored_state};
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{HistoryList, HistoryPrune, ItemGet, ItemList};
use crate::store::types::{HistoryEvent, Item, ItemDetail, ProcessCounts};

/// Fails with `UnknownProcess` unless the process was ever enqueued to or
/// configured.
async fn check_process(store: &SqliteStore, process: &str) -> Result<(), StoreError> {
    validate_process(process)?;
    let known: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM drover_processes WHERE process = ?1")
            .bind(process)
            .fetch_optional(&store.pool)
            .await
            .db()?;
    known
        .map(|_| ())
        .ok_or_else(|| StoreError::UnknownProcess(process.to_owned()))
}

/// Lists one process's items in key order. Running and parked keys are listed
/// through the partial index over non-pending rows (SQLite uses a partial
/// index only when the query states its condition literally); pending keys, the
/// bulk, through the `(process, key)` unique index.
pub(super) async fn item_list(
    store: &SqliteStore,
    params: ItemList,
) -> Result<Vec<Item>, StoreError> {
    check_process(store, &params.process).await?;
    let now = store.now_ms(&store.pool).await?;
    let after = params.after_key.as_deref().unwrap_or("");
    let query = match params.state {
        None => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = ?1 AND key > ?2 ORDER BY key LIMIT ?3"
        ))
        .bind(&params.process)
        .bind(after)
        .bind(params.limit),
        Some(state) if stored_state(state) != "pending" => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = ?1 AND state <> 'pending' AND state = ?4
                 AND key > ?2 ORDER BY key LIMIT ?3"
        ))
        .bind(&params.process)
        .bind(after)
        .bind(params.limit)
        .bind(stored_state(state)),
        Some(state) => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = ?1 AND state = ?4 AND key > ?2
                 AND (?5 IS NULL OR (COALESCE(backoff_until, 0) > ?6) = ?5)
             ORDER BY key LIMIT ?3"
        ))
        .bind(&params.process)
        .bind(after)
        .bind(params.limit)
        .bind(stored_state(state))
        .bind(backing_off(state))
        .bind(now),
    };
    let rows: Vec<ItemRow> = query.fetch_all(&store.pool).await.db()?;
    rows.into_iter().map(|r| r.into_item(now)).collect()
}

pub(super) async fn item_get(
    store: &SqliteStore,
    params: ItemGet,
) -> Result<Option<ItemDetail>, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let now = store.now_ms(&store.pool).await?;
    let row: Option<ItemRow> = sqlx::query_as(concat!(
        "SELECT ",
        item_columns!(),
        " FROM drover_items WHERE process = ?1 AND key = ?2"
    ))
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&store.pool)
    .await
    .db()?;
    let Some(row) = row else { return Ok(None) };
    let history = history_list(
        store,
        HistoryList {
            process: Some(params.process),
            key: Some(params.key),
            before_id: None,
            limit: params.history_limit,
        },
    )
    .await?;
    Ok(Some(ItemDetail {
        item: row.into_item(now)?,
        history,
    }))
}

pub(super) async fn history_list(
    store: &SqliteStore,
    params: HistoryList,
) -> Result<Vec<HistoryEvent>, StoreError> {
    if let Some(process) = &params.process {
        check_process(store, process).await?;
    }
    let rows: Vec<HistoryRow> = sqlx::query_as(
        "SELECT id, at, process, key, event, session, attempt, error, transient
         FROM drover_history
         WHERE (?1 IS NULL OR process = ?1) AND (?2 IS NULL OR key = ?2)
             AND (?3 IS NULL OR id < ?3)
         ORDER BY id DESC LIMIT ?4",
    )
    .bind(&params.process)
    .bind(&params.key)
    .bind(params.before_id)
    .bind(params.limit)
    .fetch_all(&store.pool)
    .await
    .db()?;
    rows.into_iter().map(HistoryRow::into_event).collect()
}

pub(super) async fn history_prune(
    store: &SqliteStore,
    params: HistoryPrune,
) -> Result<u64, StoreError> {
    let (mut tx, now) = store.write().await?;
    let deleted = sqlx::query("DELETE FROM drover_history WHERE at < ?1")
        .bind(now.saturating_sub(duration_ms(params.retention)))
        .execute(&mut *tx)
        .await
        .db()?
        .rows_affected();
    tx.commit().await.db()?;
    Ok(deleted)
}

pub(super) async fn process_counts(store: &SqliteStore) -> Result<Vec<ProcessCounts>, StoreError> {
    let now = store.now_ms(&store.pool).await?;
    let rows: Vec<(String, i64, i64, i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT p.process,
             COALESCE(SUM(i.state = 'pending' AND COALESCE(i.backoff_until, 0) <= ?1), 0),
             COALESCE(SUM(i.state = 'pending' AND COALESCE(i.backoff_until, 0) > ?1), 0),
             COALESCE(SUM(i.state = 'running'), 0),
             COALESCE(SUM(i.state = 'parked'), 0),
             MIN(CASE WHEN i.state = 'pending' AND i.ready_at <= ?1 THEN i.ready_at END)
         FROM drover_processes p LEFT JOIN drover_items i ON i.process = p.process
         GROUP BY p.process ORDER BY p.process",
    )
    .bind(now)
    .fetch_all(&store.pool)
    .await
    .db()?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(
            |(process, pending, backoff, running, parked, oldest)| ProcessCounts {
                process,
                pending: count(pending),
                backoff: count(backoff),
                running: count(running),
                parked: count(parked),
                oldest_pending_age: oldest
                    .map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0))),
            },
        )
        .collect())
}
