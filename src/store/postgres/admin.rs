//! Operator actions on PostgreSQL (retry, park, delete) and the recent-activity
//! counts. The item row is locked (`FOR UPDATE`) before the check, so a claim
//! racing the action either sees its result or happens first and is refused.

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};
use sqlx::{Executor, Postgres};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::rows::{ItemRow, item_columns};
use super::runs::log_action;
use super::tx::Passed;
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{HistoryActivity, ItemDelete, ItemPark, ItemRetry};
use crate::store::rules::activity::{ActivityRow, activity_page};
use crate::store::rules::admin::admit;
use crate::store::rules::pages;
use crate::store::rules::settle::earlier;
use crate::store::text::clean_text;
use crate::store::types::{Item, Page, ProcessActivity, RunOutcome};
use crate::store::{StoreError, error_signature};

/// Validates the names, opens the transaction, locks the row and applies
/// [`admit`]; `None` when there is no item to act on.
async fn begin(
    store: &PostgresStore,
    process: &str,
    key: &str,
) -> Result<Option<(Tx, DateTime<Utc>)>, StoreError> {
    validate_process(process)?;
    validate_key(key)?;
    let (mut tx, _) = store.write().await?;
    Ok(lock_item(store, &mut tx, process, key)
        .await?
        .map(|now| (tx, now)))
}

/// Locks the item's row (`FOR UPDATE`) on `conn` and applies [`admit`]; the
/// clock, read after the lock's wait, or `None` when there is no item.
async fn lock_item<C>(
    store: &PostgresStore,
    conn: &mut C,
    process: &str,
    key: &str,
) -> Result<Option<DateTime<Utc>>, StoreError>
where
    C: ?Sized + Send,
    for<'c> &'c mut C: Executor<'c, Database = Postgres>,
{
    let stored: Option<String> = sqlx::query_scalar(
        "SELECT state FROM drover_items WHERE process = $1 AND key = $2 FOR UPDATE",
    )
    .bind(process)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await
    .db()?;
    let now = store.now(&mut *conn).await?; // after the row lock's wait
    Ok(admit(process, key, stored.as_deref())?.then_some(now))
}

pub(super) async fn retry(
    store: &PostgresStore,
    params: &ItemRetry,
) -> Result<Option<Item>, StoreError> {
    let Some((mut tx, now)) = begin(store, &params.process, &params.key).await? else {
        return Ok(None);
    };
    let row: ItemRow = sqlx::query_as(concat!(
        "UPDATE drover_items SET state = 'pending', backoff_until = NULL,
             ready_at = CASE WHEN state = 'pending' AND ready_at < $3 THEN ready_at ELSE $3 END,
             enqueued_at = CASE WHEN state IN ('parked', 'idle') THEN $3 ELSE enqueued_at END
         WHERE process = $1 AND key = $2 RETURNING ",
        item_columns!()
    ))
    .bind(&params.process)
    .bind(&params.key)
    .bind(now)
    .fetch_one(&mut tx)
    .await
    .db()?;
    let names = (params.process.as_str(), params.key.as_str());
    let action = (RunOutcome::Retried, params.actor.as_str());
    log_action(&mut tx, now, names, action, None).await?;
    PostgresStore::notify_ready(&mut tx, &params.process).await?;
    commit(tx).await?;
    row.into_item(now).map(Some)
}

pub(super) async fn park(
    store: &PostgresStore,
    params: &ItemPark,
) -> Result<Option<Item>, StoreError> {
    let Some((mut tx, now)) = begin(store, &params.process, &params.key).await? else {
        return Ok(None);
    };
    let reason = clean_text(&params.reason);
    let row: ItemRow = sqlx::query_as(concat!(
        "UPDATE drover_items SET state = 'parked', backoff_until = NULL, last_error = $3,
             error_signature = $4
         WHERE process = $1 AND key = $2 RETURNING ",
        item_columns!()
    ))
    .bind(&params.process)
    .bind(&params.key)
    .bind(&reason)
    .bind(error_signature(&params.key, &reason))
    .fetch_one(&mut tx)
    .await
    .db()?;
    let names = (params.process.as_str(), params.key.as_str());
    let action = (RunOutcome::Parked, params.actor.as_str());
    log_action(&mut tx, now, names, action, Some(&reason)).await?;
    commit(tx).await?;
    row.into_item(now).map(Some)
}

pub(super) async fn delete(store: &PostgresStore, params: &ItemDelete) -> Result<bool, StoreError> {
    let Some((mut tx, now)) = begin(store, &params.process, &params.key).await? else {
        return Ok(false);
    };
    forget(&mut tx, now, params).await?;
    commit(tx).await?;
    Ok(true)
}

/// [`delete`] on a connection of the caller's transaction.
///
/// The row is locked inside a savepoint, rolled back when the delete is
/// refused (a running key): a refused delete leaves no lock behind in a
/// transaction the caller goes on with. Before, the running key's row stayed
/// locked until the caller's transaction ended, and its worker's completion,
/// with every outcome batched behind it, waited that long.
pub(super) async fn delete_in(
    store: &PostgresStore,
    conn: &mut Passed<'_>,
    params: &ItemDelete,
) -> Result<bool, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    if let Err(e) = sqlx::query("SAVEPOINT drover_item_delete")
        .exec(&mut *conn)
        .await
    {
        return Err(outside_a_transaction(e));
    }
    let now = match lock_item(store, conn, &params.process, &params.key).await {
        Ok(Some(now)) => now,
        refused => {
            // `ROLLBACK TO` keeps the savepoint: released too, or each refusal
            // would nest the caller's transaction one subtransaction deeper.
            for undo in [
                "ROLLBACK TO SAVEPOINT drover_item_delete",
                "RELEASE SAVEPOINT drover_item_delete",
            ] {
                sqlx::query(undo).exec(&mut *conn).await?;
            }
            return refused.map(|_| false);
        }
    };
    sqlx::query("RELEASE SAVEPOINT drover_item_delete")
        .exec(&mut *conn)
        .await?;
    forget(conn, now, params).await?;
    Ok(true)
}

/// The error of a `SAVEPOINT` sent on a connection with no transaction open
/// (SQLSTATE 25P01), in words: [`delete_in`] needs its caller's transaction.
fn outside_a_transaction(e: StoreError) -> StoreError {
    if e.database_code().as_deref() == Some("25P01") {
        return StoreError::InvalidArgument(
            "a delete in a transaction needs a connection inside one: send BEGIN first".into(),
        );
    }
    e
}

/// Deletes the admitted item and records the action.
async fn forget<C>(conn: &mut C, now: DateTime<Utc>, params: &ItemDelete) -> Result<(), StoreError>
where
    C: ?Sized + Send,
    for<'c> &'c mut C: Executor<'c, Database = Postgres>,
{
    sqlx::query("DELETE FROM drover_items WHERE process = $1 AND key = $2")
        .bind(&params.process)
        .bind(&params.key)
        .exec(&mut *conn)
        .await?;
    let names = (params.process.as_str(), params.key.as_str());
    let action = (RunOutcome::Deleted, params.actor.as_str());
    log_action(conn, now, names, action, None).await
}

/// Runs ended since `$1` (not operator actions), converged and failed, per
/// process of one page: those named after `$2`, at most `$3` (a range of the
/// process key, then each process's runs since `$1`).
const ACTIVITY: &str = "
SELECT p.process, COUNT(r.id) FILTER (WHERE r.outcome IN ('done', 'requeued')),
    COUNT(r.id) FILTER (WHERE r.outcome IN ('retry', 'parked'))
FROM (SELECT process FROM drover_processes WHERE process > $2 ORDER BY process LIMIT $3) p
LEFT JOIN drover_runs r ON r.process = p.process AND r.ended_at >= $1 AND r.actor IS NULL
GROUP BY p.process ORDER BY p.process";

/// Recent runs per process, one page of processes.
pub(super) async fn activity(
    store: &PostgresStore,
    params: HistoryActivity,
) -> Result<Page<ProcessActivity>, StoreError> {
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let rows: Vec<ActivityRow> = sqlx::query_as(ACTIVITY)
        .bind(earlier(now, params.window))
        .bind(params.page.after.unwrap_or_default())
        .bind(pages::read_limit(params.page.limit))
        .fetch_all(&mut tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    Ok(activity_page(rows, params.page.limit))
}
