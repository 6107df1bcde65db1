//! [`StoreTx`]: the caller's own transaction on the store's database, on
//! whichever engine the store is, for enqueueing where the change happens
//! (DESIGN.md rule 11).

use std::collections::BTreeSet;

#[cfg(feature = "postgres")]
use super::postgres::CallerTx as PgTx;
#[cfg(feature = "sqlite")]
use super::sqlite::CallerTx as SqliteTx;
use super::{EnqueueReport, ItemDelete, ItemEnqueue, Store, StoreError, wakeup};

/// A transaction the caller runs its own statements in (reach the connection
/// with [`postgres`](Self::postgres) or [`sqlite`](Self::sqlite)) and
/// enqueues in ([`item_enqueue`](Self::item_enqueue)) or forgets keys in
/// ([`item_delete`](Self::item_delete)): the changes and the keys commit
/// together or not at all, so a crash between "change the row"
/// and "enqueue its key" cannot happen.
///
/// Enqueues follow exactly the store's rules (the same SQL). Workers hear of
/// them only when the transaction commits: [`commit`](Self::commit) wakes this
/// process's idle workers, PostgreSQL's `NOTIFY` (queued in the transaction)
/// wakes the workers of every node, and SQLite workers in other processes find
/// the keys at their next idle poll (1 s by default). Dropping a `StoreTx`
/// rolls it back.
///
/// ```no_run
/// # async fn run(store: drover::store::Store) -> Result<(), Box<dyn std::error::Error>> {
/// use drover::store::ItemEnqueue;
/// let mut tx = store.begin().await?;
/// if let Some(conn) = tx.sqlite() {
///     sqlx::query("UPDATE machines SET wanted = 'on' WHERE id = 'm-42'").execute(conn).await?;
/// }
/// tx.item_enqueue(ItemEnqueue::new("provision", ["m-42"])).await?;
/// tx.commit().await?; // the change and its key, or neither
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StoreTx {
    store: Store,
    conn: Conn,
    /// The processes enqueued to, woken after the commit.
    processes: BTreeSet<String>,
}

#[derive(Debug)]
enum Conn {
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteTx),
    #[cfg(feature = "postgres")]
    Postgres(PgTx),
}

/// Runs `$call` with `$s`, the engine's store, and `$tx`, the transaction,
/// on whichever engine the [`StoreTx`] `$self` is.
macro_rules! on_engine {
    ($self:ident, $s:ident, $tx:ident => $call:expr) => {
        match &mut $self.conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite($tx) => {
                let $s = $self
                    .store
                    .sqlite()
                    .expect("a SQLite transaction has a SQLite store");
                $call
            }
            #[cfg(feature = "postgres")]
            Conn::Postgres($tx) => {
                let $s = $self
                    .store
                    .postgres()
                    .expect("a PostgreSQL transaction has its store");
                $call
            }
        }
    };
}

impl Store {
    /// Begins a transaction of the caller's on this store's database (see
    /// [`StoreTx`]); on SQLite with `BEGIN IMMEDIATE`, so it holds the write
    /// lock from the start (keep it short: other writers wait).
    pub async fn begin(&self) -> Result<StoreTx, StoreError> {
        #[cfg(feature = "sqlite")]
        if let Some(s) = self.sqlite() {
            let conn = Conn::Sqlite(s.caller_begin().await?);
            return Ok(StoreTx::new(self, conn));
        }
        #[cfg(feature = "postgres")]
        if let Some(s) = self.postgres() {
            let conn = Conn::Postgres(s.caller_begin().await?);
            return Ok(StoreTx::new(self, conn));
        }
        unreachable!("a Store always holds an engine compiled in")
    }
}

impl StoreTx {
    fn new(store: &Store, conn: Conn) -> Self {
        Self {
            store: store.clone(),
            conn,
            processes: BTreeSet::new(),
        }
    }

    /// The PostgreSQL connection of this transaction, for the caller's own
    /// statements; `None` on SQLite.
    #[cfg(feature = "postgres")]
    pub fn postgres(&mut self) -> Option<&mut sqlx::PgConnection> {
        match &mut self.conn {
            Conn::Postgres(tx) => Some(&mut **tx),
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => None,
        }
    }

    /// The SQLite connection of this transaction, for the caller's own
    /// statements; `None` on PostgreSQL.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(&mut self) -> Option<&mut sqlx::SqliteConnection> {
        match &mut self.conn {
            Conn::Sqlite(tx) => Some(&mut **tx),
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => None,
        }
    }

    /// Enqueues in this transaction, with the rules of
    /// [`StoreEngine::item_enqueue`](super::StoreEngine::item_enqueue); the
    /// keys exist once [`commit`](Self::commit) succeeds. A database error
    /// leaves the transaction to be rolled back.
    pub async fn item_enqueue(&mut self, params: ItemEnqueue) -> Result<EnqueueReport, StoreError> {
        #[cfg(feature = "otel")]
        let params = match params.trace {
            Some(_) => params,
            None => params.trace(super::TraceContext::current()),
        };
        let process = params.process.clone();
        let report = on_engine!(self, s, tx => s.item_enqueue_in(tx, params).await)?;
        self.processes.insert(process);
        Ok(report)
    }

    /// Forgets a key in this transaction, with the rules of
    /// [`StoreEngine::item_delete`](super::StoreEngine::item_delete) (a
    /// running key is refused; the deletion is recorded); `false` when there
    /// is no such key.
    pub async fn item_delete(&mut self, params: ItemDelete) -> Result<bool, StoreError> {
        on_engine!(self, s, tx => s.item_delete_in(tx, params).await)
    }

    /// Commits the caller's changes and the enqueues together, then wakes this
    /// process's idle workers of each process enqueued to.
    pub async fn commit(self) -> Result<(), StoreError> {
        match self.conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(tx) => super::SqliteStore::caller_commit(tx).await?,
            #[cfg(feature = "postgres")]
            Conn::Postgres(tx) => super::PostgresStore::caller_commit(tx).await?,
        }
        for process in &self.processes {
            wakeup::notify(process);
        }
        Ok(())
    }

    /// Rolls back the caller's changes and the enqueues.
    pub async fn rollback(self) -> Result<(), StoreError> {
        match self.conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(tx) => super::SqliteStore::caller_rollback(tx).await,
            #[cfg(feature = "postgres")]
            Conn::Postgres(tx) => super::PostgresStore::caller_rollback(tx).await,
        }
    }
}
