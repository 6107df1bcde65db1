//! Opening a PostgreSQL database: a bounded connect, the migrations.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, Executor as _, PgConnection, PgPool};

use super::engine::PostgresStore;
use super::error::{Db as _, map};
use crate::store::url::{PoolMode, pool_mode, redact_url as redact};
use crate::store::{Clock, StoreError, StoreOptions, migrate};

/// How long an operation waits for a free pooled connection once connected.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the server keeps a drover transaction open while its client sends
/// nothing: drover's transactions send their statements back to back, so a
/// silence this long means the client is cut off or frozen mid-transaction, and
/// its row locks (a session's, a key's) would otherwise block every other
/// node's reclaim until the server noticed the dead link — with default TCP
/// keepalives, hours; through a proxy that keeps the socket open, never.
pub(super) const IDLE_IN_TRANSACTION: &str = "5s";

/// The advisory lock (transaction-scoped, so a pooler cannot strand it on a
/// server) that serialises migrations through a pooler: `hashtext` of
/// `drover_migrations`, any fixed number would do.
const MIGRATE_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('drover_migrations'))";

/// Parses a URL (and its `pool_mode`) into connect options. Through a pooler
/// in transaction mode nothing is set at startup that the pooler would refuse
/// (`options`, `extra_float_digits`): the timeout is set per transaction.
fn connect_options(url: &str) -> Result<(PgConnectOptions, PoolMode), StoreError> {
    let shown = redact(url);
    let invalid = |reason: String| StoreError::InvalidUrl {
        url: shown.clone(),
        reason,
    };
    let (url, mode) = pool_mode(url).map_err(invalid)?;
    let options = PgConnectOptions::from_str(&url).map_err(|e| invalid(e.to_string()))?;
    let options = match mode {
        PoolMode::Session => {
            options.options([("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION)])
        }
        PoolMode::Transaction => options.extra_float_digits(None),
    };
    Ok((options, mode))
}

impl PostgresStore {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?options=…]`)
    /// and checks or applies the migrations. An unreachable server or a refused
    /// login fails within the connect timeout, never hangs.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let shown = redact(url);
        let (connect, mode) = connect_options(url)?;
        probe(&connect, &shown, options.connect_timeout).await?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout.max(ACQUIRE_TIMEOUT))
            .connect_lazy_with(connect.clone());
        let pooled = mode == PoolMode::Transaction;
        let listen = match (&options.listen_url, pooled) {
            (_, false) => Some(pool.clone()),
            (Some(listen), true) => Some(listen_pool(listen)?),
            (None, true) => None,
        };
        let store = Self {
            pool,
            clock: Clock::default(),
            statistics: Arc::default(),
            listener: Arc::default(),
            pooled,
            listen,
            connect: Arc::new(connect),
            gated: Arc::default(),
        };
        store.migrate_or_check(options.migrate).await?;
        Ok(store)
    }

    /// Applies any migrations this binary has and the database lacks. Safe when
    /// several nodes run it at once: PostgreSQL serialises them on an advisory lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_or_check(true).await
    }

    async fn migrate_or_check(&self, migrating: bool) -> Result<(), StoreError> {
        if self.pooled {
            migrate_pooled(&self.connect, migrating).await
        } else {
            migrate_pool(&self.pool, migrating).await
        }
    }
}

/// A pool of one direct connection for `LISTEN`, connected when first used.
fn listen_pool(url: &str) -> Result<PgPool, StoreError> {
    let (connect, mode) = connect_options(url)?;
    if mode == PoolMode::Transaction {
        return Err(StoreError::InvalidUrl {
            url: redact(url),
            reason: "the LISTEN URL must reach PostgreSQL directly (or through a pooler in \
                     session mode), not with pool_mode=transaction"
                .into(),
        });
    }
    Ok(PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(connect))
}

/// Opens and closes one connection, so a refused connection or login is reported
/// at once with the server's reason (a pool would keep retrying until its
/// timeout) and a silent server within `timeout`.
async fn probe(
    connect: &PgConnectOptions,
    shown: &str,
    timeout: Duration,
) -> Result<(), StoreError> {
    let conn = tokio::time::timeout(timeout, PgConnection::connect_with(connect))
        .await
        .map_err(|_| StoreError::ConnectTimeout {
            url: shown.to_owned(),
            timeout,
        })?
        .map_err(|e| StoreError::Connect {
            url: shown.to_owned(),
            source: e.into(),
        })?;
    conn.close().await.ok();
    Ok(())
}

/// Checks or applies the migrations through a pooler in transaction mode:
/// sqlx's migrator names its statements and takes a session-level advisory
/// lock, which a pooler would leave on whichever server ran them. So it runs
/// inside one transaction on a connection of its own (the pooler keeps one
/// server for it), under a transaction-scoped lock, and drops its named
/// statements (`DEALLOCATE ALL`) before it commits; the connection is then
/// closed, with the client-side cache that named them. On an error the
/// connection is dropped mid-transaction, and the pooler discards that server.
async fn migrate_pooled(connect: &PgConnectOptions, migrating: bool) -> Result<(), StoreError> {
    let mut migrator = migrate::postgres();
    migrator.set_locking(false);
    let mut conn = PgConnection::connect_with(connect).await.db()?;
    // sqlx's own transaction, so the migrator's transactions nest in it as
    // savepoints instead of committing it.
    let mut tx = conn.begin().await.db()?;
    tx.execute(MIGRATE_LOCK).await.db()?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('drover_migrations') IS NOT NULL")
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .db()?;
    let found: i64 = if exists {
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM drover_migrations WHERE success")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .db()?
    } else {
        0
    };
    migrate::check_version(found, &migrator, migrating)?;
    if migrating {
        migrator
            .run_direct(None, &mut *tx, false)
            .await
            .map_err(|e| migrate::map_error(e, &migrator))?;
    }
    tx.execute("DEALLOCATE ALL").await.db()?;
    tx.commit().await.map_err(map)?;
    conn.close().await.ok();
    Ok(())
}

async fn migrate_pool(pool: &PgPool, migrating: bool) -> Result<(), StoreError> {
    let migrator = migrate::postgres();
    let found: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM drover_migrations WHERE success")
            .fetch_one(pool)
            .await
            .unwrap_or(0);
    migrate::check_version(found, &migrator, migrating)?;
    if migrating {
        migrator
            .run(pool)
            .await
            .map_err(|e| migrate::map_error(e, &migrator))?;
    }
    Ok(())
}
