//! `.exec(executor)`: a statement executed and its driver error mapped by its
//! engine's own rules. Every write of both engines ends this way, so it is
//! written once here instead of as the same four lines at each of them.

use std::future::Future;

use sqlx::query::Query;
use sqlx::{Database, Executor, IntoArguments};

use crate::store::StoreError;

/// An engine's database: how its driver errors become [`StoreError`]s (each
/// engine reads its own error codes) and how many rows a statement changed.
pub(crate) trait EngineDatabase: Database {
    /// The store's error for a driver error.
    fn store_error(e: sqlx::Error) -> StoreError;

    /// How many rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

/// Executes a statement ([`sqlx::query`]) with its engine's error mapping.
pub(crate) trait Exec<'q, DB: EngineDatabase> {
    /// Executes on `executor`; how many rows changed.
    fn exec<'e, 'c: 'e, E>(
        self,
        executor: E,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'e
    where
        'q: 'e,
        Self: 'e,
        E: 'e + Executor<'c, Database = DB>;
}

impl<'q, DB, A> Exec<'q, DB> for Query<'q, DB, A>
where
    DB: EngineDatabase,
    A: 'q + IntoArguments<DB> + Send,
    Self: Send,
{
    fn exec<'e, 'c: 'e, E>(
        self,
        executor: E,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'e
    where
        'q: 'e,
        Self: 'e,
        E: 'e + Executor<'c, Database = DB>,
    {
        let done = executor.execute(self);
        async move {
            done.await
                .map(|done| DB::rows_affected(&done))
                .map_err(DB::store_error)
        }
    }
}
