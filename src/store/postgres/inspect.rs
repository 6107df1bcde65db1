//! Read-side operations on PostgreSQL: items and counts.

use std::time::Duration;

use super::engine::PostgresStore;
use super::error::Db as _;
use super::rows::{ItemRow, item_columns};
use super::runs;
use crate::store::StoreError;
use crate::store::decode::{backing_off, stored_state};
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{ItemGet, ItemList, RunList};
use crate::store::types::{Item, ItemDetail, ItemState, ProcessCounts};

/// Fails with `UnknownProcess` unless the process was ever enqueued to or
/// configured.
pub(super) async fn check_process(store: &PostgresStore, process: &str) -> Result<(), StoreError> {
    validate_process(process)?;
    let mut tx = store.read().await?;
    let known: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM drover_processes WHERE process = $1")
            .bind(process)
            .fetch_optional(&mut tx)
            .await
            .db()?;
    tx.commit().await.db()?;
    known
        .map(|_| ())
        .ok_or_else(|| StoreError::UnknownProcess(process.to_owned()))
}

/// Lists one process's items in key order. Running and parked keys are listed
/// through the partial index over those states (the literal `state IN
/// ('running', 'parked')` lets the planner prove it applies); pending and idle
/// keys, the bulk, through the `(process, key)` unique index.
pub(super) async fn item_list(
    store: &PostgresStore,
    params: &ItemList,
) -> Result<Vec<Item>, StoreError> {
    check_process(store, &params.process).await?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
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
        Some(state @ (ItemState::Running | ItemState::Parked)) => sqlx::query_as(concat!(
            "SELECT ",
            item_columns!(),
            " FROM drover_items WHERE process = $1 AND state IN ('running', 'parked')
                 AND state = $4 AND key > $2 ORDER BY key LIMIT $3"
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
    let rows: Vec<ItemRow> = query.fetch_all(&mut tx).await.db()?;
    tx.commit().await.db()?;
    rows.into_iter().map(|r| r.into_item(now)).collect()
}

pub(super) async fn item_get(
    store: &PostgresStore,
    params: &ItemGet,
) -> Result<Option<ItemDetail>, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let row: Option<ItemRow> = sqlx::query_as(concat!(
        "SELECT ",
        item_columns!(),
        " FROM drover_items WHERE process = $1 AND key = $2"
    ))
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&mut tx)
    .await
    .db()?;
    tx.commit().await.db()?;
    let Some(row) = row else { return Ok(None) };
    let runs = runs::list(
        store,
        &RunList {
            process: Some(params.process.clone()),
            key: Some(params.key.clone()),
            limit: params.runs_limit,
            ..RunList::default()
        },
    )
    .await?;
    Ok(Some(ItemDetail {
        item: row.into_item(now)?,
        runs,
    }))
}

/// Counts per process, each state through the partial index that holds it, so
/// idle keys (which may be most rows) are never read.
pub(super) async fn process_counts(
    store: &PostgresStore,
) -> Result<Vec<ProcessCounts>, StoreError> {
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let rows: Vec<(String, i64, i64, i64, i64, Option<f64>)> = sqlx::query_as(
        "SELECT p.process, COALESCE(q.ready, 0), COALESCE(q.backoff, 0),
             COALESCE(s.running, 0), COALESCE(s.parked, 0),
             EXTRACT(EPOCH FROM $1 - q.oldest)::float8
         FROM drover_processes p
         LEFT JOIN (
             SELECT process,
                 count(*) FILTER (WHERE backoff_until IS NULL OR backoff_until <= $1) AS ready,
                 count(*) FILTER (WHERE backoff_until > $1) AS backoff,
                 min(ready_at) FILTER (WHERE ready_at <= $1) AS oldest
             FROM drover_items WHERE state = 'pending' GROUP BY process) q
             ON q.process = p.process
         LEFT JOIN (
             SELECT process, count(*) FILTER (WHERE state = 'running') AS running,
                 count(*) FILTER (WHERE state = 'parked') AS parked
             FROM drover_items WHERE state IN ('running', 'parked') GROUP BY process) s
             ON s.process = p.process
         ORDER BY p.process",
    )
    .bind(now)
    .fetch_all(&mut tx)
    .await
    .db()?;
    tx.commit().await.db()?;
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
