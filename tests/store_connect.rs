//! Connecting: URL schemes, creating databases, migrations when several nodes
//! start at once, and refusing what cannot work.

mod support;

use drover::store::{
    ItemEnqueue, LeaseClaim, SessionStart, Store, StoreEngine as _, StoreError, StoreOptions,
};

#[tokio::test]
async fn an_in_memory_sqlite_store_works_for_the_life_of_the_store() {
    let store = Store::connect("sqlite::memory:").await.expect("connect");
    assert_eq!(store.engine_name(), "sqlite");
    store
        .item_enqueue(ItemEnqueue::new("p", ["a"]))
        .await
        .expect("enqueue");
    let session = store
        .session_start(SessionStart::new("t", std::time::Duration::from_secs(5)))
        .await
        .expect("session");
    let claim = LeaseClaim {
        session: session.id,
        process: "p".into(),
        max: 5,
        trace_links: false,
    };
    assert_eq!(
        store.lease_claim(claim).await.expect("claim").leases.len(),
        1
    );
}

#[tokio::test]
async fn a_missing_sqlite_file_is_created_and_migrated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("new.db");
    let store = Store::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("connect");
    assert!(path.exists());
    assert!(store.process_counts_all().await.expect("counts").is_empty());
}

#[tokio::test]
async fn a_new_sqlite_file_uses_8_kib_pages_and_an_existing_one_keeps_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page_size = |path: std::path::PathBuf| async move {
        let url = format!("sqlite://{}", path.display());
        let store = drover::store::SqliteStore::connect(&url, &StoreOptions::default())
            .await
            .expect("connect");
        let size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(store.pool())
            .await
            .expect("page_size");
        store.close().await;
        size
    };
    assert_eq!(page_size(dir.path().join("new.db")).await, 8192);
    // A file made by something else first, with SQLite's default page size.
    let old = dir.path().join("old.db");
    let other = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", old.display()))
        .await
        .expect("create a plain SQLite file");
    sqlx::query("CREATE TABLE t (x)")
        .execute(&other)
        .await
        .expect("create table");
    other.close().await;
    assert_eq!(page_size(old).await, 4096);
}

/// An error with its causes, for a failure message that says why.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn several_nodes_migrating_a_fresh_database_at_once_all_succeed() {
    // Fresh SQLite files, several: switching a new file to WAL is where
    // nodes met ("database is locked" whatever the busy timeout), in a few
    // rounds out of a hundred.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut urls: Vec<String> = (0..40)
        .map(|n| {
            format!(
                "sqlite://{}",
                dir.path().join(format!("race{n}.db")).display()
            )
        })
        .collect();
    let mut schema = None;
    if let Some(base) = support::postgres_url() {
        let name = format!("drover_race_{:08x}", rand::random::<u32>());
        let admin = sqlx::PgPool::connect(&base).await.expect("postgres");
        let create = format!("CREATE SCHEMA {name}");
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&admin)
            .await
            .expect("schema");
        urls.push(format!("{base}?options=-c%20search_path%3D{name}"));
        schema = Some((base, name));
    }
    let mut failures = Vec::new();
    for url in &urls {
        let nodes: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { Store::connect(&url).await.map(|_| ()) })
            })
            .collect();
        for node in nodes {
            if let Err(e) = node.await.expect("task") {
                failures.push(format!("{url}: {}", chain(&e)));
            }
        }
    }
    if let Some((base, name)) = schema {
        support::drop_schema(&base, &name).await;
    }
    assert!(failures.is_empty(), "every node connects: {failures:?}");
}

#[tokio::test]
async fn unknown_schemes_and_malformed_urls_are_refused_before_connecting() {
    for (url, scheme) in [("mysql://h/db", "mysql"), ("redis://x", "redis")] {
        let err = Store::connect(url).await.expect_err("refused");
        assert!(
            matches!(&err, StoreError::UnsupportedScheme { scheme: s } if s == scheme),
            "{err}"
        );
    }
    for url in ["drover.db", "postgres://:::", "postgres://h:notaport/db"] {
        let err = Store::connect(url).await.expect_err("refused");
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{url}: {err}");
    }
}

#[tokio::test]
async fn a_refused_connection_fails_at_once_and_hides_the_password() {
    let started = std::time::Instant::now();
    let options = StoreOptions::default().connect_timeout(std::time::Duration::from_secs(3));
    let err = Store::connect_with("postgres://me:hunter2@127.0.0.1:1/db", &options)
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        matches!(
            err,
            StoreError::Connect { .. } | StoreError::ConnectTimeout { .. }
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[tokio::test]
async fn a_rejected_login_is_a_connect_error() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let url = base.replacen("postgres://postgres@", "postgres://no_such_role:pw@", 1);
    if url == base {
        eprintln!("skipping: {base} does not start with postgres://postgres@");
        return;
    }
    let err = Store::connect(&url).await.expect_err("unknown role");
    assert!(matches!(err, StoreError::Connect { .. }), "{err}");
}

#[tokio::test]
async fn without_migrating_an_unmigrated_database_is_refused_with_a_hint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let options = StoreOptions::default().migrate(false);
    let err = Store::connect_with(&url, &options)
        .await
        .expect_err("behind");
    assert!(
        matches!(err, StoreError::SchemaBehind { found: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("drover migrate"), "{err}");
    Store::connect(&url).await.expect("migrates");
    Store::connect_with(&url, &options)
        .await
        .expect("up to date now");
}

/// A store's connections carry its application name: PostgreSQL shows it in
/// `pg_stat_activity` (`drover` by default; a name in the URL wins), and a
/// SQLite store names the threads its connections run on after it (on
/// Linux, where `/proc` shows them).
#[tokio::test]
async fn connections_carry_the_stores_application_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("named.db").display());
    let name = format!("n{:06x}", rand::random::<u32>() >> 8);
    let options = StoreOptions::default().application_name(name.clone());
    let store = Store::connect_with(&url, &options).await.expect("connect");
    store.process_counts_all().await.expect("a read");
    if cfg!(target_os = "linux") {
        let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
            .expect("/proc")
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|comm| comm.trim_end().to_owned())
            .filter(|comm| comm.starts_with(&format!("{name}-")))
            .collect();
        assert!(threads.contains(&format!("{name}-w")), "{threads:?}");
        assert!(
            threads.iter().any(|t| t.starts_with(&format!("{name}-r"))),
            "{threads:?}"
        );
    }
    store.close().await;

    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let in_url = format!("{}{sep}application_name=from-url", db.url);
    let cases = [
        (db.url.clone(), StoreOptions::default(), "drover"),
        (db.url.clone(), options.clone(), name.as_str()),
        (in_url, options.clone(), "from-url"),
    ];
    for (url, options, expected) in cases {
        let store = Store::connect_with(&url, &options).await.expect("connect");
        let mut tx = store.begin().await.expect("begin");
        let conn = tx.postgres().expect("a PostgreSQL transaction");
        let shown: String = sqlx::query_scalar(
            "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        .fetch_one(conn)
        .await
        .expect("pg_stat_activity");
        assert_eq!(shown, expected, "{url}");
        drop(tx);
        store.close().await;
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// An application name holding a NUL is refused with an error: on SQLite it
/// names the connections' threads, and a thread name with a NUL panicked
/// inside sqlx.
#[tokio::test]
async fn an_application_name_with_a_nul_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let options = StoreOptions::default().application_name("drover\0worker");
    let err = Store::connect_with(&url, &options)
        .await
        .expect_err("a NUL in the name");
    assert!(
        matches!(err, StoreError::InvalidArgument(ref why) if why.contains("NUL")),
        "{err}"
    );
}

/// A store opens on a migrated SQLite file while another process holds a
/// write transaction on it (an application's on its own tables, a long bulk
/// enqueue): with nothing to migrate, opening takes no write lock. Before,
/// every open (a `drover status` too) waited for that transaction, and
/// failed "busy" after the 30 s busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_sqlite_file_opens_while_another_process_writes() {
    use sqlx::ConnectOptions as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let url = format!("sqlite://{}", path.display());
    Store::connect(&url).await.expect("create").close().await;
    let mut other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .expect("another program's connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("its write transaction");
    sqlx::query("CREATE TABLE app_rows (id INTEGER PRIMARY KEY)")
        .execute(&mut other)
        .await
        .expect("its write");
    // Bounded only so that a failure ends before the busy timeout does.
    let opened = tokio::time::timeout(std::time::Duration::from_secs(20), Store::connect(&url))
        .await
        .expect("the store opened without waiting for the writer")
        .expect("open");
    let counts = opened.process_counts_all().await.expect("a read");
    assert!(counts.is_empty(), "{counts:?}");
    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
}
