//! Trace contexts on PostgreSQL (DESIGN.md rule 14): an enqueue's context is
//! appended to its keys' next run by `drover_trace_link` (migration 0015),
//! the function other programs call after `drover_enqueue`; that migration's
//! trigger moves them to the run when its lease starts, where the claim
//! reads them when it is asked to (in its own statement, or
//! [`claimed_links`] after a gated claim). A run
//! that ends keeps its span's trace id in its history row, written with the
//! row (`runs.rs`, `LOG_FROM_ROWS`).

use std::collections::HashMap;

use crate::store::exec::Exec as _;
use sqlx::{Executor, Postgres};

use super::engine::PostgresStore;
use super::error::{Db as _, commit};
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

/// Locks the row of key `$2` of process `$1` if lease (`$3`, `$4`) holds it
/// and its session is alive on the database clock (shifted by `$5` ms): a
/// lease whose session expired, reclaimed or not yet, would have its
/// completion refused, so its link must be too. One statement (`held` in
/// `leases` checks the session and locks the row in two, and reads the clock
/// before them: round trips this failure path does not need).
const HOLDS: &str = "
SELECT 1 FROM drover_items
WHERE process = $1 AND key = $2 AND state = 'running' AND lease_session = $3
    AND lease_token = $4
    AND EXISTS (SELECT 1 FROM drover_sessions s WHERE s.id = $3
                AND s.deadline > clock_timestamp() + $5::float8 * interval '1 millisecond')
FOR UPDATE OF drover_items";

/// The trace contexts of the runs of session `$1` whose lease tokens are in
/// `$2`, one probe of the lease index each.
const CLAIMED: &str = "
SELECT lease_token, trace_run::text FROM drover_items
WHERE lease_session = $1 AND lease_token = ANY($2) AND state = 'running'
    AND trace_run IS NOT NULL";

/// Fills each of `leases`' trace links ([`CLAIMED`]) after a gated claim
/// (`drover_claim_gated` returns none: [`CLAIM`](super::leases) reads them
/// in its own statement). Its leases are committed, and a link is never
/// worth losing them: a failed read leaves them without links, and says so
/// in the log.
pub(super) async fn claimed_links(store: &PostgresStore, leases: &mut [Lease]) {
    let Some(session) = leases.first().map(|l| l.session) else {
        return;
    };
    let tokens: Vec<i64> = leases.iter().map(|l| l.token.0).collect();
    let read = async {
        let mut tx = store.read().await?;
        let found: Vec<(i64, String)> = sqlx::query_as(CLAIMED)
            .bind(session.0)
            .bind(&tokens)
            .fetch_all(&mut tx)
            .await
            .db()?;
        commit(tx).await?;
        Ok::<_, StoreError>(found)
    };
    let mut found: HashMap<i64, String> = match read.await {
        Ok(found) => found.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the claimed runs' trace links");
            return;
        }
    };
    for lease in leases {
        let run = found.remove(&lease.token.0);
        lease.trace_links = Some(TraceLinks::from_json(run.as_deref()));
    }
}

impl PostgresStore {
    /// Adds `context` to the next run of `lease`'s key while the lease holds
    /// it, in its own transaction: the row is locked ([`HOLDS`]) before the
    /// link is written, so the lease cannot end in between (see
    /// [`Store::item_trace_link`](crate::store::Store::item_trace_link)).
    pub(crate) async fn item_trace_link(
        &self,
        lease: &Lease,
        context: &TraceContext,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let held: Option<i32> = sqlx::query_scalar(HOLDS)
            .bind(&lease.process)
            .bind(&lease.key)
            .bind(lease.session.0)
            .bind(lease.token.0)
            .bind(self.clock.offset_ms())
            .fetch_optional(&mut tx)
            .await
            .db()?;
        if held.is_none() {
            return Err(StoreError::lease_lost(lease));
        }
        link(&mut tx, &lease.process, &[lease.key.as_str()], context).await?;
        commit(tx).await
    }
}
