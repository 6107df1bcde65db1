//! Error groups and bulk actions on PostgreSQL: the count per stored
//! signature in one statement, and each batch of a bulk action in one transaction:
//! the window read `FOR UPDATE` (a claim racing the action either takes its
//! row first, and the row is then skipped as running, or waits for the
//! batch), then one statement that changes the chosen rows and writes their
//! history rows from what it changed.

use super::engine::PostgresStore;
use super::error::{Db as _, commit};
use super::inspect::check_process;
use super::retry::retry;
use super::tid::Tid;
use chrono::{DateTime, Utc};

use crate::store::StoreError;
use crate::store::params::ErrorGroups;
use crate::store::rules::groups::{
    Bulk, BulkSteps, CandidateRow, MAX_TEXTS, SignatureCount, merge, stored_states, window,
};
use crate::store::types::{ErrorGroup, RunOutcome};

/// The failing keys counted per stored signature: parked ones from the
/// parked-errors index in signature order, backing-off ones from the backoff
/// index (which carries the signature), both index-only; then the first row
/// (by id) of each of the `$3` largest groups, for its sample. `id` has no
/// index of its own (migration 0023), so the sample rows are found by one more
/// walk of each state's failing rows, keeping those whose id is a group's
/// first: the same indexes, the same O(failing keys) as the counts.
const SIGNATURES: &str = "
WITH g AS (
    SELECT COALESCE(error_signature, '') AS signature, 'parked' AS state,
        count(*) AS count, min(id) AS first
    FROM drover_items WHERE process = $1 AND state = 'parked' GROUP BY error_signature
    UNION ALL
    SELECT COALESCE(error_signature, ''), 'backoff', count(*), min(id)
    FROM drover_items WHERE process = $1 AND state = 'pending' AND backoff_until > $2
    GROUP BY error_signature
    ORDER BY count DESC, signature LIMIT $3),
sample AS (
    SELECT id, last_error FROM drover_items
    WHERE process = $1 AND state = 'parked'
        AND id = ANY(ARRAY(SELECT first FROM g WHERE state = 'parked'))
    UNION ALL
    SELECT id, last_error FROM drover_items
    WHERE process = $1 AND state = 'pending' AND backoff_until > $2
        AND id = ANY(ARRAY(SELECT first FROM g WHERE state = 'backoff')))
SELECT g.signature, g.state, g.count, COALESCE(s.last_error, '') AS sample
FROM g LEFT JOIN sample s ON s.id = g.first
ORDER BY g.count DESC, g.signature";

/// One window of a bulk action's walk: `$5` rows after `$2`, from the prefix
/// `$3` on, in the stored states `$4`, in key order, locked; each with its
/// `ctid`, by which the change after it finds it ([`Tid`]).
const WINDOW: &str = "
SELECT ctid::text AS id, key, error_signature, state, backoff_until FROM drover_items
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

/// An operator's retry of the rows `$2` (`ctid`s of rows [`WINDOW`] locked),
/// as `item_retry` does it for one.
const RETRY: &str = logged!(
    "UPDATE drover_items SET state = 'pending', backoff_until = NULL,
         ready_at = CASE WHEN state = 'pending' AND ready_at < $1 THEN ready_at ELSE $1 END,
         enqueued_at = CASE WHEN state IN ('parked', 'idle') THEN $1 ELSE enqueued_at END
     WHERE ctid = ANY(ARRAY(SELECT unnest($2::text[]::tid[]))) AND state <> 'running'"
);

/// An operator's park of the rows `$2` with the reason `$4` (whose signature
/// for each row's key is in the JSON object `$6`, by `ctid` as text).
const PARK: &str = logged!(
    "UPDATE drover_items SET state = 'parked', backoff_until = NULL, last_error = $4,
         error_signature = $6::jsonb ->> ctid::text
     WHERE ctid = ANY(ARRAY(SELECT unnest($2::text[]::tid[]))) AND state <> 'running'"
);

/// An operator's delete of the rows `$2`.
const DELETE: &str = logged!(
    "DELETE FROM drover_items
         WHERE ctid = ANY(ARRAY(SELECT unnest($2::text[]::tid[]))) AND state <> 'running'"
);

pub(super) async fn error_groups(
    store: &PostgresStore,
    params: &ErrorGroups,
) -> Result<Vec<ErrorGroup>, StoreError> {
    check_process(store, &params.process).await?;
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let rows: Vec<SignatureCount> = sqlx::query_as(SIGNATURES)
        .bind(&params.process)
        .bind(now)
        .bind(i64::from(MAX_TEXTS))
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
    let rows: Vec<CandidateRow<DateTime<Utc>, Tid>> = sqlx::query_as(WINDOW)
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
    let query = sqlx::query(change)
        .bind(now)
        .bind(&window.ids)
        .bind(bulk.outcome.as_str())
        .bind(bulk.reason.as_deref())
        .bind(&bulk.actor);
    let query = match bulk.outcome {
        RunOutcome::Parked => query.bind(&window.signatures),
        _ => query,
    };
    let changed = query.execute(&mut tx).await.db()?.rows_affected();
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
        retry(self, || batch(self, bulk, after)).await
    }
}
