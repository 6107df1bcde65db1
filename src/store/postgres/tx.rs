//! [`Tx`]: the one way the engine's statements reach the server, so that what
//! a transaction-pooling PgBouncer breaks can never be used by accident; and
//! [`Passed`], the same for the connection of a caller's own transaction.
//!
//! Directly connected, statements are named prepared statements cached per
//! connection (parsed and planned once), and a read runs on a pooled
//! connection without a transaction. Through a pooler in transaction mode
//! (`?pool_mode=transaction`) the server behind a client connection changes
//! between transactions, so:
//!
//! - no statement is named: a named statement prepared on one server is
//!   missing (or, worse, another client's statement of the same name) on the
//!   next; every statement is unnamed and parsed anew;
//! - every statement runs inside an explicit transaction, reads too: sqlx
//!   sends an unnamed statement's `Parse` and its `Bind` in two round trips
//!   with a `Sync` between them, and outside a transaction the pooler may
//!   hand the `Bind` to another server, which would bind the parameters to
//!   whatever that server parsed last;
//! - no session state: the idle-in-transaction timeout a direct connection
//!   sets at startup is set with `SET LOCAL` in each transaction's `BEGIN`.
//!
//! `&mut Tx` and `&mut Passed` are sqlx executors that pass every query on,
//! unnamed when pooled, so the engine's SQL is written once for both ways.

use futures_core::future::BoxFuture;
use futures_core::stream::BoxStream;
use sqlx::error::BoxDynError;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Either, Execute, Executor, PgConnection, PgPool, Postgres, SqlStr, Transaction};

/// What a transaction through a pooler starts with: the server's
/// idle-in-transaction timeout for this transaction only (see
/// [`IDLE_IN_TRANSACTION`](super::connect::IDLE_IN_TRANSACTION)), sent with
/// `BEGIN` in one round trip. It names READ COMMITTED, which a connection
/// started directly sets at startup (see `connect`): a pooler refuses
/// startup settings.
const POOLED_BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; \
     SET LOCAL idle_in_transaction_session_timeout = '5s'";

/// What a transaction that steps aside from a lock starts with: a lock
/// waited for longer than [`STALL`](crate::store::grouped::STALL) ends it
/// with `lock_not_available` (`Busy`), nothing written. A store's completion
/// group writes so (see `completions`), directly connected and through a
/// pooler.
const STEPPING_ASIDE_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '100ms'";

/// [`STEPPING_ASIDE_BEGIN`] through a pooler in transaction mode, with
/// [`POOLED_BEGIN`]'s idle timeout.
const POOLED_STEPPING_ASIDE_BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; \
     SET LOCAL idle_in_transaction_session_timeout = '5s'; \
     SET LOCAL lock_timeout = '100ms'";

/// Begins a READ COMMITTED transaction on `pool`, with [`POOLED_BEGIN`]
/// through a pooler in transaction mode.
pub(super) async fn pooled_begin(
    pool: &PgPool,
    pooled: bool,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    if pooled {
        pool.begin_with(POOLED_BEGIN).await
    } else {
        pool.begin().await
    }
}

/// Begins a transaction that steps aside from a lock held longer than
/// [`STALL`](crate::store::grouped::STALL) (see [`STEPPING_ASIDE_BEGIN`]).
async fn stepping_aside_begin(
    pool: &PgPool,
    pooled: bool,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    if pooled {
        pool.begin_with(POOLED_STEPPING_ASIDE_BEGIN).await
    } else {
        pool.begin_with(STEPPING_ASIDE_BEGIN).await
    }
}

/// A transaction, or (directly connected) a plain connection for reads.
#[derive(Debug)]
pub(crate) struct Tx {
    inner: Inner,
    /// Whether statements may be named (cached) prepared statements.
    named: bool,
}

#[derive(Debug)]
enum Inner {
    Tx(Transaction<'static, Postgres>),
    Conn(PoolConnection<Postgres>),
}

impl Tx {
    /// Starts a READ COMMITTED transaction.
    pub(super) async fn begin(pool: &PgPool, pooled: bool) -> Result<Self, sqlx::Error> {
        let tx = pooled_begin(pool, pooled).await?;
        Ok(Self {
            inner: Inner::Tx(tx),
            named: !pooled,
        })
    }

    /// Starts a READ COMMITTED transaction that gives up a lock wait of
    /// more than [`STALL`](crate::store::grouped::STALL).
    pub(super) async fn begin_stepping_aside(
        pool: &PgPool,
        pooled: bool,
    ) -> Result<Self, sqlx::Error> {
        let tx = stepping_aside_begin(pool, pooled).await?;
        Ok(Self {
            inner: Inner::Tx(tx),
            named: !pooled,
        })
    }

    /// A connection for reads: a transaction when pooled (see the module
    /// doc), a plain pooled connection otherwise. End it with
    /// [`commit`](Self::commit).
    pub(super) async fn read(pool: &PgPool, pooled: bool) -> Result<Self, sqlx::Error> {
        if pooled {
            return Self::begin(pool, true).await;
        }
        Ok(Self {
            inner: Inner::Conn(pool.acquire().await?),
            named: true,
        })
    }

    /// Commits the transaction (a plain connection goes back to the pool).
    pub(super) async fn commit(self) -> Result<(), sqlx::Error> {
        match self.inner {
            Inner::Tx(tx) => tx.commit().await,
            Inner::Conn(_) => Ok(()),
        }
    }

    /// Rolls the transaction back now, with its locks (a plain connection
    /// goes back to the pool). A rollback that fails leaves a broken
    /// connection, which the pool closes on its return, and the locks end
    /// with its session: nothing to answer.
    pub(super) async fn rollback(self) {
        if let Inner::Tx(tx) = self.inner {
            let _ = tx.rollback().await;
        }
    }

    /// The connection, for what is not a query (`COPY`).
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        match &mut self.inner {
            Inner::Tx(tx) => tx,
            Inner::Conn(conn) => conn,
        }
    }
}

/// A query passed on through a [`Tx`]: prepared as a named (cached)
/// statement only when the `Tx` allows it.
struct Statement<E> {
    query: E,
    named: bool,
}

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Statement<E> {
    fn sql(self) -> SqlStr {
        self.query.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.query.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        self.query.take_arguments()
    }

    fn persistent(&self) -> bool {
        self.named && self.query.persistent()
    }
}

/// Implements sqlx's `Executor` for `&mut $ty`, a type with a `conn()` and a
/// `named` flag: every query is passed on to the connection, named only when
/// the flag allows it.
macro_rules! passing_executor {
    (<$($life:lifetime),*> $ty:ty) => {
        impl<'c, $($life),*> Executor<'c> for &'c mut $ty {
            type Database = Postgres;

            fn fetch_many<'e, 'q: 'e, E>(
                self,
                query: E,
            ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
            where
                'c: 'e,
                E: 'q + Execute<'q, Postgres>,
            {
                let named = self.named;
                self.conn().fetch_many(Statement { query, named })
            }

            fn fetch_optional<'e, 'q: 'e, E>(
                self,
                query: E,
            ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
            where
                'c: 'e,
                E: 'q + Execute<'q, Postgres>,
            {
                let named = self.named;
                self.conn().fetch_optional(Statement { query, named })
            }

            fn prepare_with<'e>(
                self,
                sql: SqlStr,
                parameters: &'e [PgTypeInfo],
            ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
            where
                'c: 'e,
            {
                self.conn().prepare_with(sql, parameters)
            }

            // Required by sqlx's `offline` feature (on with its macros, which
            // drover's sqlx dependency always enables).
            fn describe<'e>(
                self,
                sql: SqlStr,
            ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
            where
                'c: 'e,
            {
                self.conn().describe(sql)
            }
        }
    };
}

passing_executor!(<> Tx);
passing_executor!(<'a> Passed<'a>);

/// A connection in the caller's own transaction
/// ([`item_enqueue_in`](super::PostgresStore::item_enqueue_in),
/// [`item_delete_in`](super::PostgresStore::item_delete_in)): drover's
/// statements on it follow the store's rule, unnamed through a pooler in
/// transaction mode, as a [`Tx`]'s are. Without it they were named, and the
/// pooler's next server for that client had no such statement.
#[derive(Debug)]
pub(crate) struct Passed<'a> {
    conn: &'a mut PgConnection,
    named: bool,
}

impl<'a> Passed<'a> {
    /// Wraps `conn` for a store that is (`pooled`) or is not reached
    /// through a pooler in transaction mode.
    pub(crate) fn new(conn: &'a mut PgConnection, pooled: bool) -> Self {
        Self {
            conn,
            named: !pooled,
        }
    }

    fn conn(&mut self) -> &mut PgConnection {
        self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::grouped::STALL;
    use std::time::Duration;

    /// The lock timeout a group steps aside at is the stall after which the
    /// next group starts beside it: one number.
    #[test]
    fn a_group_steps_aside_from_a_lock_after_the_stall() {
        let timeout = format!("SET LOCAL lock_timeout = '{}ms'", STALL.as_millis());
        assert!(STEPPING_ASIDE_BEGIN.ends_with(&timeout));
        assert!(POOLED_STEPPING_ASIDE_BEGIN.ends_with(&timeout));
        assert!(POOLED_STEPPING_ASIDE_BEGIN.starts_with(POOLED_BEGIN));
    }

    /// Run on the test server, both forms of the stepping-aside `BEGIN` give
    /// up a lock another connection holds with `lock_not_available` (a
    /// `Busy` the group's callers retry alone), where a plain transaction
    /// would wait for as long as the lock is held; the pooled form also
    /// carries the idle-in-transaction timeout a pooler cannot set at
    /// startup. The lock is an advisory one, so the test needs no table.
    #[tokio::test]
    async fn both_stepping_aside_begins_give_up_a_held_lock_on_the_server() {
        const ENV: &str = "DROVER_TEST_POSTGRES_URL";
        let Ok(url) = std::env::var(ENV) else {
            eprintln!("skipping: {ENV} is not set");
            return;
        };
        let pool = PgPool::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{ENV} is set but unreachable: {e}"));
        let mut holder = pool.acquire().await.expect("a connection");
        let key = (i64::from(std::process::id()) << 20) | 0x5_7A11;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .expect("the holder takes the lock");
        for pooled in [false, true] {
            let mut tx = Tx::begin_stepping_aside(&pool, pooled)
                .await
                .expect("begin");
            let waited = sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(key)
                .execute(&mut tx);
            let err = tokio::time::timeout(Duration::from_secs(30), waited)
                .await
                .unwrap_or_else(|_| panic!("pooled {pooled}: still waiting for the lock"))
                .expect_err("the lock is held elsewhere");
            let code = err.as_database_error().and_then(|e| e.code());
            assert_eq!(code.as_deref(), Some("55P03"), "pooled {pooled}: {err}");
            drop(tx);
            if pooled {
                let mut tx = Tx::begin_stepping_aside(&pool, true).await.expect("begin");
                let shown: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
                    .fetch_one(&mut tx)
                    .await
                    .expect("show");
                assert_eq!(shown, "5s");
                tx.commit().await.expect("commit");
            }
        }
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .expect("the holder lets the lock go");
        drop(holder);
        pool.close().await;
    }
}
