//! Shared test support: fresh databases on every engine.
//!
//! [`each_engine`] runs a test body once per engine: SQLite (a fresh file in a
//! temporary directory) always, PostgreSQL (a fresh schema, dropped afterwards)
//! when `DROVER_TEST_POSTGRES_URL` is set. When it is set the PostgreSQL run is
//! required: an unreachable database fails the test loudly.
//! [`each_engine_and_pooler`] adds a third run through a PgBouncer in
//! transaction pooling mode when `DROVER_TEST_PGBOUNCER_URL` is set (a fresh
//! database each, reached with `?pool_mode=transaction`).
//! [`each_enqueue_path`] and [`each_enqueue_path_and_pooler`] add one more
//! SQLite run whose store enqueues through the view `drover_enqueue` rather
//! than its own set-based upsert, for the suites that judge enqueues.

#![allow(dead_code)] // each test binary uses a different part of this module

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use drover::store::{Session, SessionStart, Store, StoreEngine as _, StoreOptions};

pub(crate) mod backend;
pub(crate) mod caller_tx;
pub(crate) mod claim_hook;
pub(crate) mod cli;
pub(crate) mod commit_cut;
pub(crate) mod fault_proxy;
pub(crate) mod ha;
pub(crate) mod locks;
pub(crate) mod partition;
pub(crate) mod pool_lint;
pub(crate) mod process;
pub(crate) mod running;
pub(crate) mod serve;
pub(crate) mod store;
pub(crate) mod ticks;
pub(crate) mod wakeups;

use backend::TestBackend;

/// The variable naming the PostgreSQL server for tests.
pub(crate) const POSTGRES_ENV: &str = "DROVER_TEST_POSTGRES_URL";

/// The variable naming a PgBouncer in transaction pooling mode in front of
/// that server (`postgres://USER@HOST:PORT/ANY`; the database name is
/// replaced by each test's own).
pub(crate) const PGBOUNCER_ENV: &str = "DROVER_TEST_PGBOUNCER_URL";

/// One fresh, isolated database.
#[derive(Debug)]
pub(crate) struct TestDb {
    /// A connected, migrated store.
    pub(crate) store: Store,
    /// The URL that reaches this database (and only it): pass it to the CLI.
    pub(crate) url: String,
    /// A URL for the test's own SQL through sqlx (its named statements, its
    /// session): [`url`](Self::url), or the server directly when `url` goes
    /// through a transaction-pooling PgBouncer.
    pub(crate) sql_url: String,
    /// `sqlite` or `postgres`.
    pub(crate) engine: &'static str,
    /// How [`store`](Self::store) was connected, for [`reconnect`](Self::reconnect).
    pub(crate) options: StoreOptions,
    /// The name its connections carry ([`StoreOptions::application_name`]),
    /// unique in this test process on SQLite, where it names the threads
    /// that [`locks::Blocker`] watches for a writer waiting.
    pub(crate) name: String,
    /// Where controllers under test work: [`store`](Self::store) itself, or a
    /// server in front of it (see [`each_backend`]), which lives as long as
    /// this value does.
    pub(crate) worker: TestBackend,
}

impl TestDb {
    fn new(store: Store, url: String, engine: &'static str) -> Self {
        Self {
            worker: TestBackend::Store(store.clone()),
            store,
            sql_url: url.clone(),
            url,
            engine,
            options: StoreOptions::default(),
            name: "drover".to_owned(),
        }
    }

    /// Records how the store was connected: `options`, naming it `name`.
    fn with_options(mut self, options: StoreOptions, name: String) -> Self {
        self.options = options;
        self.name = name;
        self
    }

    /// The name of the thread that runs a SQLite store's write connection
    /// (all of this database's stores share it).
    pub(crate) fn sqlite_writer_thread(&self) -> String {
        format!("{}-w", self.name)
    }

    /// The same database with its controllers working through a server
    /// started in front of it (which lives as long as the returned value).
    pub(crate) fn served(mut self) -> Self {
        self.worker = backend::served(&self.store);
        self
    }

    /// [`served`](Self::served), through a server that never polls while a
    /// claim waits (see [`backend::served_unpolled`]): for the tests of
    /// wake-ups.
    pub(crate) fn served_unpolled(mut self) -> Self {
        self.worker = backend::served_unpolled(&self.store);
        self
    }

    /// A second, independent connection to the same database (a "restart").
    pub(crate) async fn reconnect(&self) -> Store {
        Store::connect_with(&self.url, &self.options)
            .await
            .expect("reconnect")
    }

    /// Runs one SQL statement on this database through a connection of its
    /// own (test set-up the store has no operation for).
    pub(crate) async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        if self.engine == "postgres" {
            let pool = sqlx::PgPool::connect(&self.sql_url).await.expect("connect");
            sqlx::query(sql).execute(&pool).await.expect("execute");
            pool.close().await;
        } else {
            let pool = sqlx::SqlitePool::connect(&self.sql_url)
                .await
                .expect("connect");
            sqlx::query(sql).execute(&pool).await.expect("execute");
            pool.close().await;
        }
    }

    /// Starts a session with a 30 s TTL.
    pub(crate) async fn session(&self) -> Session {
        self.store
            .session_start(SessionStart::new(
                "test",
                std::time::Duration::from_secs(30),
            ))
            .await
            .expect("session_start")
    }
}

/// A fresh SQLite database in its own temporary directory, which lives as long as
/// the returned guard.
pub(crate) async fn sqlite() -> (TestDb, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("drover.db").display());
    let (options, name) = named(StoreOptions::default());
    let store = Store::connect_with(&url, &options)
        .await
        .expect("connect to SQLite");
    let db = TestDb::new(store, url, "sqlite").with_options(options, name);
    (db, dir)
}

/// `options` with an application name no other store of this test process
/// has (and the name): it names a SQLite store's connection threads.
fn named(options: StoreOptions) -> (StoreOptions, String) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("t{n}");
    (options.application_name(name.clone()), name)
}

/// A fresh SQLite database as [`sqlite`] makes, whose store enqueues through
/// the view `drover_enqueue` (one trigger run per key, as other programs and
/// watched tables do) instead of its set-based upsert.
pub(crate) async fn sqlite_through_view() -> (TestDb, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("drover.db").display());
    let (options, name) = named(StoreOptions::default().sqlite_enqueue_through_view(true));
    let store = Store::connect_with(&url, &options)
        .await
        .expect("connect to SQLite");
    let db = TestDb::new(store, url, "sqlite").with_options(options, name);
    (db, dir)
}

/// Runs `test` on a fresh SQLite database whose store enqueues through the
/// view (see [`sqlite_through_view`]).
async fn through_view<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (db, dir) = sqlite_through_view().await;
    let outcome = tokio::spawn(test(db)).await;
    drop(dir);
    if let Err(e) = outcome {
        panic!("on sqlite through the view drover_enqueue: {e}");
    }
}

/// Runs `test` as [`each_engine`] does, then once more on SQLite with the
/// store's enqueue going through the view `drover_enqueue`: the suites that
/// judge enqueues hold the set-based upsert and the view to the same rules.
pub(crate) async fn each_enqueue_path<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    each_engine(&test).await;
    through_view(&test).await;
}

/// [`each_engine_and_pooler`], then the SQLite run through the view that
/// [`each_enqueue_path`] adds.
pub(crate) async fn each_enqueue_path_and_pooler<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    each_engine_and_pooler(&test).await;
    through_view(&test).await;
}

/// The PostgreSQL base URL, or `None` (with a printed reason) when unset.
pub(crate) fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("skipping the PostgreSQL half: {POSTGRES_ENV} is not set");
            None
        }
    }
}

/// A name no other test of any run uses: `{prefix}_{pid}_{n}_{random}`.
fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}_{:08x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        rand::random::<u32>()
    )
}

/// A process name no other test of any run uses (`{prefix}_{pid}_{n}_{random}`):
/// for the tests of wake-ups and notifications, which a neighbour enqueueing
/// to the same name could otherwise satisfy (a wake-up in this process, and
/// PostgreSQL's channels, go by process name, not by database or schema).
pub(crate) fn process_name(prefix: &str) -> String {
    unique_name(prefix)
}

/// Runs one administrative statement on the server at `url` through a
/// connection of its own; panics, naming the variable, if it is unreachable.
pub(crate) async fn admin_execute(url: &str, sql: &str) {
    let admin = sqlx::PgPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV}={url} is set but unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    admin.close().await;
}

/// A fresh, empty schema on the PostgreSQL server at `base` and a URL whose
/// connections work in it; panics if the server is unreachable.
pub(crate) async fn postgres_schema(base: &str) -> (String, String) {
    let schema = unique_name("drover_test");
    admin_execute(base, &format!("CREATE SCHEMA {schema}")).await;
    let sep = if base.contains('?') { '&' } else { '?' };
    (
        format!("{base}{sep}options=-c%20search_path%3D{schema}"),
        schema,
    )
}

/// A fresh schema on the PostgreSQL server at `base`; panics if it is unreachable.
pub(crate) async fn postgres(base: &str) -> (TestDb, String) {
    postgres_with(base, "").await
}

/// [`postgres`], with `settings` added to the startup options of its URL:
/// more `-c name=value`, URL-encoded, each starting with `%20`.
pub(crate) async fn postgres_with(base: &str, settings: &str) -> (TestDb, String) {
    let (url, schema) = postgres_schema(base).await;
    let url = format!("{url}{settings}");
    let store = Store::connect(&url).await.expect("connect to PostgreSQL");
    let db = TestDb::new(store, url, "postgres");
    (db, schema)
}

/// `url` (a test database's, from [`postgres`]) reaching the server through
/// `proxy` instead, in plain text so the proxy can read it.
pub(crate) fn through_proxy(url: &str, proxy: std::net::SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (authority, path) = rest.split_once('/').expect("a URL with a database");
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"));
    let sep = if path.contains('?') { '&' } else { '?' };
    format!(
        "{scheme}://{}{proxy}/{path}{sep}sslmode=disable",
        user.unwrap_or_default()
    )
}

/// The server address in a PostgreSQL URL (port 5432 when it names none).
pub(crate) async fn server_addr(url: &str) -> std::net::SocketAddr {
    let rest = url.split_once("://").expect("a URL with a scheme").1;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    tokio::net::lookup_host(host)
        .await
        .expect("resolve the PostgreSQL host")
        .next()
        .expect("an address for the PostgreSQL host")
}

/// Drops a test schema.
pub(crate) async fn drop_schema(base: &str, schema: &str) {
    admin_execute(base, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

/// Runs `test` against a fresh database on every engine, SQLite first. A failing
/// run panics with the engine's name; PostgreSQL schemas are dropped even then.
pub(crate) async fn each_engine<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (db, dir) = sqlite().await;
    let outcome = tokio::spawn(test(db)).await;
    drop(dir);
    if let Err(e) = outcome {
        panic!("on sqlite: {e}");
    }
    let Some(base) = postgres_url() else { return };
    let (db, schema) = postgres(&base).await;
    let store = db.store.clone();
    let outcome = tokio::spawn(test(db)).await;
    store.close().await;
    drop_schema(&base, &schema).await;
    if let Err(e) = outcome {
        panic!("on postgres: {e}");
    }
}

/// The PgBouncer URL, or `None` (with a printed reason) when unset.
pub(crate) fn pgbouncer_url() -> Option<String> {
    match std::env::var(PGBOUNCER_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("skipping the PgBouncer run: {PGBOUNCER_ENV} is not set");
            None
        }
    }
}

/// `url` with its database (and query) replaced by `db`.
pub(crate) fn with_database(url: &str, db: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    format!("{scheme}://{authority}/{db}")
}

/// A fresh database on the PostgreSQL server at `direct`, reached through the
/// PgBouncer at `pooler` in transaction mode; panics if either is unreachable.
pub(crate) async fn pgbouncer(direct: &str, pooler: &str) -> (TestDb, String) {
    let name = unique_name("drover_pgb");
    admin_execute(direct, &format!("CREATE DATABASE {name}")).await;
    let url = format!("{}?pool_mode=transaction", with_database(pooler, &name));
    let store = Store::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{PGBOUNCER_ENV}={pooler} is set but unusable: {e}"));
    let mut db = TestDb::new(store, url, "postgres");
    db.sql_url = with_database(direct, &name);
    (db, name)
}

/// Drops a database made by [`pgbouncer`], closing the pooler's connections.
pub(crate) async fn drop_database(direct: &str, name: &str) {
    admin_execute(direct, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
}

/// Runs `test` as [`each_engine`] does, then on PostgreSQL through the
/// [`pool_lint`] (the store as a pooler's client, every statement judged),
/// then once more through a PgBouncer in transaction pooling mode when
/// [`PGBOUNCER_ENV`] is set (which then requires [`POSTGRES_ENV`] too, to make
/// the database behind it). For the
/// tests of what the store does, which must hold whatever sits in front of
/// the database.
pub(crate) async fn each_engine_and_pooler<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    each_engine(&test).await;
    if let Ok(direct) = std::env::var(POSTGRES_ENV) {
        // What a pooler would break, judged on the wire every time.
        let (db, name, lint) = pool_lint::through_lint(&direct).await;
        let store = db.store.clone();
        let outcome = tokio::spawn(test(db)).await;
        store.close().await;
        drop_database(&direct, &name).await;
        if let Err(e) = outcome {
            panic!("through the pool lint: {e}");
        }
        lint.assert_clean(1);
    }
    let Some(pooler) = pgbouncer_url() else {
        return;
    };
    let direct = std::env::var(POSTGRES_ENV)
        .unwrap_or_else(|_| panic!("{PGBOUNCER_ENV} is set: set {POSTGRES_ENV} too"));
    let (db, name) = pgbouncer(&direct, &pooler).await;
    let store = db.store.clone();
    let outcome = tokio::spawn(test(db)).await;
    store.close().await;
    drop_database(&direct, &name).await;
    if let Err(e) = outcome {
        panic!("through pgbouncer: {e}");
    }
}

/// Runs `test` once per engine and backend: on each engine (see
/// [`each_engine`]) with controllers on the database, then again with
/// controllers through a server in front of it ([`TestDb::worker`]).
pub(crate) async fn each_backend<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    each_engine(&test).await;
    eprintln!("again through a server");
    each_engine(|db| test(db.served())).await;
}

/// [`each_backend`] for the tests of wake-ups: the server it starts never
/// polls while a claim waits ([`TestDb::served_unpolled`]), so only a wake-up
/// can hand the worker its key in time.
pub(crate) async fn each_backend_unpolled<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    each_engine(&test).await;
    eprintln!("again through a server that does not poll");
    each_engine(|db| test(db.served_unpolled())).await;
}

/// A migrator of `engine`'s migrations whose file names sort before `before`
/// (`"0003"`: the first two), recording in drover's table, as an older drover
/// would have migrated; the directory holding their copies lives as long as
/// the returned guard.
pub(crate) async fn migrations_before(
    engine: &str,
    before: &str,
) -> (sqlx::migrate::Migrator, tempfile::TempDir) {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(engine);
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(&source).expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        if name.to_string_lossy().as_ref() < before {
            std::fs::copy(&path, dir.path().join(name)).expect("copy");
        }
    }
    let mut old = sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("old migrations");
    old.dangerous_set_table_name("drover_migrations");
    (old, dir)
}

/// A SQLite file `name` in `dir` migrated as far as [`migrations_before`]
/// `before` goes, its URL and a pool on it.
pub(crate) async fn old_sqlite(
    dir: &std::path::Path,
    name: &str,
    before: &str,
) -> (String, sqlx::SqlitePool) {
    let url = format!("sqlite://{}?mode=rwc", dir.join(name).display());
    let (old, _old_dir) = migrations_before("sqlite", before).await;
    let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
    old.run(&pool).await.expect("the old migrations run");
    (url, pool)
}
