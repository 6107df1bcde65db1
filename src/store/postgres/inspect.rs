//! Read-side operations on PostgreSQL: items, history, counts; and history
//! pruning.

use std::time::Duration;

use super::engine::PostgresStore;
use super::error::Db as _;
use super::rows::{HistoryRow, ItemRow, item_columns};
use crate::store::StoreError;
use crate::store::decode::{backing_off, stored_state};
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{HistoryList, HistoryPrune, ItemGet, ItemList};
use crate::store::settle::earlier;
use crate::store::types::{HistoryEvent, Item, ItemDetail, ProcessCounts};

/// Fails with `UnknownProcess` unless the process was ever enqueued to or
/// configured.
async fn check_process(store: &PostgresStore, process: &str) -> Result<(), StoreError> {
    validate_process(process)?;
    let known: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM drover_processes WHERE process = $1")
            .bind(process)
            .fetch_optional(&store.pool)
            .await
            .db()?;
    known
        .map(|_| ())
        .ok_or_else(|| StoreError::UnknownProcess(process.to_owned()))
}

/// Lists one process's items in key order. Running and parked keys are listed
/// through the partial index over non-pending rows (the literal `state <>
/// 'pending'` lets the planner prove it applies); pending keys, the bulk,
/// through the `(process, key)` unique index.
pub(super) async fn item_list(
    store: &PostgresStore,
    params: &ItemList,
) -> Result<Vec<Item>, StoreError> {
    check_process(store, &params.process).await?;
    let now = store.now(&store.pool).await?;
    let after = params.after_key.as_deref().unwrap_or("");
    let limit = i64::from(params.limit);
    let query = match params.state {
        None => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = $1 AND key > $2 ORDER BY key LIMIT $3"
        ))
        .bind(&params.process)
        .bind(after)
        .bind(limit),
        Some(state) if stored_state(state) != "pending" => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = $1 AND state <> 'pending' AND state = $4
                 AND key > $2 ORDER BY key LIMIT $3"
        ))
        .bind(&params.process)
        .bind(after)
        .bind(limit)
        .bind(stored_state(state)),
        Some(state) => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = $1 AND state = $4 AND key > $2
                 AND ($5::boolean IS NULL OR (backoff_until IS NOT NULL AND backoff_until > $6) = $5)
             ORDER BY key LIMIT $3"
        ))
        .bind(&params.process)
        .bind(after)
        .bind(limit)
        .bind(stored_state(state))
        .bind(backing_off(state))
        .bind(now),
    };
    let rows: Vec<ItemRow> = query.fetch_all(&store.pool).await.db()?;
    rows.into_iter().map(|r| r.into_item(now)).collect()
}

pub(super) async fn item_get(
    store: &PostgresStore,
    params: &ItemGet,
) -> Result<Option<ItemDetail>, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let now = store.now(&store.pool).await?;
    let row: Option<ItemRow> = sqlx::query_as(concat!(
        "SELECT ",
        item_columns!(),
        " FROM drover_items WHERE process = $1 AND key = $2"
    ))
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&store.pool)
    .await
    .db()?;
    let Some(row) = row else { return Ok(None) };
    let history = history_list(
        store,
        &HistoryList {
            process: Some(params.process.clone()),
            key: Some(params.key.clone()),
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
    store: &PostgresStore,
    params: &HistoryList,
) -> Result<Vec<HistoryEvent>, StoreError> {
    if let Some(process) = &params.process {
        check_process(store, process).await?;
    }
    let rows: Vec<HistoryRow> = sqlx::query_as(
        "SELECT id, at, process, key, event, session, attempt, error, transient
         FROM drover_history
         WHERE ($1::text IS NULL OR process = $1) AND ($2::text IS NULL OR key = $2)
             AND ($3::bigint IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4",
    )
    .bind(&params.process)
    .bind(&params.key)
    .bind(params.before_id)
    .bind(i64::from(params.limit))
    .fetch_all(&store.pool)
    .await
    .db()?;
    rows.into_iter().map(HistoryRow::into_event).collect()
}

pub(super) async fn history_prune(
    store: &PostgresStore,
    params: HistoryPrune,
) -> Result<u64, StoreError> {
    let now = store.now(&store.pool).await?;
    let horizon = earlier(now, params.retention);
    let deleted = sqlx::query("DELETE FROM drover_history WHERE at < $1")
        .bind(horizon)
        .execute(&store.pool)
        .await
        .db()?
        .rows_affected();
    Ok(deleted)
}

pub(super) async fn process_counts(
    store: &PostgresStore,
) -> Result<Vec<ProcessCounts>, StoreError> {
    let now = store.now(&store.pool).await?;
    let rows: Vec<(String, i64, i64, i64, i64, Option<f64>)> = sqlx::query_as(
        "SELECT p.process,
             count(*) FILTER (WHERE i.state = 'pending'
                 AND (i.backoff_until IS NULL OR i.backoff_until <= $1)),
             count(*) FILTER (WHERE i.state = 'pending' AND i.backoff_until > $1),
             count(*) FILTER (WHERE i.state = 'running'),
             count(*) FILTER (WHERE i.state = 'parked'),
             EXTRACT(EPOCH FROM $1 - min(i.ready_at) FILTER (
                 WHERE i.state = 'pending' AND i.ready_at <= $1))::float8
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
            |(process, pending, backoff, running, parked, age)| ProcessCounts {
                process,
                pending: count(pending),
                backoff: count(backoff),
                running: count(running),
                parked: count(parked),
                oldest_pending_age: age.map(|s| Duration::from_secs_f64(s.max(0.0))),
            },
        )
        .collect())
}
