//! A producer's own transaction on either engine ([`StoreTx`]), for the tests
//! of enqueueing inside it (DESIGN.md rule 11), with the statements a user
//! and a program in another language would run in it.

use drover::store::{EnqueueReport, ItemDelete, ItemEnqueue, Store, StoreError, StoreTx};
use sqlx::AssertSqlSafe;

/// An open transaction of the caller, on the store's database.
pub(crate) struct CallerTx(StoreTx);

impl CallerTx {
    /// Begins a transaction through [`Store::begin`].
    pub(crate) async fn begin(store: &Store) -> Self {
        Self(store.begin().await.expect("begin"))
    }

    /// Runs one statement of the user's own.
    pub(crate) async fn execute(&mut self, sql: &str) {
        let sql = AssertSqlSafe(sql.to_owned());
        let done = if let Some(conn) = self.0.postgres() {
            sqlx::query(sql).execute(conn).await.map(drop)
        } else {
            let conn = self.0.sqlite().expect("an engine");
            sqlx::query(sql).execute(conn).await.map(drop)
        };
        done.expect("execute");
    }

    /// Enqueues through the library call on this transaction.
    pub(crate) async fn enqueue(
        &mut self,
        params: ItemEnqueue,
    ) -> Result<EnqueueReport, StoreError> {
        self.0.item_enqueue(params).await
    }

    /// Forgets a key through the library call on this transaction.
    pub(crate) async fn delete(&mut self, params: ItemDelete) -> Result<bool, StoreError> {
        self.0.item_delete(params).await
    }

    /// Enqueues one key the way a program in another language does: the SQL
    /// function on PostgreSQL, an insert into the view on SQLite.
    pub(crate) async fn enqueue_sql(
        &mut self,
        process: &str,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        if let Some(conn) = self.0.postgres() {
            sqlx::query("SELECT drover_enqueue($1, ARRAY[$2])")
                .bind(process)
                .bind(key)
                .execute(conn)
                .await
                .map(drop)
        } else {
            let conn = self.0.sqlite().expect("an engine");
            sqlx::query("INSERT INTO drover_enqueue (process, key) VALUES (?1, ?2)")
                .bind(process)
                .bind(key)
                .execute(conn)
                .await
                .map(drop)
        }
    }

    pub(crate) async fn commit(self) {
        self.0.commit().await.expect("commit");
    }

    pub(crate) async fn rollback(self) {
        self.0.rollback().await.expect("rollback");
    }
}
