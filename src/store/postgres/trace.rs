//! Trace contexts on PostgreSQL (DESIGN.md rule 14): an enqueue's context is
//! appended to its keys' next run by `drover_trace_link` (migration 0015),
//! the function other programs call after `drover_enqueue`; that migration's
//! trigger moves them to the run when its lease starts, where
//! [`lease_trace_batch`](PostgresStore::lease_trace_batch) reads them. A run
//! that ends keeps its span's trace id in its history row
//! ([`keep_trace_ids`]).

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};
use sqlx::{Executor, Postgres};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use crate::store::params::LeaseComplete;
use crate::store::types::Lease;
use crate::store::{StoreError, TraceContext, TraceLinks};

/// Adds `context` to the next run of each of `keys` on `conn`, inside the
/// enqueue's transaction.
pub(super) async fn link<C>(
    conn: &mut C,
    process: &str,
    keys: &[&str],
    context: &TraceContext,
) -> Result<(), StoreError>
where
    C: ?Sized + Send,
    for<'c> &'c mut C: Executor<'c, Database = Postgres>,
{
    sqlx::query("SELECT drover_trace_link($1, $2, $3)")
        .bind(process)
        .bind(keys)
        .bind(context.stored())
        .exec(&mut *conn)
        .await?;
    Ok(())
}

impl PostgresStore {
    /// The trace contexts the runs under `leases` absorbed, by position
    /// (see [`Store::lease_trace_batch`](crate::store::Store::lease_trace_batch)):
    /// one statement, each row found by its key and checked against its
    /// lease. Empty for a lease another took since.
    pub(crate) async fn lease_trace_batch(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<TraceLinks>, StoreError> {
        let mut tx = self.read().await?;
        let found: Vec<(i64, String)> = sqlx::query_as(
            "SELECT l.n, i.trace_run::text
             FROM UNNEST($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY
                 AS l(process, key, token, n)
             JOIN drover_items i ON i.process = l.process AND i.key = l.key
             WHERE i.lease_token = l.token AND i.state = 'running'
                 AND i.trace_run IS NOT NULL",
        )
        .bind(
            leases
                .iter()
                .map(|l| l.process.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(leases.iter().map(|l| l.key.as_str()).collect::<Vec<_>>())
        .bind(leases.iter().map(|l| l.token.0).collect::<Vec<_>>())
        .fetch_all(&mut tx)
        .await
        .db()?;
        commit(tx).await?;
        let mut links = vec![TraceLinks::default(); leases.len()];
        for (n, run) in found {
            // WITH ORDINALITY counts from 1.
            if let Some(slot) = usize::try_from(n - 1).ok().and_then(|n| links.get_mut(n)) {
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
        let (mut tx, _) = self.write().await?;
        link(&mut tx, process, &[key], context).await?;
        commit(tx).await
    }
}

/// Sets the trace id of the history rows of runs that ended at `$1`, by
/// process, key and token (`$2`–`$5`, one position per run). Each run's row
/// is its key's newest, written in this transaction (the item's row lock
/// keeps any other run of the key out), found at the end of the `(process,
/// key, id)` index and checked by its token.
const KEEP: &str = "
UPDATE drover_runs AS r SET trace_id = t.trace_id
FROM (SELECT (SELECT max(o.id) FROM drover_runs o WHERE o.process = u.process AND o.key = u.key)
             AS id, u.token, u.trace_id
      FROM UNNEST($2::text[], $3::text[], $4::bigint[], $5::text[])
          AS u(process, key, token, trace_id)) AS t
WHERE r.id = t.id AND r.token = t.token AND r.ended_at = $1";

/// Keeps the trace ids of `batch`'s runs that were settled (`Ok` in
/// `results`, by position) in their history rows written at `now` in `tx`,
/// before it commits. A batch without a trace id (tracing off) sends
/// nothing.
pub(super) async fn keep_trace_ids(
    tx: &mut Tx,
    now: DateTime<Utc>,
    batch: &[LeaseComplete<'_>],
    results: &[Result<(), StoreError>],
) -> Result<(), StoreError> {
    let traced: Vec<_> = batch
        .iter()
        .zip(results)
        .filter(|(_, result)| result.is_ok())
        .filter_map(|(params, _)| Some((params.lease, params.trace_id?.to_string())))
        .collect();
    if traced.is_empty() {
        return Ok(());
    }
    sqlx::query(KEEP)
        .bind(now)
        .bind(
            traced
                .iter()
                .map(|(l, _)| l.process.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            traced
                .iter()
                .map(|(l, _)| l.key.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(traced.iter().map(|(l, _)| l.token.0).collect::<Vec<_>>())
        .bind(traced.iter().map(|(_, id)| id.as_str()).collect::<Vec<_>>())
        .exec(&mut *tx)
        .await?;
    Ok(())
}
