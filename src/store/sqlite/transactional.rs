//! Enqueueing on a transaction the caller holds (DESIGN.md rule 11): the
//! caller changes its own rows and enqueues their keys in one transaction, so
//! a crash in between is impossible and a rollback leaves no key behind.

use sqlx::SqliteConnection;

use super::admin;
use super::engine::SqliteStore;
use super::enqueue::coalesce;
use super::error::Db as _;
use super::turns::Turn;
use crate::store::StoreError;
use crate::store::params::{ItemDelete, ItemEnqueue};
use crate::store::types::EnqueueReport;

impl SqliteStore {
    /// Enqueues `params.keys` on `conn`, a connection in the caller's open
    /// transaction on the store's database file (pass `&mut *tx` for a
    /// `sqlx::Transaction<Sqlite>`), with exactly the rules of
    /// [`item_enqueue`](crate::store::StoreEngine::item_enqueue): the same
    /// statement coalesces the keys, marks running keys dirty and never
    /// shortens a backoff. (Programs without this library insert into the
    /// view `drover_enqueue`, which follows the same rules.)
    ///
    /// Nothing is visible to workers until the caller commits. SQLite cannot
    /// tell anyone about a commit: workers in other processes find the keys at
    /// their next idle poll (1 s by default); wake this process's workers at
    /// once after the commit with `store.wakeup(process).notify_waiters()`.
    /// Begin the transaction with `BEGIN IMMEDIATE` (as the store's writes do)
    /// so it cannot fail half-way on a lock upgrade.
    ///
    /// A transaction begun on the pool takes no turn at the file among the
    /// drover processes that share it (see the README's SQLite section), as
    /// another program's does not: back to back, such transactions can keep
    /// a worker in another process from its heartbeats past its TTL. Where
    /// that matters, enqueue in [`Store::begin`](crate::store::Store::begin)'s
    /// transaction, which takes the turn.
    ///
    /// ```no_run
    /// # async fn run(store: drover::store::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use drover::store::ItemEnqueue;
    /// let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
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
    /// to be rolled back.
    pub async fn item_enqueue_in(
        &self,
        conn: &mut SqliteConnection,
        params: ItemEnqueue,
    ) -> Result<EnqueueReport, StoreError> {
        coalesce(self, conn, &params).await
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
        conn: &mut SqliteConnection,
        params: ItemDelete,
    ) -> Result<bool, StoreError> {
        admin::delete_in(self, conn, &params).await
    }
}

/// A caller's transaction on this store's database, for [`StoreTx`](crate::store::StoreTx),
/// and this process's turn at the file (see [`turns`](super::turns)), held
/// until the transaction has ended: it is a write transaction of this store
/// like the writer's own, and without its turn a program enqueueing in its
/// transactions back to back took SQLite's lock again microseconds after each
/// commit, while a worker in another process, woken in the kernel for
/// nothing, waited in SQLite's busy handler past its session's TTL.
pub(crate) struct CallerTx {
    /// Dropped before the turn: its rollback is queued first.
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    _turn: Option<Turn>,
}

impl std::fmt::Debug for CallerTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerTx").finish_non_exhaustive()
    }
}

impl std::ops::Deref for CallerTx {
    type Target = sqlx::Transaction<'static, sqlx::Sqlite>;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for CallerTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl SqliteStore {
    /// Begins a caller's transaction with `BEGIN IMMEDIATE`, so it holds the
    /// write lock from the start and cannot fail half-way on an upgrade,
    /// after taking this process's turn at the file.
    pub(crate) async fn caller_begin(&self) -> Result<CallerTx, StoreError> {
        let turn = self.writer.turn().await;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await.db()?;
        Ok(CallerTx { tx, _turn: turn })
    }

    /// Commits a caller's transaction.
    pub(crate) async fn caller_commit(tx: CallerTx) -> Result<(), StoreError> {
        let CallerTx { tx, _turn } = tx;
        tx.commit().await.db()
    }

    /// Rolls a caller's transaction back.
    pub(crate) async fn caller_rollback(tx: CallerTx) -> Result<(), StoreError> {
        let CallerTx { tx, _turn } = tx;
        tx.rollback().await.db()
    }
}
