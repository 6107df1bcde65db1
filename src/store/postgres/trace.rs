//! Trace contexts on PostgreSQL (DESIGN.md rule 14): an enqueue's context is
//! appended to its keys' next run by `drover_trace_link` (migration 0015),
//! the function other programs call after `drover_enqueue`; that migration's
//! trigger moves them to the run when its lease starts, where
//! [`lease_trace`] reads them.

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
        .execute(&mut *conn)
        .await
        .db()?;
    Ok(())
}

impl PostgresStore {
    /// The trace contexts the run under `lease` absorbed (see
    /// [`Store::lease_trace`](crate::store::Store::lease_trace)).
    /// Empty once another lease took the key.
    pub(crate) async fn lease_trace(&self, lease: &Lease) -> Result<TraceLinks, StoreError> {
        let run: Option<Option<String>> = sqlx::query_scalar(
            "SELECT trace_run::text FROM drover_items
             WHERE process = $1 AND key = $2 AND lease_token = $3 AND state = 'running'",
        )
        .bind(&lease.process)
        .bind(&lease.key)
        .bind(lease.token.0)
        .fetch_optional(&self.pool)
        .await
        .db()?;
        Ok(TraceLinks::from_json(run.flatten().as_deref()))
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
