//! Trace contexts on SQLite (DESIGN.md rule 14): an enqueue's context is
//! appended to its keys' next run ([`LINK`]); migration 0018's trigger moves
//! them to the run when its lease starts, where
//! [`lease_trace_batch`](SqliteStore::lease_trace_batch) reads them. A run
//! that ends keeps its span's trace id in its history row
//! ([`keep_trace_ids`]).

use crate::store::exec::Exec as _;
use serde_json::{Value, json};
use sqlx::SqliteConnection;

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use crate::store::params::LeaseComplete;
use crate::store::types::Lease;
use crate::store::{StoreError, TraceContext, TraceLinks};

/// Appends the context `?3` to the next run of the keys `?2` (a JSON array)
/// of process `?1`: the first and the last 8 contexts are kept
/// ([`TRACE_LINKS_KEPT`](crate::store::TRACE_LINKS_KEPT)), and when a 17th
/// comes the oldest of the last 8 is dropped and counted. PostgreSQL's
/// `drover_trace_link` (migration 0015) says the same.
const LINK: &str = "
UPDATE drover_items SET trace_links = CASE
    WHEN trace_links IS NULL THEN json_object('links', json_array(?3), 'dropped', 0)
    WHEN json_array_length(trace_links, '$.links') < 16
        THEN json_insert(trace_links, '$.links[#]', ?3)
    ELSE json_set(json_insert(json_remove(trace_links, '$.links[8]'), '$.links[#]', ?3),
                  '$.dropped', json_extract(trace_links, '$.dropped') + 1)
    END
WHERE process = ?1 AND key IN (SELECT value FROM json_each(?2))";

/// Adds `context` to the next run of each of `keys` (a JSON array of keys
/// that are items) on `conn`, inside the enqueue's transaction.
pub(super) async fn link(
    conn: &mut SqliteConnection,
    process: &str,
    keys: &str,
    context: &TraceContext,
) -> Result<(), StoreError> {
    sqlx::query(LINK)
        .bind(process)
        .bind(keys)
        .bind(context.stored())
        .exec(conn)
        .await?;
    Ok(())
}

impl SqliteStore {
    /// The trace contexts the runs under `leases` absorbed, by position
    /// (see [`Store::lease_trace_batch`](crate::store::Store::lease_trace_batch)):
    /// one statement, each row found by its key and checked against its
    /// lease. Empty for a lease another took since.
    pub(crate) async fn lease_trace_batch(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<TraceLinks>, StoreError> {
        let asked: Vec<Value> = leases
            .iter()
            .map(|l| json!([l.process, l.key, l.token.0]))
            .collect();
        let found: Vec<(i64, String)> = sqlx::query_as(
            "SELECT j.key, i.trace_run FROM json_each(?1) AS j CROSS JOIN drover_items AS i
                 ON i.process = json_extract(j.value, '$[0]')
                    AND i.key = json_extract(j.value, '$[1]')
             WHERE i.lease_token = json_extract(j.value, '$[2]') AND i.state = 'running'
                 AND i.trace_run IS NOT NULL",
        )
        .bind(Value::from(asked).to_string())
        .fetch_all(&self.pool)
        .await
        .db()?;
        let mut links = vec![TraceLinks::default(); leases.len()];
        for (n, run) in found {
            if let Some(slot) = usize::try_from(n).ok().and_then(|n| links.get_mut(n)) {
                *slot = TraceLinks::from_json(Some(&run));
            }
        }
        Ok(links)
    }

    /// Adds `context` to the next run of one key, in its own transaction (see
    /// [`Store::item_trace_link`](crate::store::Store::item_trace_link)).
    pub(crate) async fn item_trace_link(
        &self,
        process: &str,
        key: &str,
        context: &TraceContext,
    ) -> Result<(), StoreError> {
        let keys = serde_json::to_string(&[key]).expect("a list of strings always serializes");
        let mut tx = self.begin().await?;
        link(&mut tx, process, &keys, context).await?;
        tx.commit().await.db()
    }
}

/// Sets the trace id of the history rows of runs that ended at `?1`: `?2` is
/// a JSON array of `[process, key, token, trace id]`. Each run's row is its
/// key's newest, written in this transaction, found at the end of the
/// `(process, key, id)` index and checked by its token; materialized first,
/// so the update visits only those rows.
const KEEP: &str = "
WITH t(id, token, trace_id) AS MATERIALIZED (
    SELECT (SELECT max(r.id) FROM drover_runs AS r
            WHERE r.process = json_extract(j.value, '$[0]')
                AND r.key = json_extract(j.value, '$[1]')),
        json_extract(j.value, '$[2]'), json_extract(j.value, '$[3]')
    FROM json_each(?2) AS j)
UPDATE drover_runs SET trace_id = t.trace_id FROM t
WHERE drover_runs.id = t.id AND drover_runs.token = t.token AND drover_runs.ended_at = ?1";

/// The runs of `batch` that carry a trace id and were settled (`Ok` in
/// `answers`, by position), as [`KEEP`] takes them; `None` when there are
/// none, so a batch without tracing writes nothing more.
pub(super) fn trace_ids<E>(
    batch: &[LeaseComplete<'_>],
    answers: &[Option<Result<(), E>>],
) -> Option<String> {
    let rows: Vec<Value> = batch
        .iter()
        .zip(answers)
        .filter(|(_, answer)| matches!(answer, Some(Ok(()))))
        .filter_map(|(params, _)| {
            let id = params.trace_id?;
            let lease = params.lease;
            Some(json!([
                lease.process,
                lease.key,
                lease.token.0,
                id.to_string()
            ]))
        })
        .collect();
    (!rows.is_empty()).then(|| Value::from(rows).to_string())
}

/// Keeps the runs' trace ids ([`trace_ids`]) in the history rows written at
/// `now` in `tx`, before it commits.
pub(super) async fn keep_trace_ids(tx: &mut Tx, now: i64, runs: &str) -> Result<(), StoreError> {
    sqlx::query(KEEP)
        .bind(now)
        .bind(runs)
        .exec(&mut **tx)
        .await?;
    Ok(())
}
