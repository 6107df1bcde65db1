//! Error groups and bulk actions on PostgreSQL: the grouping by key-free error
//! text in one `GROUP BY`, and each batch of a bulk action in one transaction:
//! the window read `FOR UPDATE` (a claim racing the action either takes its
//! row first, and the row is then skipped as running, or waits for the
//! batch), then one statement that changes the chosen rows and writes their
//! history rows from what it changed.

use super::engine::PostgresStore;
use super::error::{Db as _, commit};
use super::inspect::check_process;
use super::retry::retry;
use chrono::{DateTime, Utc};

use crate::store::StoreError;
use crate::store::groups::{
    Bulk, BulkSteps, CandidateRow, KEY_MARK, MAX_TEXTS, TextCount, merge, stored_states, window,
};
use crate::store::params::ErrorGroups;
use crate::store::types::{ErrorGroup, RunOutcome};

/// The failing keys grouped by their error with the key replaced: parked ones
/// through the partial index over running and parked rows, backing-off ones
/// among the pending rows.
const TEXTS: &str = "
SELECT text, state, count(*) AS count, min(error) AS sample FROM (
    SELECT replace(COALESCE(last_error, ''), key, $4) AS text, 'parked' AS state,
        COALESCE(last_error, '') AS error
    FROM drover_items WHERE process = $1 AND state IN ('running', 'parked') AND state = 'parked'
    UNION ALL
    SELECT replace(COALESCE(last_error, ''), key, $4), 'backoff', COALESCE(last_error, '')
    FROM drover_items WHERE process = $1 AND state = 'pending' AND backoff_until > $2) t
GROUP BY text, state ORDER BY count(*) DESC, text LIMIT $3";

/// One window of a bulk action's walk: `$5` rows after `$2`, from the prefix
/// `$3` on, in the stored states `$4`, in key order, locked.
const WINDOW: &str = "
SELECT id, key, last_error, state, backoff_until FROM drover_items
WHERE process = $1 AND key > $2 AND key >= $3 AND state = ANY($4::text[])
ORDER BY key LIMIT $5 FOR UPDATE";

/// Writes the history rows of what the statement before it changed: `$1` now,
/// `$3` the outcome, `$4` the error (a park's reason), `$5` the actor.
macro_rules! logged {
    ($change:literal) => {
        concat!(
            "WITH changed AS (",
            $change,
            " RETURNING process, key)
             INSERT INTO drover_runs (process, key, outcome, ended_at, error, actor)
             SELECT process, key, $3, $1, $4, $5 FROM changed ORDER BY key"
        )
    };
}

/// An operator's retry of the rows `$2`, as `item_retry` does it for one.
const RETRY: &str = logged!(
    "UPDATE drover_items SET state = 'pending', backoff_until = NULL,
         ready_at = CASE WHEN state = 'pending' AND ready_at < $1 THEN ready_at ELSE $1 END,
         enqueued_at = CASE WHEN state IN ('parked', 'idle') THEN $1 ELSE enqueued_at END
     WHERE id = ANY($2) AND state <> 'running'"
);

/// An operator's park of the rows `$2` with the reason `$4`.
const PARK: &str = logged!(
    "UPDATE drover_items SET state = 'parked', backoff_until = NULL, last_error = $4
     WHERE id = ANY($2) AND state <> 'running'"
);

/// An operator's delete of the rows `$2`.
const DELETE: &str = logged!("DELETE FROM drover_items WHERE id = ANY($2) AND state <> 'running'");

pub(super) async fn error_groups(
    store: &PostgresStore,
    params: &ErrorGroups,
) -> Result<Vec<ErrorGroup>, StoreError> {
    check_process(store, &params.process).await?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let rows: Vec<TextCount> = sqlx::query_as(TEXTS)
        .bind(&params.process)
        .bind(now)
        .bind(i64::from(MAX_TEXTS))
        .bind(KEY_MARK)
        .fetch_all(&mut tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    Ok(merge(rows, params.limit))
}

/// One batch, in one transaction (see [`BulkSteps::bulk_batch`]).
async fn batch(
    store: &PostgresStore,
    bulk: &Bulk,
    after: Option<&str>,
) -> Result<(u64, Option<String>), StoreError> {
    let filter = &bulk.filter;
    let (mut tx, _) = store.write().await?;
    let rows: Vec<CandidateRow<DateTime<Utc>>> = sqlx::query_as(WINDOW)
        .bind(&filter.process)
        .bind(after.unwrap_or(""))
        .bind(filter.key_prefix.as_deref().unwrap_or(""))
        .bind(stored_states(filter))
        .bind(i64::from(bulk.batch))
        .fetch_all(&mut tx)
        .await
        .db()?;
    let now = store.now(&mut tx).await?; // after the row locks' wait
    let window = window(bulk, &rows, now);
    if window.ids.is_empty() {
        return Ok((0, window.next));
    }
    let change = match bulk.outcome {
        RunOutcome::Retried => RETRY,
        RunOutcome::Parked => PARK,
        _ => DELETE,
    };
    let changed = sqlx::query(change)
        .bind(now)
        .bind(&window.ids)
        .bind(bulk.outcome.as_str())
        .bind(bulk.reason.as_deref())
        .bind(&bulk.actor)
        .execute(&mut tx)
        .await
        .db()?
        .rows_affected();
    if changed > 0 && bulk.outcome == RunOutcome::Retried {
        PostgresStore::notify_ready(&mut tx, &filter.process).await?;
    }
    commit(tx).await?;
    Ok((changed, window.next))
}

impl BulkSteps for PostgresStore {
    async fn known(&self, process: &str) -> Result<(), StoreError> {
        check_process(self, process).await
    }

    async fn bulk_batch(
        &self,
        bulk: &Bulk,
        after: Option<&str>,
    ) -> Result<(u64, Option<String>), StoreError> {
        retry(|| batch(self, bulk, after)).await
    }
}
