//! Enqueueing on a transaction the caller holds (DESIGN.md rule 11): the
//! caller changes its own rows and enqueues their keys in one transaction, so
//! a crash in between is impossible and a rollback leaves no key behind.

use sqlx::PgConnection;

use super::admin;
use super::engine::PostgresStore;
use super::enqueue::coalesce;
use super::error::{Db as _, map_commit};
use super::tx::Passed;
use crate::store::StoreError;
use crate::store::params::{ItemDelete, ItemEnqueue};
use crate::store::rules::enqueue::checked_keys;
use crate::store::types::EnqueueReport;

impl PostgresStore {
    /// Enqueues `params.keys` on `conn`, a connection in the caller's open
    /// transaction (pass `&mut *tx` for a `sqlx::Transaction<Postgres>`), with
    /// exactly the rules of [`item_enqueue`](crate::store::StoreEngine::item_enqueue):
    /// the same SQL function (`drover_enqueue`) coalesces the keys, marks
    /// running keys dirty and never shortens a backoff.
    ///
    /// Nothing is visible to workers until the caller commits; the workers'
    /// `NOTIFY` is queued in the transaction, so PostgreSQL delivers it only
    /// on commit, and a rollback leaves neither the keys nor a wake-up. Keys
    /// are locked in byte order; a caller that enqueues more than once in one
    /// transaction should enqueue in one call to keep that order. Through a
    /// pooler in transaction mode (`?pool_mode=transaction`) drover's
    /// statements on `conn` are unnamed, as the store's own are; the
    /// caller's own statements in the transaction must be too
    /// (`.persistent(false)`).
    ///
    /// ```no_run
    /// # async fn run(store: drover::store::PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use drover::store::ItemEnqueue;
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("UPDATE machines SET wanted = 'on' WHERE id = 'm-42'")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// store.item_enqueue_in(&mut tx, ItemEnqueue::new("provision", ["m-42"])).await?;
    /// tx.commit().await?; // the change and its key, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidKey`] / [`StoreError::InvalidProcess`] before
    /// anything is written; a database error leaves the caller's transaction
    /// aborted (roll it back).
    pub async fn item_enqueue_in(
        &self,
        conn: &mut PgConnection,
        params: ItemEnqueue,
    ) -> Result<EnqueueReport, StoreError> {
        let mut keys = checked_keys(&params.process, &params.keys)?;
        if keys.is_empty() {
            return Ok(EnqueueReport::default());
        }
        keys.sort_unstable();
        let mut conn = Passed::new(conn, self.pooled);
        let report = coalesce(self, &mut conn, &params, &keys).await?;
        self.statistics
            .inserted(&self.pool, &params.process, report.pending);
        Ok(report)
    }

    /// Forgets a key on `conn`, a connection in the caller's open transaction,
    /// with exactly the rules of
    /// [`item_delete`](crate::store::StoreEngine::item_delete): a running key
    /// is refused ([`StoreError::AlreadyLeased`]), the deletion is recorded in
    /// the history, and `false` means there was no such key. It takes effect
    /// when the caller commits.
    ///
    /// # Errors
    ///
    /// [`StoreError::AlreadyLeased`], [`StoreError::InvalidKey`] /
    /// [`StoreError::InvalidProcess`]; a database error leaves the caller's
    /// transaction to be rolled back.
    pub async fn item_delete_in(
        &self,
        conn: &mut PgConnection,
        params: ItemDelete,
    ) -> Result<bool, StoreError> {
        admin::delete_in(self, &mut Passed::new(conn, self.pooled), &params).await
    }
}

/// A caller's transaction on this store's pool, for [`StoreTx`](crate::store::StoreTx).
pub(crate) type CallerTx = sqlx::Transaction<'static, sqlx::Postgres>;

impl PostgresStore {
    /// Begins a caller's transaction (READ COMMITTED, as the store's own),
    /// bounded by its own idle-in-transaction timeout
    /// ([`StoreOptions::caller_idle_timeout`](crate::store::StoreOptions::caller_idle_timeout)),
    /// set with `BEGIN` in one round trip, directly or through a pooler.
    pub(crate) async fn caller_begin(&self) -> Result<CallerTx, StoreError> {
        let begin = sqlx::AssertSqlSafe(self.caller_begin.to_string());
        self.pool.begin_with(begin).await.db()
    }

    /// Commits a caller's transaction; a connection lost while committing is
    /// [`StoreError::CommitUnknown`].
    pub(crate) async fn caller_commit(tx: CallerTx) -> Result<(), StoreError> {
        tx.commit().await.map_err(map_commit)
    }

    /// Rolls a caller's transaction back.
    pub(crate) async fn caller_rollback(tx: CallerTx) -> Result<(), StoreError> {
        tx.rollback().await.db()
    }
}
