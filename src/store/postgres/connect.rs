//! Opening a PostgreSQL database: a bounded connect, the migrations.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, Executor as _, PgConnection, PgPool};

use super::engine::PostgresStore;
use super::error::{Db as _, commit, map};
use super::failover::Failover;
use super::hosts;
use super::lineage;
use crate::store::url::{PoolMode, pool_mode, redact_url as redact};
use crate::store::{StoreError, StoreOptions, migrate};

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

/// Parses a URL (its hosts, `target_session_attrs` and `pool_mode`) into one
/// set of connect options per host. Through a pooler in transaction mode
/// nothing is set at startup that the pooler would refuse (`options`,
/// `extra_float_digits`): the timeout is set per transaction. Connections
/// name themselves `app_name` unless the URL names them.
fn connect_options(url: &str, app_name: &str) -> Result<(Arc<Failover>, PoolMode), StoreError> {
    let shown = redact(url);
    let invalid = |reason: String| StoreError::InvalidUrl {
        url: shown.clone(),
        reason,
    };
    let (url, mode) = pool_mode(url).map_err(invalid)?;
    let split = hosts::split(&url).map_err(invalid)?;
    let mut hosts = Vec::with_capacity(split.hosts.len());
    for (name, url) in split.hosts {
        let mut options = PgConnectOptions::from_str(&url).map_err(|e| invalid(e.to_string()))?;
        if options.get_application_name().is_none() {
            options = options.application_name(app_name);
        }
        let options = match mode {
            // READ COMMITTED whatever the database's or role's default: a
            // limited claim locks its process row, then counts the running
            // keys in a later statement, which must see every claim that
            // committed while it waited (under REPEATABLE READ it would
            // count from its snapshot of before the wait, and over-admit).
            PoolMode::Session => options.options([
                ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION),
                ("default_transaction_isolation", "read committed"),
            ]),
            PoolMode::Transaction => options.extra_float_digits(None),
        };
        hosts.push((name, options));
    }
    Ok((Failover::new(hosts, split.target), mode))
}

impl PostgresStore {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST[:PORT][,HOST[:PORT]…]/DB[?options=…]`)
    /// and checks or applies the migrations. With several hosts (libpq's
    /// form) they are tried in order and the first whose sessions can write
    /// is kept (`target_session_attrs`: `read-write` by default, `primary`
    /// or `any`); after a failover the store moves to whichever host then
    /// fits. An unreachable server or a refused login fails within the
    /// connect timeout, never hangs.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let shown = redact(url);
        let (failover, mode) = connect_options(url, &options.application_name)?;
        let first = probe(&failover, &shown, options.connect_timeout).await?;
        let pool = failover
            .pool_options()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout.max(ACQUIRE_TIMEOUT))
            .connect_lazy_with(failover.options());
        let pooled = mode == PoolMode::Transaction;
        let listen = match (&options.listen_url, pooled) {
            (_, false) => Some(pool.clone()),
            (Some(listen), true) => Some(listen_pool(listen, &options.application_name)?),
            (None, true) => None,
        };
        let store = Self {
            pool,
            clock: failover.clock().clone(),
            statistics: Arc::default(),
            claims: Arc::default(),
            completions: Arc::default(),
            folds: Arc::default(),
            listener: Arc::default(),
            pooled,
            listen,
            failover,
            at: Arc::new(AtomicUsize::new(first)),
            gated: Arc::default(),
            caller_begin: format!(
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
                options.caller_idle_timeout.as_millis()
            )
            .into(),
            steps_aside: false,
        };
        store.migrate_or_check(options.migrate).await?;
        // The connections opened so far may predate the migration that
        // records the server's identity: record it now (see `lineage`).
        let mut tx = store.read().await?;
        lineage::observe(&mut tx, store.clock.offset_ms())
            .await
            .db()?;
        commit(tx).await?;
        Ok(store)
    }

    /// Applies any migrations this binary has and the database lacks. Safe when
    /// several nodes run it at once: PostgreSQL serialises them on an advisory lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_or_check(true).await
    }

    async fn migrate_or_check(&self, migrating: bool) -> Result<(), StoreError> {
        if self.pooled {
            migrate_pooled(&self.failover.options(), migrating).await
        } else {
            migrate_pool(&self.pool, migrating).await
        }
    }
}

/// A pool of one direct connection for `LISTEN`, connected when first used.
fn listen_pool(url: &str, name: &str) -> Result<PgPool, StoreError> {
    let (failover, mode) = connect_options(url, name)?;
    if mode == PoolMode::Transaction {
        return Err(StoreError::InvalidUrl {
            url: redact(url),
            reason: "the LISTEN URL must reach PostgreSQL directly (or through a pooler in \
                     session mode), not with pool_mode=transaction"
                .into(),
        });
    }
    Ok(failover
        .pool_options()
        .max_connections(1)
        .connect_lazy_with(failover.options()))
}

/// Finds the host to connect to, opening and closing one connection, so a
/// refused connection or login is reported at once with the server's reason
/// (a pool would keep retrying until its timeout) and a silent server within
/// `timeout`. Returns the host's index.
async fn probe(failover: &Failover, shown: &str, timeout: Duration) -> Result<usize, StoreError> {
    if failover.hosts() == 1 {
        let conn = tokio::time::timeout(timeout, PgConnection::connect_with(&failover.options()))
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
        return Ok(0);
    }
    failover
        .find(timeout)
        .await
        .map_err(|why| StoreError::Connect {
            url: shown.to_owned(),
            source: sqlx::Error::Protocol(why).into(),
        })
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
