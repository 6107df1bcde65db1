//! Trace contexts on SQLite (DESIGN.md rule 14): an enqueue's context is
//! appended to its keys' next run ([`LINK`], through the view other programs
//! insert into, `drover_trace_link`); migration 0018's trigger moves
//! them to the run when its lease starts, where the claim reads them back
//! when it is asked to ([`claimed_links`]). A run
//! that ends keeps its span's trace id in its history row
//! ([`keep_trace_ids`]).

use crate::store::exec::Exec as _;
use serde_json::{Value, json};
use sqlx::SqliteConnection;

use super::engine::{SqliteStore, Tx, clock_ms};
use super::error::Db as _;
use crate::store::params::LeaseComplete;
use crate::store::types::Lease;
use crate::store::{StoreError, TraceContext, TraceLinks};

/// Appends the context `?3` to the next run of each of the keys `?2` (a JSON
/// array) of process `?1`, through the view `drover_trace_link` (migration
/// 0020), which other programs use too: its trigger keeps the first and the
/// last 8 contexts ([`TRACE_LINKS_KEPT`](crate::store::TRACE_LINKS_KEPT)) and
/// counts the ones between, as PostgreSQL's `drover_trace_link` (migration
/// 0015) does. A key named twice gets the context once.
const LINK: &str = "
INSERT INTO drover_trace_link (process, key, context)
SELECT DISTINCT ?1, value, ?3 FROM json_each(?2)";

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

/// The trace contexts each lease's run absorbed, read in the general claim's
/// transaction right after it started them (the trigger has moved them to
/// `trace_run`): the runs of session `?1` whose tokens are in `?2` (a JSON
/// array), one probe of the lease index each. ([`QUICK`](super::leases::QUICK)
/// reads them back with its leases.)
const CLAIMED: &str = "
SELECT lease_token, trace_run FROM drover_items
WHERE lease_session = ?1 AND lease_token IN (SELECT value FROM json_each(?2))
    AND trace_run IS NOT NULL";

/// Fills each of `leases`' trace links ([`CLAIMED`]), inside the claim's
/// transaction `tx`: empty for a run that absorbed no context.
pub(super) async fn claimed_links(tx: &mut Tx, leases: &mut [Lease]) -> Result<(), StoreError> {
    let Some(session) = leases.first().map(|l| l.session) else {
        return Ok(());
    };
    let tokens: Vec<i64> = leases.iter().map(|l| l.token.0).collect();
    let found: Vec<(i64, String)> = sqlx::query_as(CLAIMED)
        .bind(session.0)
        .bind(Value::from(tokens).to_string())
        .fetch_all(&mut **tx)
        .await
        .db()?;
    let mut found: std::collections::HashMap<i64, String> = found.into_iter().collect();
    for lease in leases {
        let run = found.remove(&lease.token.0);
        lease.trace_links = Some(TraceLinks::from_json(run.as_deref()));
    }
    Ok(())
}

impl SqliteStore {
    /// Adds `context` to the next run of `lease`'s key while the lease holds
    /// it ([`HOLDS`]), in its own transaction, which holds the write lock
    /// from the check to the link (see
    /// [`Store::item_trace_link`](crate::store::Store::item_trace_link)).
    pub(crate) async fn item_trace_link(
        &self,
        lease: &Lease,
        context: &TraceContext,
    ) -> Result<(), StoreError> {
        let keys =
            serde_json::to_string(&[&lease.key]).expect("a list of strings always serializes");
        let mut tx = self.begin().await?;
        let held: Option<i64> = sqlx::query_scalar(HOLDS)
            .bind(&lease.process)
            .bind(&lease.key)
            .bind(lease.session.0)
            .bind(lease.token.0)
            .bind(self.clock.offset_ms())
            .fetch_optional(&mut *tx)
            .await
            .db()?;
        if held.is_none() {
            return Err(StoreError::lease_lost(lease));
        }
        link(&mut tx, &lease.process, &keys, context).await?;
        tx.commit().await.db()
    }
}

/// Whether lease (`?3`, `?4`) holds key `?2` of process `?1` with its
/// session alive on the clock (shifted by `?5` ms): a lease whose session
/// expired, reclaimed or not yet, would have its completion refused, so its
/// link must be too. One statement, where `held` in `leases` takes two.
const HOLDS: &str = concat!(
    "
SELECT 1 FROM drover_items
WHERE process = ?1 AND key = ?2 AND state = 'running' AND lease_session = ?3
    AND lease_token = ?4
    AND EXISTS (SELECT 1 FROM drover_sessions WHERE id = ?3 AND deadline > ",
    clock_ms!(),
    " + ?5)"
);

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
