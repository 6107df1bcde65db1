//! Opening a PostgreSQL database: a bounded connect, the migrations.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use super::engine::PostgresStore;
use crate::store::url::redact_url as redact;
use crate::store::{Clock, StoreError, StoreOptions, migrate};

/// How long an operation waits for a free pooled connection once connected.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the server keeps a drover transaction open while its client sends
/// nothing: drover's transactions send their statements back to back, so a
/// silence this long means the client is cut off or frozen mid-transaction, and
/// its row locks (a session's, a key's) would otherwise block every other
/// node's reclaim until the server noticed the dead link — with default TCP
/// keepalives, hours; through a proxy that keeps the socket open, never.
const IDLE_IN_TRANSACTION: &str = "5s";

impl PostgresStore {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?options=…]`)
    /// and checks or applies the migrations. An unreachable server or a refused
    /// login fails within the connect timeout, never hangs.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let shown = redact(url);
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl {
                url: shown.clone(),
                reason: e.to_string(),
            })?
            .options([("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION)]);
        probe(&connect, &shown, options.connect_timeout).await?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout.max(ACQUIRE_TIMEOUT))
            .connect_lazy_with(connect);
        migrate_pool(&pool, options.migrate).await?;
        Ok(Self {
            pool,
            clock: Clock::default(),
            statistics: Arc::default(),
            listener: Arc::default(),
        })
    }

    /// Applies any migrations this binary has and the database lacks. Safe when
    /// several nodes run it at once: PostgreSQL serialises them on an advisory lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate_pool(&self.pool, true).await
    }
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
