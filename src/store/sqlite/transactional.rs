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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::Store;

    /// Whether another process could take the writers' lock file beside
    /// `db` now (letting it go again at once).
    fn turn_free(db: &std::path::Path) -> bool {
        let mut path = std::fs::canonicalize(db)
            .expect("the database")
            .into_os_string();
        path.push("-lock");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(path)
            .expect("the lock file");
        file.try_lock().is_ok()
    }

    /// A caller's transaction keeps this process's turn at the file until
    /// it ends, whatever another turn of this process does meanwhile. The
    /// turns of one store share one open lock file, on which `flock` does
    /// not exclude: a second `Store::begin` beside an open one got a turn at
    /// once, and when it was given up (its caller stopped waiting for SQLite's
    /// lock) it let go of the file's lock the first still counted on; a
    /// worker in another process then took the turn and waited in SQLite's
    /// busy handler behind the open transaction, as with no turns at all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_callers_transaction_keeps_its_turn_when_another_beside_it_is_given_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("d.db");
        let store = Store::connect(&format!("sqlite://{}", db.display()))
            .await
            .expect("store");
        let first = store.begin().await.expect("the first transaction");
        assert!(!turn_free(&db), "an open transaction holds no turn");
        // Waits for SQLite's lock, which `first` holds, until given up.
        let second = tokio::time::timeout(Duration::from_millis(500), store.begin()).await;
        assert!(
            second.is_err(),
            "a second write transaction began beside the first"
        );
        assert!(
            !turn_free(&db),
            "the first transaction, still open, lost its turn when the second was given up"
        );
        first.commit().await.expect("commit");
        assert!(turn_free(&db), "the turn outlived the transactions");
        store.close().await;
    }
}
