//! Operator actions on SQLite (retry, park, delete) and the recent-activity
//! counts, each write in one `BEGIN IMMEDIATE` transaction.

use crate::store::exec::Exec as _;
use sqlx::SqliteConnection;

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::rows::{ItemRow, duration_ms, item_columns};
use super::runs::log_action;
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{HistoryActivity, ItemDelete, ItemPark, ItemRetry};
use crate::store::rules::activity::{ActivityRow, activity_page};
use crate::store::rules::admin::admit;
use crate::store::rules::pages;
use crate::store::text::clean_text;
use crate::store::types::{Item, Page, ProcessActivity, RunOutcome};
use crate::store::{StoreError, error_signature};

/// Validates the names, opens the write transaction and applies [`admit`];
/// `None` when there is no item to act on.
async fn begin(
    store: &SqliteStore,
    process: &str,
    key: &str,
) -> Result<Option<(Tx, i64)>, StoreError> {
    validate_process(process)?;
    validate_key(key)?;
    let (mut tx, now) = store.write().await?;
    Ok(admitted(&mut tx, process, key).await?.then_some((tx, now)))
}

/// Applies [`admit`] to the item's stored state, read on `conn`.
async fn admitted(
    conn: &mut SqliteConnection,
    process: &str,
    key: &str,
) -> Result<bool, StoreError> {
    let stored: Option<String> =
        sqlx::query_scalar("SELECT state FROM drover_items WHERE process = ?1 AND key = ?2")
            .bind(process)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .db()?;
    admit(process, key, stored.as_deref())
}

pub(super) async fn retry(
    store: &SqliteStore,
    params: ItemRetry,
) -> Result<Option<Item>, StoreError> {
    let Some((mut tx, now)) = begin(store, &params.process, &params.key).await? else {
        return Ok(None);
    };
    let row: ItemRow = sqlx::query_as(concat!(
        "UPDATE drover_items SET state = 'pending', backoff_until = NULL,
             ready_at = CASE WHEN state = 'pending' AND ready_at < ?3 THEN ready_at ELSE ?3 END,
             enqueued_at = CASE WHEN state IN ('parked', 'idle') THEN ?3 ELSE enqueued_at END
         WHERE process = ?1 AND key = ?2 RETURNING ",
        item_columns!()
    ))
    .bind(&params.process)
    .bind(&params.key)
    .bind(now)
    .fetch_one(&mut *tx)
    .await
    .db()?;
    let names = (params.process.as_str(), params.key.as_str());
    let action = (RunOutcome::Retried, params.actor.as_str());
    log_action(&mut tx, now, names, action, None).await?;
    tx.commit().await.db()?;
    row.into_item(now).map(Some)
}

pub(super) async fn park(
    store: &SqliteStore,
    params: ItemPark,
) -> Result<Option<Item>, StoreError> {
    let Some((mut tx, now)) = begin(store, &params.process, &params.key).await? else {
        return Ok(None);
    };
    let reason = clean_text(&params.reason);
    let row: ItemRow = sqlx::query_as(concat!(
        "UPDATE drover_items SET state = 'parked', backoff_until = NULL, last_error = ?3,
             error_signature = ?4
         WHERE process = ?1 AND key = ?2 RETURNING ",
        item_columns!()
    ))
    .bind(&params.process)
    .bind(&params.key)
    .bind(&reason)
    .bind(error_signature(&params.key, &reason))
    .fetch_one(&mut *tx)
    .await
    .db()?;
    let names = (params.process.as_str(), params.key.as_str());
    let action = (RunOutcome::Parked, params.actor.as_str());
    log_action(&mut tx, now, names, action, Some(&reason)).await?;
    tx.commit().await.db()?;
    row.into_item(now).map(Some)
}

pub(super) async fn delete(store: &SqliteStore, params: ItemDelete) -> Result<bool, StoreError> {
    let Some((mut tx, now)) = begin(store, &params.process, &params.key).await? else {
        return Ok(false);
    };
    forget(&mut tx, now, &params).await?;
    tx.commit().await.db()?;
    Ok(true)
}

/// [`delete`] on a connection of the caller's transaction (a write
/// transaction: `BEGIN IMMEDIATE`).
pub(super) async fn delete_in(
    store: &SqliteStore,
    conn: &mut SqliteConnection,
    params: &ItemDelete,
) -> Result<bool, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    if !admitted(conn, &params.process, &params.key).await? {
        return Ok(false);
    }
    let now = store.now_ms(&mut *conn).await?;
    forget(conn, now, params).await?;
    Ok(true)
}

/// Deletes the admitted item and records the action.
async fn forget(
    conn: &mut SqliteConnection,
    now: i64,
    params: &ItemDelete,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM drover_items WHERE process = ?1 AND key = ?2")
        .bind(&params.process)
        .bind(&params.key)
        .exec(&mut *conn)
        .await?;
    let names = (params.process.as_str(), params.key.as_str());
    let action = (RunOutcome::Deleted, params.actor.as_str());
    log_action(conn, now, names, action, None).await
}

/// Runs ended since `?1` (not operator actions), converged and failed, per
/// process of one page: those named after `?2`, at most `?3` (a range of the
/// process key, then each process's runs since `?1`).
pub(super) const ACTIVITY: &str = "
SELECT p.process, COALESCE(SUM(r.outcome IN ('done', 'requeued')), 0),
    COALESCE(SUM(r.outcome IN ('retry', 'parked')), 0)
FROM (SELECT process FROM drover_processes WHERE process > ?2 ORDER BY process LIMIT ?3) p
LEFT JOIN drover_runs r ON +r.process = p.process AND r.ended_at >= ?1 AND r.actor IS NULL
GROUP BY p.process ORDER BY p.process";

/// Recent runs per process, one page of processes.
pub(super) async fn activity(
    store: &SqliteStore,
    params: HistoryActivity,
) -> Result<Page<ProcessActivity>, StoreError> {
    let now = store.now_ms(&store.pool).await?;
    let rows: Vec<ActivityRow> = sqlx::query_as(ACTIVITY)
        .bind(now.saturating_sub(duration_ms(params.window)))
        .bind(params.page.after.unwrap_or_default())
        .bind(pages::read_limit(params.page.limit))
        .fetch_all(&store.pool)
        .await
        .db()?;
    Ok(activity_page(rows, params.page.limit))
}
