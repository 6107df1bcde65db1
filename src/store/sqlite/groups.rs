//! Error groups and bulk actions on SQLite: the grouping by key-free error
//! text in one `GROUP BY`, and each batch of a bulk action in one `BEGIN
//! IMMEDIATE` transaction (the window read, then the history rows and the
//! change, one statement each for the whole batch).

use super::engine::SqliteStore;
use super::error::Db as _;
use super::inspect::check_process;
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
    SELECT replace(COALESCE(last_error, ''), key, ?4) AS text, 'parked' AS state,
        COALESCE(last_error, '') AS error
    FROM drover_items WHERE process = ?1 AND state IN ('running', 'parked') AND state = 'parked'
    UNION ALL
    SELECT replace(COALESCE(last_error, ''), key, ?4), 'backoff', COALESCE(last_error, '')
    FROM drover_items WHERE process = ?1 AND state = 'pending' AND backoff_until > ?2)
GROUP BY text, state ORDER BY count(*) DESC, text LIMIT ?3";

/// One window of a bulk action's walk: `?5` rows after `?2`, from the prefix
/// `?3` on, in the stored states `?4` (a JSON array), in key order.
const WINDOW: &str = "
SELECT id, key, last_error, state, backoff_until FROM drover_items
WHERE process = ?1 AND key > ?2 AND key >= ?3 AND state IN (SELECT value FROM json_each(?4))
ORDER BY key LIMIT ?5";

/// The history rows of the chosen rows `?5` (a JSON array of ids).
const LOG: &str = "
INSERT INTO drover_runs (process, key, outcome, ended_at, error, actor)
SELECT process, key, ?2, ?1, ?3, ?4 FROM drover_items
WHERE id IN (SELECT value FROM json_each(?5)) AND state <> 'running' ORDER BY key";

/// An operator's retry of the rows `?2`, as `item_retry` does it for one.
const RETRY: &str = "
UPDATE drover_items SET state = 'pending', backoff_until = NULL,
    ready_at = CASE WHEN state = 'pending' AND ready_at < ?1 THEN ready_at ELSE ?1 END,
    enqueued_at = CASE WHEN state IN ('parked', 'idle') THEN ?1 ELSE enqueued_at END
WHERE id IN (SELECT value FROM json_each(?2)) AND state <> 'running'";

/// An operator's park of the rows `?2` with the reason `?1`.
const PARK: &str = "
UPDATE drover_items SET state = 'parked', backoff_until = NULL, last_error = ?1
WHERE id IN (SELECT value FROM json_each(?2)) AND state <> 'running'";

/// An operator's delete of the rows `?1`.
const DELETE: &str = "
DELETE FROM drover_items WHERE id IN (SELECT value FROM json_each(?1)) AND state <> 'running'";

pub(super) async fn error_groups(
    store: &SqliteStore,
    params: ErrorGroups,
) -> Result<Vec<ErrorGroup>, StoreError> {
    check_process(store, &params.process).await?;
    let now = store.now_ms(&store.pool).await?;
    let rows: Vec<TextCount> = sqlx::query_as(TEXTS)
        .bind(&params.process)
        .bind(now)
        .bind(MAX_TEXTS)
        .bind(KEY_MARK)
        .fetch_all(&store.pool)
        .await
        .db()?;
    Ok(merge(rows, params.limit))
}

impl BulkSteps for SqliteStore {
    async fn known(&self, process: &str) -> Result<(), StoreError> {
        check_process(self, process).await
    }

    async fn bulk_batch(
        &self,
        bulk: &Bulk,
        after: Option<&str>,
    ) -> Result<(u64, Option<String>), StoreError> {
        let filter = &bulk.filter;
        let states = serde_json::to_string(&stored_states(filter))
            .expect("a list of strings always serializes");
        let (mut tx, now) = self.write().await?;
        let rows: Vec<CandidateRow<i64>> = sqlx::query_as(WINDOW)
            .bind(&filter.process)
            .bind(after.unwrap_or(""))
            .bind(filter.key_prefix.as_deref().unwrap_or(""))
            .bind(states)
            .bind(bulk.batch)
            .fetch_all(&mut *tx)
            .await
            .db()?;
        let window = window(bulk, &rows, now);
        if window.ids.is_empty() {
            return Ok((0, window.next));
        }
        let ids = serde_json::to_string(&window.ids).expect("a list of ids always serializes");
        sqlx::query(LOG)
            .bind(now)
            .bind(bulk.outcome.as_str())
            .bind(bulk.reason.as_deref())
            .bind(&bulk.actor)
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .db()?;
        let change = match bulk.outcome {
            RunOutcome::Retried => sqlx::query(RETRY).bind(now).bind(&ids),
            RunOutcome::Parked => sqlx::query(PARK).bind(bulk.reason.as_deref()).bind(&ids),
            _ => sqlx::query(DELETE).bind(&ids),
        };
        let changed = change.execute(&mut *tx).await.db()?.rows_affected();
        tx.commit().await.db()?;
        Ok((changed, window.next))
    }
}
