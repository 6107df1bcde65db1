//! Error groups and bulk actions on SQLite: the count per stored signature
//! in one statement, and each batch of a bulk action in one `BEGIN
//! IMMEDIATE` transaction (the window read, then the history rows and the
//! change, one statement each for the whole batch).

use super::engine::SqliteStore;
use super::error::Db as _;
use super::inspect::check_process;
use crate::store::StoreError;
use crate::store::exec::Exec as _;
use crate::store::params::ErrorGroups;
use crate::store::rules::groups::{
    Bulk, BulkSteps, CandidateRow, MAX_TEXTS, SignatureCount, merge, stored_states, window,
};
use crate::store::types::{ErrorGroup, RunOutcome};

/// The failing keys counted per stored signature: parked ones walking the
/// parked-errors index in signature order, backing-off ones from the backoff
/// index (which carries the signature), neither reading the rows; then the
/// first row (by id) of each of the `?3` largest groups, for its sample.
pub(super) const SIGNATURES: &str = "
SELECT g.signature, g.state, g.count, COALESCE(i.last_error, '') AS sample FROM (
    SELECT signature, state, count, first FROM (
        SELECT COALESCE(error_signature, '') AS signature, 'parked' AS state,
            count(*) AS count, min(id) AS first
        FROM drover_items INDEXED BY drover_items_parked_errors
        WHERE process = ?1 AND state = 'parked' GROUP BY error_signature
        UNION ALL
        SELECT COALESCE(error_signature, ''), 'backoff', count(*), min(id)
        FROM drover_items INDEXED BY drover_items_backoff
        WHERE process = ?1 AND state = 'pending' AND backoff_until > ?2
        GROUP BY error_signature)
    ORDER BY count DESC, signature LIMIT ?3) g
LEFT JOIN drover_items i ON i.id = g.first";

/// One window of a bulk action's walk: `?5` rows after the key whose bytes
/// are the hex `?2`, from the prefix `?3` on, in the stored states `?4` (a
/// JSON array), in key order; each row with its key's bytes in hex, where the
/// next window starts.
///
/// The walk goes on from the exact bytes of the last key, not from the key as
/// read: a key SQL wrote as text that is not UTF-8 is read with U+FFFD in
/// place of its bad bytes ([`Lossy`](crate::store::rules::rows::Lossy)), which sorts
/// before them, so a walk going on from that would read the same key again,
/// forever if the action leaves it in the window.
///
/// `backoff_until` is read as SQLite reads a value as an integer: SQL
/// straight into `drover_items` checks no types, and one fraction there
/// failed every batch that met the row with a `ColumnDecode` error.
pub(super) const WINDOW: &str = "
SELECT id, key, error_signature, state, CAST(backoff_until AS INTEGER) AS backoff_until,
    hex(key) AS cursor FROM drover_items
WHERE process = ?1 AND key > CAST(unhex(?2) AS TEXT) AND key >= ?3
    AND state IN (SELECT value FROM json_each(?4))
ORDER BY key LIMIT ?5";

/// A row of [`WINDOW`].
#[derive(sqlx::FromRow)]
struct Candidate {
    #[sqlx(flatten)]
    row: CandidateRow<i64>,
    /// The key's bytes in hex.
    cursor: String,
}

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

/// An operator's park of the rows `?2` with the reason `?1` (whose
/// signature for each row's key is in the JSON object `?3`, by id).
const PARK: &str = "
UPDATE drover_items SET state = 'parked', backoff_until = NULL, last_error = ?1,
    error_signature = json_extract(?3, '$.\"' || id || '\"')
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
    let rows: Vec<SignatureCount> = sqlx::query_as(SIGNATURES)
        .bind(&params.process)
        .bind(now)
        .bind(MAX_TEXTS)
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
        let candidates: Vec<Candidate> = sqlx::query_as(WINDOW)
            .bind(&filter.process)
            .bind(after.unwrap_or(""))
            .bind(filter.key_prefix.as_deref().unwrap_or(""))
            .bind(states)
            .bind(bulk.batch)
            .fetch_all(&mut *tx)
            .await
            .db()?;
        let (rows, mut cursors): (Vec<_>, Vec<_>) =
            candidates.into_iter().map(|c| (c.row, c.cursor)).unzip();
        let window = window(bulk, &rows, now);
        let next = window.next.and(cursors.pop());
        if window.ids.is_empty() {
            return Ok((0, next));
        }
        let ids = serde_json::to_string(&window.ids).expect("a list of ids always serializes");
        sqlx::query(LOG)
            .bind(now)
            .bind(bulk.outcome.as_str())
            .bind(bulk.reason.as_deref())
            .bind(&bulk.actor)
            .bind(&ids)
            .exec(&mut *tx)
            .await?;
        let change = match bulk.outcome {
            RunOutcome::Retried => sqlx::query(RETRY).bind(now).bind(&ids),
            RunOutcome::Parked => sqlx::query(PARK)
                .bind(bulk.reason.as_deref())
                .bind(&ids)
                .bind(&window.signatures),
            _ => sqlx::query(DELETE).bind(&ids),
        };
        let changed = change.execute(&mut *tx).await.db()?.rows_affected();
        tx.commit().await.db()?;
        Ok((changed, next))
    }
}
