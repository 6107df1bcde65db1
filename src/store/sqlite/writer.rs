//! The store's one write connection, and the `BEGIN IMMEDIATE` transactions
//! every write runs in.
//!
//! A file database's writer is a connection the store holds for its whole
//! life behind a queue (a fair mutex), not a pool of one. sqlx's pool returns a
//! connection by spawning a task that pings it, and pings it again before the
//! next checkout: two round trips to the connection's thread and a task that
//! waits its turn behind every run the runtime is polling. In a burn-down
//! (1,024 runs at once) that left the writer idle 3–4 ms between one
//! transaction and the next, a sixth of the drain. Here the next transaction
//! gets the connection the moment the last one ends.
//!
//! An in-memory database has one connection, which reads share: its writer
//! checks that connection out of the pool per transaction, as before.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::turns::{Turn, Turns};

/// Where a store's write transactions get their connection. Cheap to clone.
#[derive(Debug, Clone)]
pub(super) enum Writer {
    /// A file database: a connection of the writer's own, queued for.
    Held(Arc<Mutex<Slot>>),
    /// An in-memory database: the pool's one connection, shared with reads.
    Pooled(SqlitePool),
}

/// The held connection, and what the last transaction left undone.
#[derive(Debug)]
pub(super) struct Slot {
    /// `None` once the store is closed.
    conn: Option<SqliteConnection>,
    /// A transaction was dropped unfinished and its rollback has not run yet
    /// (it runs on a task, or on the next `begin` when there was no runtime to
    /// run a task on).
    unfinished: bool,
    /// The lock file that gives the processes on this database their turns
    /// (see [`turns`](super::turns)); `None` when it could not be opened.
    turns: Option<Turns>,
}

impl Writer {
    /// A writer holding `conn`, taking its turns on `turns`.
    pub(super) fn held(conn: SqliteConnection, turns: Option<Turns>) -> Self {
        Self::Held(Arc::new(Mutex::new(Slot {
            conn: Some(conn),
            unfinished: false,
            turns,
        })))
    }

    /// Waits for the connection, then starts a `BEGIN IMMEDIATE` transaction:
    /// it holds SQLite's write lock from its first statement, so it can never
    /// fail half-way on a lock upgrade.
    pub(super) async fn begin(&self) -> Result<Tx, sqlx::Error> {
        let mut tx = self.lock().await?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *tx).await?;
        Ok(tx)
    }

    /// Waits for the connection and hands it over with no statement sent: the
    /// caller's first query starts with `BEGIN IMMEDIATE` (as [`begin`](Self::begin)
    /// sends it alone), so the transaction opens in the same trip to the
    /// connection's thread as its first read (each trip, right after a commit
    /// released a thousand runs, is a wait for a CPU).
    ///
    /// The transaction counts as open from before its `BEGIN` is sent: a
    /// caller that stops waiting for it (a shutdown, a client gone) leaves a
    /// `BEGIN` that may still run, and the drop's rollback, queued behind it,
    /// ends what it began. A `BEGIN` that failed or was never sent leaves
    /// nothing open, and that rollback only finds no transaction.
    ///
    /// A file database's transaction also waits for this process's turn among
    /// the processes on the file, after any unfinished rollback (which never
    /// waits for a turn) and before its `BEGIN`.
    pub(super) async fn lock(&self) -> Result<Tx, sqlx::Error> {
        let conn = match self {
            Self::Held(slot) => {
                let mut slot = Arc::clone(slot).lock_owned().await;
                let unfinished = slot.unfinished;
                let conn = slot.conn.as_mut().ok_or(sqlx::Error::PoolClosed)?;
                if unfinished {
                    roll_back(conn).await;
                    slot.unfinished = false;
                }
                let turn = match &slot.turns {
                    Some(turns) => Some(turns.take().await),
                    None => None,
                };
                Conn::Held(turn, slot)
            }
            Self::Pooled(pool) => Conn::Pooled(pool.acquire().await?),
        };
        Ok(Tx {
            conn: Some(conn),
            open: true,
        })
    }

    /// This process's turn at the file for a write transaction that runs on
    /// a connection of the pool (a caller's own, `Store::begin`), held until
    /// dropped: taken under the writer's queue, as every turn is (one
    /// transaction asks at a time), after the writer's transaction in
    /// progress. `None` for an in-memory database or without a lock file.
    pub(super) async fn turn(&self) -> Option<Turn> {
        match self {
            Self::Held(slot) => {
                let slot = slot.lock().await;
                match &slot.turns {
                    Some(turns) => Some(turns.take().await),
                    None => None,
                }
            }
            Self::Pooled(_) => None,
        }
    }

    /// Closes the connection once the transaction in progress (if any) ends;
    /// later transactions fail with `PoolClosed`.
    pub(super) async fn close(&self) {
        match self {
            Self::Held(slot) => {
                let conn = slot.lock().await.conn.take();
                if let Some(conn) = conn
                    && let Err(e) = sqlx::Connection::close(conn).await
                {
                    tracing::debug!(error = %e, "closing the SQLite write connection failed");
                }
            }
            Self::Pooled(pool) => pool.close().await,
        }
    }
}

/// A query on the writer, before its arguments are bound.
pub(crate) type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments>;

/// Unused arguments bound after each query of several statements, so that
/// every statement gets all of its parameters.
///
/// sqlx binds each statement of such a query by its parameters' numbers,
/// but takes a number the statement skips (it uses `?3` and not `?1`) as an
/// unnumbered `?`, bound to the query's next argument in turn across all its
/// statements; once those run out it leaves the rest of that statement's
/// parameters unbound, that is NULL, without an error. The numbers skipped
/// by the statements of one query add up: no query here skips more than it
/// has arguments ([`plans`](super::plans) checks each, with these spares
/// and without), but a claim merged into a completion's query (session 18,
/// not kept) did, and counted its rows for a NULL process. Spare arguments,
/// never named by a statement, take those turns.
pub(super) const SPARE_ARGUMENTS: usize = 16;

/// A query whose arguments can be padded with [`SPARE_ARGUMENTS`]: sqlx's
/// three query types, which share `bind` but no trait for it.
pub(super) trait Spares: Sized {
    /// Binds one more (NULL) argument.
    fn spare(self) -> Self;
}

impl Spares for SqliteQuery<'_> {
    fn spare(self) -> Self {
        self.bind(None::<i64>)
    }
}

impl<T> Spares for sqlx::query::QueryAs<'_, Sqlite, T, sqlx::sqlite::SqliteArguments> {
    fn spare(self) -> Self {
        self.bind(None::<i64>)
    }
}

impl<T> Spares for sqlx::query::QueryScalar<'_, Sqlite, T, sqlx::sqlite::SqliteArguments> {
    fn spare(self) -> Self {
        self.bind(None::<i64>)
    }
}

/// `query` (a query of several statements) with [`SPARE_ARGUMENTS`] bound
/// after its own arguments.
pub(super) fn padded<Q: Spares>(mut query: Q) -> Q {
    for _ in 0..SPARE_ARGUMENTS {
        query = query.spare();
    }
    query
}

/// Checks, in debug builds, that `sql` ends with its transaction's `COMMIT`.
fn ends_with_commit(sql: &str) {
    debug_assert!(
        sql.trim_end().ends_with("COMMIT"),
        "a query that commits ends with COMMIT: {sql}"
    );
}

/// A transaction's hold on the connection. A held connection's turn comes
/// first, so it is let go before the connection is: the next transaction of
/// this process takes its own turn, not this one's about to end.
enum Conn {
    Held(Option<Turn>, OwnedMutexGuard<Slot>),
    Pooled(PoolConnection<Sqlite>),
}

/// A write transaction, begun by [`Writer::begin`]. It reads as the
/// connection it runs on (`&mut *tx` is a `&mut SqliteConnection`), and it is
/// rolled back if dropped before [`commit`](Self::commit), as sqlx's own
/// transactions are.
pub(crate) struct Tx {
    /// `Some` until dropped.
    conn: Option<Conn>,
    /// `BEGIN` was sent (or may have been: see [`Writer::lock`]), and neither
    /// `COMMIT` nor `ROLLBACK` has run since.
    open: bool,
}

impl fmt::Debug for Tx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").field("open", &self.open).finish()
    }
}

impl Tx {
    /// Commits. On an error the transaction is rolled back when dropped.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        self.commit_with("COMMIT", |query| query).await
    }

    /// Runs `sql`, whose last statement is `COMMIT`, with the arguments
    /// `bind` gives it: the transaction's last writes and its commit in one
    /// trip to the connection's thread. On an error (in a write or in the
    /// commit) the transaction is rolled back when dropped.
    pub(crate) async fn commit_with<'q>(
        mut self,
        sql: &'static str,
        bind: impl FnOnce(SqliteQuery<'q>) -> SqliteQuery<'q>,
    ) -> Result<(), sqlx::Error> {
        ends_with_commit(sql);
        padded(bind(sqlx::query(sql))).execute(&mut *self).await?;
        self.committed().await;
        Ok(())
    }

    /// Like [`commit_with`](Self::commit_with) for `sql` that also reads
    /// one row before its `COMMIT`.
    pub(crate) async fn commit_with_row<'q, T>(
        mut self,
        sql: &'static str,
        bind: impl FnOnce(SqliteQuery<'q>) -> SqliteQuery<'q>,
    ) -> Result<T, sqlx::Error>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
    {
        ends_with_commit(sql);
        // Every row fetched, not the first alone: the statements after the
        // one that reads run only as the results are drained.
        let rows = padded(bind(sqlx::query(sql))).fetch_all(&mut *self).await?;
        self.committed().await;
        let first = rows.first().ok_or(sqlx::Error::RowNotFound)?;
        T::from_row(first)
    }

    /// After a query that ended with `COMMIT` succeeded: hands the
    /// connection on.
    async fn committed(mut self) {
        self.open = false;
        drop(self);
        // Let the next transaction, woken by the drop, take the connection
        // before this task goes on: woken from this thread it waits in a slot
        // no other thread may take it from, so a caller that went on to start a
        // thousand runs or answer a thousand completions kept the writer idle
        // for that long.
        tokio::task::yield_now().await;
    }

    /// Rolls back now, rather than on a task after the drop: for a
    /// transaction that found nothing to write.
    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        sqlx::query("ROLLBACK").execute(&mut *self).await?;
        self.open = false;
        Ok(())
    }
}

impl Deref for Tx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match self
            .conn
            .as_ref()
            .expect("a live transaction has its connection")
        {
            Conn::Held(_, slot) => slot.conn.as_ref().expect("begin checked the connection"),
            Conn::Pooled(conn) => conn,
        }
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self
            .conn
            .as_mut()
            .expect("a live transaction has its connection")
        {
            Conn::Held(_, slot) => slot.conn.as_mut().expect("begin checked the connection"),
            Conn::Pooled(conn) => conn,
        }
    }
}

impl Drop for Tx {
    /// An unfinished transaction (an error, or a caller that stopped waiting)
    /// is rolled back on a task that keeps the connection until it is done,
    /// so SQLite's write lock, which other processes on the file wait for, is
    /// let go at once and the next transaction starts on a clean connection.
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.open {
            return;
        }
        if let Conn::Held(_, slot) = &mut conn {
            slot.unfinished = true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to roll back on (the store is used only from async
            // code, so only at a runtime's shutdown): a held connection is
            // rolled back by the next `begin`.
            return;
        };
        runtime.spawn(async move {
            match conn {
                Conn::Held(turn, mut slot) => {
                    if let Some(c) = slot.conn.as_mut() {
                        roll_back(c).await;
                    }
                    slot.unfinished = false;
                    // The turn lasts until SQLite's lock is let go.
                    drop(turn);
                }
                Conn::Pooled(mut c) => roll_back(&mut c).await,
            }
        });
    }
}

/// Rolls back whatever transaction `conn` is in; there may be none (a failed
/// `COMMIT` can end it), which is not an error here.
async fn roll_back(conn: &mut SqliteConnection) {
    if let Err(e) = sqlx::query("ROLLBACK").execute(conn).await {
        tracing::debug!(error = %e, "rolling back an unfinished SQLite transaction");
    }
}

#[cfg(test)]
mod tests {
    use sqlx::ConnectOptions as _;
    use sqlx::sqlite::SqliteConnectOptions;

    use super::super::SqliteStore;
    use crate::store::StoreOptions;

    /// A store on a fresh file, and a connection of its own to the same file
    /// that gives up at once on a lock (no busy timeout).
    async fn store_and_other() -> (tempfile::TempDir, SqliteStore, sqlx::SqliteConnection) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.db");
        let url = format!("sqlite://{}", path.display());
        let store = SqliteStore::connect(&url, &StoreOptions::default())
            .await
            .expect("connect");
        let other = SqliteConnectOptions::new()
            .filename(&path)
            .busy_timeout(std::time::Duration::ZERO)
            .connect()
            .await
            .expect("a second connection");
        (dir, store, other)
    }

    /// How many processes the file holds, read by `conn`.
    async fn processes(conn: &mut sqlx::SqliteConnection) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM drover_processes")
            .fetch_one(conn)
            .await
            .expect("count")
    }

    /// Takes the write lock on `other` (waiting as long as its busy timeout
    /// says) and counts the processes under it, then lets the lock go.
    async fn processes_under_the_lock(other: &mut sqlx::SqliteConnection) -> i64 {
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *other)
            .await
            .expect("the write lock is free");
        let n = processes(other).await;
        sqlx::query("ROLLBACK")
            .execute(other)
            .await
            .expect("rollback");
        n
    }

    /// Makes `other` wait for a lock (up to ten seconds) instead of giving up.
    async fn patient(other: &mut sqlx::SqliteConnection) {
        sqlx::query("PRAGMA busy_timeout = 10000")
            .execute(other)
            .await
            .expect("a busy timeout");
    }

    async fn insert_process(tx: &mut super::Tx, name: &str) {
        sqlx::query("INSERT INTO drover_processes (process, created_at) VALUES (?1, 0)")
            .bind(name)
            .execute(&mut **tx)
            .await
            .expect("insert");
    }

    #[tokio::test]
    async fn a_dropped_transaction_is_rolled_back_and_lets_go_of_the_write_lock() {
        let (_dir, store, mut other) = store_and_other().await;
        let mut tx = store.writer.begin().await.expect("begin");
        insert_process(&mut tx, "dropped").await;
        // Held: another connection cannot take the write lock.
        let refused = sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await;
        assert!(
            refused.is_err(),
            "the write lock was free during a transaction"
        );
        drop(tx);
        // Nothing else writes in this process: the rollback alone must let go
        // of the lock, which the other connection now waits for.
        patient(&mut other).await;
        let kept = processes_under_the_lock(&mut other).await;
        assert_eq!(kept, 0, "a dropped insert was kept");
        store
            .writer
            .begin()
            .await
            .expect("begin")
            .rollback()
            .await
            .expect("rollback");
    }

    #[tokio::test]
    async fn a_commit_writes_and_lets_go_of_the_write_lock() {
        let (_dir, store, mut other) = store_and_other().await;
        let mut tx = store.writer.begin().await.expect("begin");
        insert_process(&mut tx, "kept").await;
        tx.commit().await.expect("commit");
        assert_eq!(processes_under_the_lock(&mut other).await, 1);
    }

    #[test]
    fn a_transaction_dropped_without_a_runtime_is_rolled_back_by_the_next() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (_dir, store, mut other) = runtime.block_on(store_and_other());
        let tx = runtime.block_on(async {
            let mut tx = store.writer.begin().await.expect("begin");
            insert_process(&mut tx, "dropped").await;
            tx
        });
        drop(tx);
        runtime.block_on(async {
            let mut tx = store
                .writer
                .begin()
                .await
                .expect("begin after an unfinished one");
            insert_process(&mut tx, "next").await;
            tx.commit().await.expect("commit");
            let names: Vec<String> = sqlx::query_scalar("SELECT process FROM drover_processes")
                .fetch_all(&mut other)
                .await
                .expect("names");
            assert_eq!(names, ["next"]);
        });
    }

    #[tokio::test]
    async fn a_begin_given_up_while_it_waits_for_the_lock_leaves_no_transaction_behind() {
        let (_dir, store, mut other) = store_and_other().await;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .expect("the other connection takes the write lock");
        // The writer's BEGIN waits in SQLite's busy handler for that lock; the
        // caller stops waiting (as a shutdown or a gone client does). The
        // timeout is only how the caller gives up: had BEGIN not been sent by
        // then, there would be nothing to leave behind either.
        let given_up =
            tokio::time::timeout(std::time::Duration::from_millis(200), store.writer.begin()).await;
        assert!(given_up.is_err(), "BEGIN went through under another's lock");
        sqlx::query("ROLLBACK")
            .execute(&mut other)
            .await
            .expect("rollback");
        // The abandoned BEGIN now runs, and must not leave the writer inside
        // a transaction nobody owns.
        let mut tx = store.writer.begin().await.expect("a fresh transaction");
        insert_process(&mut tx, "after").await;
        tx.commit().await.expect("commit");
        patient(&mut other).await;
        assert_eq!(processes_under_the_lock(&mut other).await, 1);
    }

    /// A `lock`ed transaction opened by its first statement, which inserts
    /// `name`.
    async fn opened_by_its_first_statement(store: &SqliteStore, name: &str) -> super::Tx {
        let mut tx = store.writer.lock().await.expect("lock");
        sqlx::query(concat!(
            super::super::engine::begin_immediate!(),
            "INSERT INTO drover_processes (process, created_at) VALUES (?1, 0)"
        ))
        .bind(name)
        .execute(&mut *tx)
        .await
        .expect("begin and insert");
        tx
    }

    #[tokio::test]
    async fn a_transaction_opened_by_its_first_statement_holds_the_lock_and_rolls_back() {
        let (_dir, store, mut other) = store_and_other().await;
        let tx = opened_by_its_first_statement(&store, "dropped").await;
        let refused = sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await;
        assert!(refused.is_err(), "the first statement took no write lock");
        drop(tx);
        patient(&mut other).await;
        assert_eq!(processes_under_the_lock(&mut other).await, 0);
        // Dropped before any statement: nothing to roll back, and the
        // writer goes on.
        drop(store.writer.lock().await.expect("lock"));
        let tx = opened_by_its_first_statement(&store, "kept").await;
        tx.commit().await.expect("commit");
        assert_eq!(processes_under_the_lock(&mut other).await, 1);
    }

    #[tokio::test]
    async fn a_commit_with_its_last_writes_commits_them_all_or_none() {
        let (_dir, store, mut other) = store_and_other().await;
        let insert_and_commit = "INSERT INTO drover_processes (process, created_at) VALUES (?1, 0);
            INSERT INTO drover_processes (process, created_at) VALUES (?2, 0);
            COMMIT";
        // The second insert repeats the first's key: the query fails before
        // its COMMIT, and the drop rolls the first insert back.
        let tx = opened_by_its_first_statement(&store, "a").await;
        let failed = tx
            .commit_with(insert_and_commit, |query| query.bind("b").bind("b"))
            .await;
        assert!(failed.is_err(), "a repeated key was inserted twice");
        patient(&mut other).await;
        assert_eq!(processes_under_the_lock(&mut other).await, 0);
        let tx = opened_by_its_first_statement(&store, "a").await;
        tx.commit_with(insert_and_commit, |query| query.bind("b").bind("c"))
            .await
            .expect("commit");
        assert_eq!(processes_under_the_lock(&mut other).await, 3);
    }

    #[tokio::test]
    async fn a_closed_writer_refuses_new_transactions() {
        let (_dir, store, _other) = store_and_other().await;
        store.close().await;
        let refused = store.writer.begin().await;
        assert!(
            matches!(refused, Err(sqlx::Error::PoolClosed)),
            "{refused:?}"
        );
    }
}
