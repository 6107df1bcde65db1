//! A producer's own transaction on either engine, for the tests of enqueueing
//! inside it (DESIGN.md rule 11): the user's change and the enqueue share it.

use drover::store::{EnqueueReport, ItemEnqueue, Store, StoreError};
use sqlx::{AssertSqlSafe, Postgres, Sqlite, Transaction};

/// An open transaction of the caller, on the store's database.
pub(crate) enum CallerTx {
    Postgres(Transaction<'static, Postgres>),
    Sqlite(Transaction<'static, Sqlite>),
}

impl CallerTx {
    /// Begins a transaction on the store's pool (`BEGIN IMMEDIATE` on SQLite).
    pub(crate) async fn begin(store: &Store) -> Self {
        if let Some(pool) = store.postgres_pool() {
            Self::Postgres(pool.begin().await.expect("begin"))
        } else {
            let pool = store.sqlite_pool().expect("an engine");
            Self::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await.expect("begin"))
        }
    }

    /// Runs one statement of the user's own.
    pub(crate) async fn execute(&mut self, sql: &str) {
        let sql = AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres(tx) => sqlx::query(sql).execute(&mut **tx).await.map(drop),
            Self::Sqlite(tx) => sqlx::query(sql).execute(&mut **tx).await.map(drop),
        }
        .expect("execute");
    }

    /// Enqueues through the library call on this transaction.
    pub(crate) async fn enqueue(
        &mut self,
        store: &Store,
        params: ItemEnqueue,
    ) -> Result<EnqueueReport, StoreError> {
        match self {
            Self::Postgres(tx) => {
                let engine = store.postgres().expect("a PostgreSQL store");
                engine.item_enqueue_in(tx, params).await
            }
            Self::Sqlite(tx) => {
                let engine = store.sqlite().expect("a SQLite store");
                engine.item_enqueue_in(tx, params).await
            }
        }
    }

    /// Enqueues one key the way a program in another language does: the SQL
    /// function on PostgreSQL, an insert into the view on SQLite.
    pub(crate) async fn enqueue_sql(
        &mut self,
        process: &str,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(tx) => sqlx::query("SELECT drover_enqueue($1, ARRAY[$2])")
                .bind(process)
                .bind(key)
                .execute(&mut **tx)
                .await
                .map(drop),
            Self::Sqlite(tx) => {
                sqlx::query("INSERT INTO drover_enqueue (process, key) VALUES (?1, ?2)")
                    .bind(process)
                    .bind(key)
                    .execute(&mut **tx)
                    .await
                    .map(drop)
            }
        }
    }

    pub(crate) async fn commit(self) {
        match self {
            Self::Postgres(tx) => tx.commit().await,
            Self::Sqlite(tx) => tx.commit().await,
        }
        .expect("commit");
    }

    pub(crate) async fn rollback(self) {
        match self {
            Self::Postgres(tx) => tx.rollback().await,
            Self::Sqlite(tx) => tx.rollback().await,
        }
        .expect("rollback");
    }
}
