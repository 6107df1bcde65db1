//! Opening a SQLite database: WAL, a busy timeout, the migrations, and one
//! writer connection. Every connection syncs the WAL at each commit
//! (`synchronous=FULL`) unless [`StoreOptions::durable`] is off: in WAL mode
//! `NORMAL` may lose the last acknowledged commits on a power loss.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions as _, SqlitePool};

use super::checkpoint::Checkpoints;
use super::engine::SqliteStore;
use super::error::{locked, map};
use super::turns::Turns;
use super::writer::Writer;
use crate::store::{Clock, StoreError, StoreOptions, migrate};

/// How long a writer waits for another connection's write lock before the
/// operation fails with [`StoreError::Busy`]. Generous: writes are short, and
/// waiting beats surfacing "database is locked" to a worker.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Each connection's page cache, in KiB (SQLite's negative form): 8 MiB, four
/// times SQLite's default, and no more. A commit that followed a b-tree
/// rebalance (most of drover's: random inserts into the runs' key index)
/// walks the connection's whole page cache, because the rebalance parked a
/// page at a number past the end of the file (`balance_nonroot` swaps page
/// numbers through the page after the lock byte) and the commit drops every
/// cached page past the end; the walk touches each cached page's header, so
/// it costs in proportion to the cache. At 64 MiB it was 12 % of a burn-down's
/// samples (`perf`); at 8 MiB a burn-down drained a median 9 % faster in five
/// alternating rounds and enqueues ran 60–110 % faster in two (session 17,
/// `docs/performance.md`). A small cache costs little
/// here: reads of the file go through the memory map ([`MMAP_SIZE`]), not the
/// page cache, which holds the pages being written and those read back from
/// the WAL.
const CACHE_SIZE: &str = "-8192";

/// The page size of a new database file, in bytes: twice SQLite's default.
/// A claim or a completion touches several indexes at scattered places, and
/// with larger pages fewer of them split and fewer are written to the WAL per
/// key (a bare loop over drover's statements drained 8 % faster at 8 KiB; 16 KiB
/// gained nothing more). An existing file keeps the size it was created with.
const PAGE_SIZE: u32 = 8192;

/// Reads through a memory map of up to 1 GiB: pages are read in place instead
/// of copied out of the OS cache for every statement.
const MMAP_SIZE: &str = "1073741824";

/// The WAL size (in pages) at which the writer checkpoints in its own commit:
/// ten times SQLite's default, as a backstop. The background task
/// ([`Checkpoints`]) copies frames as they come, but under a steady stream of
/// writes it never finds the WAL quiet, so only a checkpoint on the writer —
/// quick, the copying is mostly done — lets the WAL start over from its
/// beginning instead of growing for as long as the load lasts.
const WRITER_CHECKPOINT_PAGES: &str = "10000";

/// Where the writer keeps what a statement may have to undo: in memory. A
/// statement that changes many rows inside a transaction (a claim's or a
/// completion's batch of a thousand) copies the pages it changes again, those
/// already changed earlier in the transaction, into a statement journal, which
/// SQLite spills past 64 KiB into a temporary file: a file made and removed
/// per transaction and a `pwrite` per page (12,900 in a burn-down of 100,000
/// keys, 176 with this). The journal holds at most the transaction's own
/// pages, and the writer's transactions are batches; reads, which may sort or
/// build temporary indexes without bound, keep SQLite's default (files).
const WRITER_TEMP_STORE: &str = "memory";

/// After a checkpoint lets it start over, the WAL file is cut back to this many
/// bytes, so a burst does not hold its disk space for good.
const JOURNAL_SIZE_LIMIT: &str = "67108864";

/// How many result rows sqlx's connection thread may hand over before it
/// waits for the task reading them. With sqlx's default of 50, a claim or a
/// completion of a thousand leases parked and woke the connection thread twenty
/// times per statement, and that thread is the one every write waits for; a
/// batch's rows now fit at once.
const ROW_BUFFER_SIZE: usize = 4096;

impl SqliteStore {
    /// Opens (creating if missing) the SQLite database at `url` (`sqlite://PATH`,
    /// `sqlite:///ABSOLUTE/PATH` or `sqlite::memory:`) and checks or applies the
    /// migrations. An in-memory database lives as long as this store and uses one
    /// connection.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl {
                url: url.to_owned(),
                reason: e.to_string(),
            })?
            .create_if_missing(true)
            .page_size(PAGE_SIZE)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(if options.durable {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            })
            .busy_timeout(BUSY_TIMEOUT)
            .pragma("cache_size", CACHE_SIZE)
            .pragma("mmap_size", MMAP_SIZE)
            .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT)
            .row_buffer_size(ROW_BUFFER_SIZE);
        let name = options.application_name.clone();
        let writer_name = format!("{name}-w");
        let writer_thread = move |_| writer_name.clone();
        unsafe_parameters(url)?;
        let memory = is_in_memory(url);
        if !memory {
            no_file(url, connect.get_filename())?;
            missing_directory(url, connect.get_filename())?;
        }
        if memory {
            let one = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
            let connect = connect.thread_name(writer_thread);
            let opening = while_locked(|| one.clone().connect_with(connect.clone()));
            let pool = within(url, options, opening).await?;
            migrate_pool(&pool, options.migrate).await?;
            return Ok(Self {
                writer: Writer::Pooled(pool.clone()),
                claims: Arc::default(),
                completions: Arc::default(),
                pool,
                _checkpoints: None,
                clock: Clock::default(),
                enqueue_through_view: options.sqlite_enqueue_through_view,
            });
        }
        let readers = SqlitePoolOptions::new().max_connections(options.max_connections);
        let connect = connect.thread_name(move |id| format!("{name}-r{id}"));
        let opening = while_locked(|| readers.clone().connect_with(connect.clone()));
        let pool = within(url, options, opening).await?;
        migrate_pool(&pool, options.migrate).await?;
        let turns = Turns::open(&main_file(&pool, connect.get_filename()).await);
        let writer = connect
            .pragma("wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)
            .pragma("temp_store", WRITER_TEMP_STORE)
            .thread_name(writer_thread);
        let writer = within(url, options, while_locked(|| writer.connect())).await?;
        Ok(Self {
            _checkpoints: Some(Checkpoints::start(pool.clone())),
            pool,
            writer: Writer::held(writer, turns),
            claims: Arc::default(),
            completions: Arc::default(),
            clock: Clock::default(),
            enqueue_through_view: options.sqlite_enqueue_through_view,
        })
    }

    /// Applies any migrations this binary has and the database lacks.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate_pool(&self.pool, true).await
    }
}

/// The main database's file as SQLite opened it: the URL's file name may be
/// a URI (`sqlite:file:drover.db`), which only SQLite reads the path out of,
/// so the writers' lock file of every process on one database is found by one
/// name. `named` (the URL's) if SQLite does not say.
async fn main_file(pool: &SqlitePool, named: &std::path::Path) -> std::path::PathBuf {
    let file: Result<String, _> =
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_one(pool)
            .await;
    match file {
        Ok(file) if !file.is_empty() => file.into(),
        _ => named.to_owned(),
    }
}

/// Refuses a URL that names no file (`sqlite://` with an unset variable
/// after it): SQLite would give each connection a private temporary
/// database, so the migrations landed on one and the writer found no tables.
fn no_file(url: &str, file: &std::path::Path) -> Result<(), StoreError> {
    if file.as_os_str().is_empty() {
        return Err(StoreError::InvalidUrl {
            url: url.to_owned(),
            reason: "it names no file: give a path (sqlite://drover.db), or sqlite::memory:".into(),
        });
    }
    Ok(())
}

/// The URL parameters that turn SQLite's file locking off or claim nothing
/// else writes the file: with them, several processes on one file corrupted
/// it within seconds (another VFS, `unix-none`, takes no locks).
const UNSAFE_PARAMETERS: [&str; 3] = ["vfs", "immutable", "nolock"];

/// Refuses a URL carrying one of [`UNSAFE_PARAMETERS`], by name as SQLite
/// reads it (percent-decoded: `%76fs` is `vfs`).
fn unsafe_parameters(url: &str) -> Result<(), StoreError> {
    for (name, _) in parameters(url) {
        if UNSAFE_PARAMETERS.contains(&name.as_ref()) {
            return Err(StoreError::InvalidUrl {
                url: url.to_owned(),
                reason: format!(
                    "`{name}` turns SQLite's locking off or says no one else writes the file, \
                     which corrupts a store that several processes share: remove it"
                ),
            });
        }
    }
    Ok(())
}

/// The URL's query parameters, decoded as sqlx decodes them.
fn parameters(url: &str) -> form_urlencoded::Parse<'_> {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    form_urlencoded::parse(query.as_bytes())
}

/// Whether `url` names an in-memory SQLite database (`sqlite::memory:`,
/// or `mode=memory` however it is spelt), which lives only as long as the
/// store that opened it.
#[must_use]
pub fn is_in_memory(url: &str) -> bool {
    let path = url.split_once('?').map_or(url, |(path, _)| path);
    path.ends_with(":memory:")
        || parameters(url).any(|(name, value)| name == "mode" && value == "memory")
}

/// Refuses a file whose directory does not exist, which SQLite reports only
/// as "unable to open database file": drover creates the file, not the
/// directories above it.
fn missing_directory(url: &str, file: &std::path::Path) -> Result<(), StoreError> {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => Err(StoreError::InvalidUrl {
            url: url.to_owned(),
            reason: format!(
                "the directory {} does not exist: create it, or give a file in one that does",
                dir.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// Waits for `opening` (a pool or a connection) at most the caller's connect
/// timeout.
async fn within<T>(
    url: &str,
    options: &StoreOptions,
    opening: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(options.connect_timeout, opening)
        .await
        .map_err(|_| StoreError::ConnectTimeout {
            url: url.to_owned(),
            timeout: options.connect_timeout,
        })?
        .map_err(|source| StoreError::Connect {
            url: url.to_owned(),
            source: source.into(),
        })
}

/// Opens (a pool or a connection, with `open`) again and again while the file
/// is locked (the caller's connect timeout bounds it).
///
/// Switching a file to WAL takes SQLite's exclusive lock without waiting in
/// the busy handler, so nodes that open one fresh file at once get "database
/// is locked" from `PRAGMA journal_mode = WAL` however long the busy timeout
/// (four connections at once: 14 rounds of 200 in a Python loop). Once the
/// file is in WAL mode the pragma takes no lock, so an attempt a moment later
/// goes through.
async fn while_locked<T, F, Opening>(mut open: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Opening,
    Opening: Future<Output = Result<T, sqlx::Error>>,
{
    let mut pause = Duration::from_millis(5);
    loop {
        match open().await {
            Err(e) if locked(&e) => {
                tracing::debug!(error = %e, "the database file is locked; opening it again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            opened => return opened,
        }
    }
}

/// Checks the schema version and applies missing migrations, all inside one
/// `BEGIN IMMEDIATE` transaction: SQLite has no migration lock of its own, so
/// holding the write lock is what lets several processes start on a fresh file
/// at once (the others wait on the busy timeout, then find the work done).
/// Watches made before migration 17 get their `OR REPLACE` triggers in the
/// same transaction, which SQL alone cannot write.
///
/// A plain read comes first: with nothing to migrate the store opens without
/// the write lock, which in WAL mode a read never waits for. Before, every
/// open (a `drover status` too) waited for any other process's write
/// transaction on the file, and failed "busy" after the busy timeout.
async fn migrate_pool(pool: &SqlitePool, migrating: bool) -> Result<(), StoreError> {
    let migrator = migrate::sqlite();
    let current: Option<i64> =
        sqlx::query_scalar("SELECT MAX(version) FROM drover_migrations WHERE success")
            .fetch_one(pool)
            .await
            .unwrap_or(None);
    if current == Some(migrate::supported(&migrator)) {
        return Ok(());
    }
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map)?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT MAX(version) FROM drover_migrations WHERE success")
            .fetch_one(&mut *tx)
            .await
            .unwrap_or(None);
    migrate::check_version(found.unwrap_or(0), &migrator, migrating)?;
    if migrating {
        // `run_direct` is sqlx's documented way around `run`'s "Acquire is not
        // general enough" error for a borrowed connection inside a transaction.
        migrator
            .run_direct(None, &mut *tx, false)
            .await
            .map_err(|e| migrate::map_error(e, &migrator))?;
        if found.unwrap_or(0) < super::watch::REPLACE_SEEN_FROM {
            super::watch::upgrade(&mut tx).await?;
        }
        if found.unwrap_or(0) < super::watch::BINARY_FROM {
            super::watch::compare_as_written(&mut tx).await?;
        }
    }
    tx.commit().await.map_err(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `PRAGMA name` on a connection of `pool`.
    async fn pragma(pool: &SqlitePool, name: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
            .fetch_one(pool)
            .await
            .expect("a PRAGMA")
    }

    /// The value of `PRAGMA name` on the store's write connection.
    async fn writer_pragma(store: &SqliteStore, name: &str) -> i64 {
        let mut tx = store.writer.begin().await.expect("a write transaction");
        let value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
            .fetch_one(&mut *tx)
            .await
            .expect("a PRAGMA");
        tx.rollback().await.expect("rollback");
        value
    }

    /// A store on a fresh file with default options, and the file's URL.
    async fn file_store() -> (tempfile::TempDir, String, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("d.db").display());
        let store = SqliteStore::connect(&url, &StoreOptions::default())
            .await
            .expect("connect");
        (dir, url, store)
    }

    #[tokio::test]
    async fn the_writer_and_the_readers_sync_every_commit_unless_asked_not_to() {
        let (_dir, url, store) = file_store().await;
        // 2 = FULL, 1 = NORMAL.
        assert_eq!(writer_pragma(&store, "synchronous").await, 2);
        assert_eq!(pragma(&store.pool, "synchronous").await, 2);
        store.close().await;
        let fast = StoreOptions::default().durable(false);
        let store = SqliteStore::connect(&url, &fast).await.expect("connect");
        assert_eq!(writer_pragma(&store, "synchronous").await, 1);
        assert_eq!(pragma(&store.pool, "synchronous").await, 1);
    }

    #[tokio::test]
    async fn every_connection_keeps_a_page_cache_of_eight_mebibytes() {
        let (_dir, _url, store) = file_store().await;
        assert_eq!(writer_pragma(&store, "cache_size").await, -8192);
        assert_eq!(pragma(&store.pool, "cache_size").await, -8192);
    }

    #[tokio::test]
    async fn only_the_writer_keeps_its_statement_journals_in_memory() {
        let (_dir, _url, store) = file_store().await;
        // 2 = MEMORY, 0 = SQLite's default (files, unless built otherwise).
        assert_eq!(writer_pragma(&store, "temp_store").await, 2);
        assert_eq!(pragma(&store.pool, "temp_store").await, 0);
    }
}
