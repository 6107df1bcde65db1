//! Enqueueing inside the caller's own transaction (DESIGN.md rule 11), on every
//! engine: through the library call and through the SQL that programs in other
//! languages run (`drover_enqueue` function / view). The key exists, with the
//! store's coalescing rules, only if the transaction commits; a producer killed
//! mid-transaction leaves neither its change nor its key.

mod support;

use std::process::Stdio;
use std::time::Duration;

use drover::store::{
    ItemDelete, ItemEnqueue, ItemState, LeaseComplete, Outcome, PostgresStore, RunList, RunOutcome,
    Store, StoreEngine as _, StoreError,
};
use nix::sys::signal::Signal;
use proptest::strategy::Strategy as _;
use support::caller_tx::CallerTx;
use support::store::{P, claim, complete, enqueue, events, item, keys};
use support::{TestDb, each_enqueue_path};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::Command;

/// The user's own table, with machine `m1` not yet wanted.
async fn machines(db: &TestDb) {
    db.execute("CREATE TABLE machines (id TEXT PRIMARY KEY, wanted TEXT NOT NULL)")
        .await;
    db.execute("INSERT INTO machines VALUES ('m1', 'off')")
        .await;
}

/// What the user's table says about `m1`.
async fn wanted(db: &TestDb) -> String {
    let sql = "SELECT wanted FROM machines WHERE id = 'm1'";
    if let Some(pool) = db.store.postgres_pool() {
        sqlx::query_scalar(sql).fetch_one(pool).await
    } else {
        let pool = db.store.sqlite_pool().expect("an engine");
        sqlx::query_scalar(sql).fetch_one(pool).await
    }
    .expect("read machines")
}

#[tokio::test]
async fn an_enqueue_in_a_transaction_that_rolls_back_leaves_nothing() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let s = db.session().await;
        let mut tx = CallerTx::begin(&db.store).await;
        tx.execute("UPDATE machines SET wanted = 'on' WHERE id = 'm1'")
            .await;
        let report = tx
            .enqueue(ItemEnqueue::new(P, ["m1"]))
            .await
            .expect("enqueue in the transaction");
        assert_eq!(report.pending, 1);
        tx.enqueue_sql(P, "m2").await.expect("SQL enqueue");
        tx.rollback().await;
        assert_eq!(wanted(&db).await, "off");
        assert!(item(&db.store, "m1").await.is_none());
        assert!(item(&db.store, "m2").await.is_none());
        assert!(claim(&db.store, s.id, 10).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_committed_enqueue_is_claimable_and_coalesces_with_normal_enqueues() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let s = db.session().await;
        enqueue(&db.store, &["m1"]).await;
        let mut tx = CallerTx::begin(&db.store).await;
        tx.execute("UPDATE machines SET wanted = 'on' WHERE id = 'm1'")
            .await;
        let raise = ItemEnqueue::new(P, ["m1", "m2"]).priority(3);
        tx.enqueue(raise).await.expect("enqueue");
        tx.enqueue_sql(P, "m1").await.expect("SQL enqueue");
        tx.commit().await;
        enqueue(&db.store, &["m2"]).await;
        assert_eq!(wanted(&db).await, "on");
        let leases = claim(&db.store, s.id, 10).await;
        assert_eq!(keys(&leases), ["m1", "m2"], "one entry per key");
        assert!(leases.iter().all(|l| l.priority == 3), "{leases:?}");
        let m1 = item(&db.store, "m1").await.expect("m1 is known");
        assert_eq!(m1.enqueue_count, 3);
        assert_eq!(item(&db.store, "m2").await.expect("m2").enqueue_count, 2);
    })
    .await;
}

#[tokio::test]
async fn a_committing_transaction_that_enqueues_a_running_key_makes_it_run_once_more() {
    each_enqueue_path(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["a"]).await;
        let running = claim(&db.store, s.id, 10).await;
        let mut tx = CallerTx::begin(&db.store).await;
        for _ in 0..2 {
            let report = tx.enqueue(ItemEnqueue::new(P, ["a"])).await;
            assert_eq!(report.expect("enqueue").dirty, 1);
        }
        tx.enqueue_sql(P, "a").await.expect("SQL enqueue");
        tx.commit().await;
        complete(&db.store, &running[0], Outcome::Done)
            .await
            .expect("done");
        let again = claim(&db.store, s.id, 10).await;
        assert_eq!(keys(&again), ["a"], "the dirty key runs once more");
        complete(&db.store, &again[0], Outcome::Done)
            .await
            .expect("done");
        assert!(claim(&db.store, s.id, 10).await.is_empty(), "and only once");
    })
    .await;
}

#[tokio::test]
async fn the_sql_enqueue_refuses_bad_names_and_writes_nothing() {
    each_enqueue_path(|db| async move {
        for (process, key) in [(P, ""), ("", "k"), (P, &*"k".repeat(1025))] {
            let mut tx = CallerTx::begin(&db.store).await;
            let refused = tx.enqueue_sql(process, key).await;
            let message = refused.expect_err("a bad name is refused").to_string();
            assert!(message.contains("drover_enqueue"), "{message}");
            tx.rollback().await;
        }
        let counts = db.store.process_counts_all().await.expect("counts");
        assert!(counts.is_empty(), "{counts:?}");
    })
    .await;
}

/// Enqueues `process` and `key`, given as bytes and cast to text, through
/// SQLite's `drover_enqueue` view, as SQL in another program can.
async fn enqueue_bytes(pool: &sqlx::SqlitePool, process: &[u8], key: &[u8]) -> Result<(), String> {
    sqlx::query(
        "INSERT INTO drover_enqueue (process, key) VALUES (CAST(?1 AS TEXT), CAST(?2 AS TEXT))",
    )
    .bind(process)
    .bind(key)
    .execute(pool)
    .await
    .map(drop)
    .map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_sql_enqueue_on_sqlite_refuses_text_that_is_not_utf8_and_writes_nothing() {
    // SQLite stores any bytes SQL casts to text; such a key could never be
    // handed to a worker, and every list that met it failed to decode it.
    let (db, _dir) = support::sqlite().await;
    let pool = db.store.sqlite_pool().expect("SQLite").clone();
    enqueue(&db.store, &["before"]).await;
    // Lone bytes, a surrogate, past U+10FFFF, a cut sequence; a process name.
    for (process, key) in [
        (P.as_bytes(), &b"f\xff"[..]),
        (P.as_bytes(), b"\xed\xa0\x80"),
        (P.as_bytes(), b"\xf4\x90\x80\x80"),
        (P.as_bytes(), b"ok \xc3"),
        (b"p\x80", b"k"),
    ] {
        let error = enqueue_bytes(&pool, process, key)
            .await
            .expect_err("refused");
        assert!(
            error.contains("drover_enqueue: a process name and a key must be valid UTF-8 text"),
            "{process:?} {key:?}: {error}"
        );
    }
    // A huge name is refused for its length before any character is walked.
    let mut huge = "\u{e9}".repeat(512 * 1024).into_bytes();
    huge.push(0xff);
    let error = enqueue_bytes(&pool, P.as_bytes(), &huge)
        .await
        .expect_err("refused");
    assert!(
        error.contains("a key is text of 1 to 1024 bytes"),
        "{error}"
    );
    let counts = db.store.process_counts_all().await.expect("counts");
    assert_eq!(
        counts.len(),
        1,
        "no process named by a refused enqueue: {counts:?}"
    );
    assert_eq!((counts[0].process.as_str(), counts[0].pending), (P, 1));
    // Valid text that is not plain ASCII goes through, exactly as written.
    for key in [
        "caf\u{e9}",
        "tab\there",
        "\u{1F600}",
        "\u{FFFD}",
        "\u{10FFFF}",
    ] {
        enqueue_bytes(&pool, P.as_bytes(), key.as_bytes())
            .await
            .expect(key);
    }
    let s = db.session().await;
    let leases = claim(&db.store, s.id, 10).await;
    let mut claimed = keys(&leases);
    claimed.sort_unstable();
    let mut expected = vec![
        "before",
        "caf\u{e9}",
        "tab\there",
        "\u{1F600}",
        "\u{FFFD}",
        "\u{10FFFF}",
    ];
    expected.sort_unstable();
    assert_eq!(claimed, expected);
}

/// Inserts `key` of [`P`] into SQLite's `drover_enqueue` view with `column`
/// set to `value`, written as SQL (`'high'`, `1.5`, `X'00'`), as SQL in
/// another program can.
async fn enqueue_with(
    pool: &sqlx::SqlitePool,
    key: &str,
    column: &str,
    value: &str,
) -> Result<(), String> {
    let sql =
        format!("INSERT INTO drover_enqueue (process, key, {column}) VALUES (?1, ?2, {value})");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(P)
        .bind(key)
        .execute(pool)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Numbers the view's trigger refuses: its column, its SQL and the line the
/// refusal says. Each once stored, and the claim that met the row committed
/// its leases and then failed to read it back.
const BAD_NUMBERS: [(&str, &str, &str); 11] = [
    ("priority", "5000000000", "a priority is an integer from"),
    ("priority", "-5000000000", "a priority is an integer from"),
    ("priority", "'high'", "a priority is an integer from"),
    ("priority", "1.5", "a priority is an integer from"),
    ("priority", "X'00'", "a priority is an integer from"),
    ("delay_ms", "0.5", "delay_ms is an integer of milliseconds"),
    (
        "delay_ms",
        "'soon'",
        "delay_ms is an integer of milliseconds",
    ),
    (
        "delay_ms",
        "9223372036854775807",
        "at most 15552000000 (180 days)",
    ),
    ("clock_offset_ms", "'x'", "clock_offset_ms is an integer"),
    ("clock_offset_ms", "0.5", "clock_offset_ms is an integer"),
    ("bypass_backoff", "'yes'", "bypass_backoff is 0 or 1"),
];

/// SQLite's view refuses a priority, delay, clock offset or bypass flag the
/// store could not read back (migration 0025): the statement fails with one
/// line naming `drover_enqueue` and what it expects, and writes nothing.
#[tokio::test]
async fn the_sql_enqueue_on_sqlite_refuses_numbers_the_store_cannot_read_and_writes_nothing() {
    let (db, _dir) = support::sqlite().await;
    let pool = db.store.sqlite_pool().expect("SQLite").clone();
    enqueue(&db.store, &["before"]).await;
    for (i, (column, value, says)) in BAD_NUMBERS.into_iter().enumerate() {
        let key = format!("bad-{i}");
        let error = enqueue_with(&pool, &key, column, value)
            .await
            .expect_err(&format!("{column} = {value} is refused"));
        assert!(
            error.contains("drover_enqueue: ") && error.contains(says),
            "{column} = {value}: {error}"
        );
        assert!(
            item(&db.store, &key).await.is_none(),
            "{column} = {value} wrote its key"
        );
    }
    let counts = db.store.process_counts_all().await.expect("counts");
    let counted: Vec<_> = counts
        .iter()
        .map(|c| (c.process.as_str(), c.pending, c.running))
        .collect();
    assert_eq!(counted, [(P, 1, 0)], "only the key enqueued before");
}

/// SQLite's view takes every number the Rust API can give (an i32 priority,
/// a delay of up to 180 days) and NULL for the default, stored as integers,
/// and nothing past each bound.
#[tokio::test]
async fn the_sql_enqueue_on_sqlite_takes_every_number_up_to_each_bound_and_none_past_it() {
    let (db, _dir) = support::sqlite().await;
    let pool = db.store.sqlite_pool().expect("SQLite").clone();
    // A REAL without a fraction is the integer it is (as the HTTP API takes
    // `7.0`): some clients bind every number as a double. A negative delay
    // means none, as on PostgreSQL.
    let taken = [
        ("low", "priority", "-7", -7, 0),
        ("max", "priority", "2147483647", i32::MAX, 0),
        ("min", "priority", "-2147483648", i32::MIN, 0),
        ("unset", "priority", "NULL", 0, 0),
        ("real", "priority", "7.0", 7, 0),
        ("now", "delay_ms", "0", 0, 0),
        ("second", "delay_ms", "1000", 0, 1000),
        ("real-second", "delay_ms", "1e3", 0, 1000),
        ("longest", "delay_ms", "15552000000", 0, 15_552_000_000),
        ("past", "delay_ms", "-5", 0, 0),
        ("bypass", "bypass_backoff", "TRUE", 0, 0),
        ("offset", "clock_offset_ms", "0", 0, 0),
    ];
    for (key, column, value, priority, delay_ms) in taken {
        enqueue_with(&pool, key, column, value)
            .await
            .unwrap_or_else(|e| panic!("{column} = {value} is taken: {e}"));
        let stored: (String, String, String) = sqlx::query_as(
            "SELECT typeof(priority), typeof(ready_at), typeof(enqueued_at)
             FROM drover_items WHERE process = ?1 AND key = ?2",
        )
        .bind(P)
        .bind(key)
        .fetch_one(&pool)
        .await
        .expect("stored");
        assert_eq!(
            (stored.0.as_str(), stored.1.as_str(), stored.2.as_str()),
            ("integer", "integer", "integer"),
            "{column} = {value} is stored as integers"
        );
        let known = item(&db.store, key).await.expect("the key is known");
        let delay = (known.ready_at - known.enqueued_at).num_milliseconds();
        assert_eq!(
            (known.priority, delay),
            (priority, delay_ms),
            "{column} = {value}"
        );
    }
    let s = db.session().await;
    let leases = claim(&db.store, s.id, 20).await;
    let claimed: Vec<_> = leases
        .iter()
        .map(|l| (l.key.as_str(), l.priority))
        .collect();
    assert_eq!(
        &claimed[..2],
        [("max", i32::MAX), ("real", 7)],
        "highest priority first: {claimed:?}"
    );
    assert_eq!(
        claimed.last(),
        Some(&("min", i32::MIN)),
        "lowest priority last"
    );
    assert_eq!(leases.len(), 9, "every key without a delay: {claimed:?}");
    // One past each bound is refused.
    let past = [
        ("priority", "2147483648"),
        ("priority", "-2147483649"),
        ("priority", "7.5"),
        ("delay_ms", "15552000001"),
        ("bypass_backoff", "2"),
        ("clock_offset_ms", "1000000000000001"),
        ("clock_offset_ms", "-1000000000000001"),
    ];
    for (column, value) in past {
        let refused = enqueue_with(&pool, "past-a-bound", column, value).await;
        let error = refused.expect_err(&format!("{column} = {value} is refused"));
        assert!(
            error.contains("drover_enqueue: "),
            "{column} = {value}: {error}"
        );
    }
    assert!(item(&db.store, "past-a-bound").await.is_none());
}

/// Calls PostgreSQL's `drover_enqueue` for `key` of [`P`] with `delay_ms`
/// and `clock_offset_ms` (NULL for `None`), as SQL in another program can.
async fn enqueue_pg(
    pool: &sqlx::PgPool,
    key: &str,
    delay_ms: Option<i64>,
    clock_offset_ms: Option<i64>,
) -> Result<(), String> {
    sqlx::query("SELECT drover_enqueue($1, ARRAY[$2], delay_ms => $3, clock_offset_ms => $4)")
        .bind(P)
        .bind(key)
        .bind(delay_ms)
        .bind(clock_offset_ms)
        .execute(pool)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// PostgreSQL's `drover_enqueue` takes every delay up to 180 days and refuses
/// one past it, and a clock offset past ±10^15 ms, with one line naming it,
/// writing nothing (migration 0035), as SQLite's view does. It took any: a
/// delay past 180 days was written as asked (the view refused the same
/// call), and one of about 270,000 years wrote a ready time past the last
/// the store can read, so every read of the key panicked, and the run of a
/// running key so enqueued could never be completed.
#[tokio::test]
async fn the_sql_enqueue_on_postgres_refuses_a_delay_past_180_days_and_writes_nothing() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("PostgreSQL").clone();
    let taken = [
        ("now", Some(0), 0),
        ("unset", None, 0),
        ("past", Some(-5), 0),
        ("longest", Some(15_552_000_000), 15_552_000_000),
    ];
    for (key, delay, delay_ms) in taken {
        enqueue_pg(&pool, key, delay, None)
            .await
            .unwrap_or_else(|e| panic!("delay_ms = {delay:?} is taken: {e}"));
        let known = item(&db.store, key).await.expect("the key is known");
        let waits = (known.ready_at - known.enqueued_at).num_milliseconds();
        assert_eq!(waits, delay_ms, "delay_ms = {delay:?}");
    }
    enqueue(&db.store, &["busy"]).await;
    let s = db.session().await;
    let running = claim(&db.store, s.id, 10).await;
    let mut claimed = keys(&running);
    claimed.sort_unstable();
    assert_eq!(claimed, ["busy", "now", "past", "unset"]);
    let refused = [
        (Some(15_552_000_001), None),
        (Some(8_500_000_000_000_000), None),
        (Some(i64::MAX), None),
        (None, Some(1_000_000_000_000_001)),
        (None, Some(8_500_000_000_000_000)),
        (None, Some(i64::MIN)),
    ];
    for (delay, offset) in refused {
        for key in ["refused", "busy"] {
            let error = enqueue_pg(&pool, key, delay, offset)
                .await
                .expect_err(&format!(
                    "delay_ms = {delay:?}, clock_offset_ms = {offset:?} is refused"
                ));
            assert!(
                error.contains("drover_enqueue: "),
                "delay_ms = {delay:?}, clock_offset_ms = {offset:?}: {error}"
            );
        }
    }
    assert!(item(&db.store, "refused").await.is_none());
    let busy = item(&db.store, "busy").await.expect("busy");
    assert!(
        !busy.dirty,
        "a refused enqueue marked the running key dirty"
    );
    for lease in &running {
        complete(&db.store, lease, Outcome::Done)
            .await
            .expect("done");
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A claim after bad numbers were offered to SQLite's view hands out every
/// valid key, on a process with and without a limit, and leaves no key
/// running without a lease its caller holds.
#[tokio::test]
async fn a_claim_after_a_refused_sql_enqueue_on_sqlite_hands_out_every_valid_key() {
    // Once, the bad row was stored and the claim that met it committed every
    // lease it took and then failed: the caller got an error while its keys
    // stayed running under its session. On a limited process the claim read
    // the highest pending priority first, and every claim failed.
    for limit in [None, Some(100)] {
        let (db, _dir) = support::sqlite().await;
        let pool = db.store.sqlite_pool().expect("SQLite").clone();
        if limit.is_some() {
            let limited = drover::store::ProcessConfigure::new(P).concurrency(limit);
            db.store.process_configure(limited).await.expect("limit");
        }
        for key in ["a", "b"] {
            enqueue_with(&pool, key, "priority", "1")
                .await
                .expect("a valid enqueue");
        }
        let mut taken = Vec::new();
        for (i, (column, value, _)) in BAD_NUMBERS.into_iter().enumerate() {
            if enqueue_with(&pool, &format!("bad-{i}"), column, value)
                .await
                .is_ok()
            {
                taken.push((column, value));
            }
        }
        let s = db.session().await;
        let leases = claim(&db.store, s.id, 20).await;
        assert_eq!(keys(&leases), ["a", "b"], "limit {limit:?}");
        assert!(taken.is_empty(), "taken: {taken:?}");
        let running: i64 =
            sqlx::query_scalar("SELECT count(*) FROM drover_items WHERE state = 'running'")
                .fetch_one(&pool)
                .await
                .expect("running");
        assert_eq!(
            running, 2,
            "limit {limit:?}: no key runs without a lease the caller holds"
        );
        for lease in &leases {
            complete(&db.store, lease, Outcome::Done)
                .await
                .expect("done");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]

    /// The view's check agrees with Rust's own UTF-8 decoding on any bytes:
    /// arbitrary ones, and valid text with bytes spliced in.
    #[test]
    fn the_sql_enqueue_on_sqlite_takes_a_key_exactly_when_it_is_utf8(
        key in proptest::prop_oneof![
            proptest::collection::vec(1u8.., 1..12),
            ("[a-z\u{e9}\u{20ac}\u{1F600}\u{FFFD}]{0,6}", proptest::collection::vec(1u8.., 0..3), 0usize..8)
                .prop_map(|(text, bytes, at)| {
                    let mut key = text.into_bytes();
                    let at = at.min(key.len());
                    key.splice(at..at, bytes);
                    if key.is_empty() { key.push(b'k'); }
                    key
                }),
        ]
    ) {
        use proptest::prop_assert;
        let pool = POOL.get_or_init(|| {
            let url = format!("sqlite://{}", DIR.path().join("utf8.db").display());
            let store = RUNTIME.block_on(Store::connect(&url)).expect("connect");
            store.sqlite_pool().expect("SQLite").clone()
        });
        let taken = RUNTIME.block_on(enqueue_bytes(pool, b"p", &key));
        let valid = std::str::from_utf8(&key).is_ok();
        match taken {
            Ok(()) => prop_assert!(valid, "{key:x?} was taken"),
            Err(e) => {
                prop_assert!(!valid, "{key:x?} was refused: {e}");
                prop_assert!(e.contains("must be valid UTF-8 text"), "{e}");
            }
        }
    }
}

/// One runtime, database and pool for all the cases of the property above.
static RUNTIME: std::sync::LazyLock<tokio::runtime::Runtime> =
    std::sync::LazyLock::new(|| tokio::runtime::Runtime::new().expect("runtime"));
static DIR: std::sync::LazyLock<tempfile::TempDir> =
    std::sync::LazyLock::new(|| tempfile::tempdir().expect("tempdir"));
static POOL: std::sync::OnceLock<sqlx::SqlitePool> = std::sync::OnceLock::new();

/// The producer, in the SQL client of the engine: begins, changes `m1`,
/// enqueues it, says `ready` and waits for more input that never comes.
fn producer(db: &TestDb) -> Option<(Command, &'static str)> {
    let (program, script) = if db.engine == "postgres" {
        let script = "BEGIN;\nUPDATE machines SET wanted = 'on' WHERE id = 'm1';\n\
                      SELECT drover_enqueue('provision', ARRAY['m1']);\n\\echo ready\n";
        ("psql", script)
    } else {
        let script = "BEGIN IMMEDIATE;\nUPDATE machines SET wanted = 'on' WHERE id = 'm1';\n\
                      INSERT INTO drover_enqueue (process, key) VALUES ('provision', 'm1');\n\
                      SELECT 'ready';\n";
        ("sqlite3", script)
    };
    let Ok(path) = which(program) else {
        // With the PostgreSQL variable set (as CI sets it) the machine is
        // meant to run every half: a missing client fails the test.
        assert!(
            std::env::var_os(support::POSTGRES_ENV).is_none_or(|v| v.is_empty()),
            "{} is set but {program} is not on PATH: install it (CI does)",
            support::POSTGRES_ENV
        );
        eprintln!("skipping the {} half: no {program} on PATH", db.engine);
        return None;
    };
    let mut command = Command::new(path);
    if db.engine == "postgres" {
        command.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &db.url]);
    } else {
        command.arg(db.url.trim_start_matches("sqlite://"));
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    Some((command, script))
}

/// `program`'s path on `PATH`.
fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or(())
}

#[tokio::test]
async fn a_producer_killed_mid_transaction_leaves_neither_its_change_nor_its_key() {
    each_enqueue_path(|db| async move {
        assert_eq!(P, "provision", "the producer's script names the process");
        machines(&db).await;
        let Some((mut command, script)) = producer(&db) else {
            return;
        };
        let mut child = command.spawn().expect("start the producer");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(script.as_bytes()).await.expect("script");
        stdin.flush().await.expect("flush");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = lines.next_line().await.expect("read").expect("ready");
            if line.trim() == "ready" {
                break;
            }
        }
        // The change and the enqueue are written; the commit never comes.
        support::process::signal(&child, Signal::SIGKILL);
        child.wait().await.expect("wait for the producer");
        drop(stdin);
        support::process::eventually("the producer's transaction is gone", || async {
            db.store
                .item_enqueue(ItemEnqueue::new("probe", ["x"]))
                .await
                .is_ok()
        })
        .await;
        assert_eq!(wanted(&db).await, "off", "the change rolled back");
        assert!(item(&db.store, "m1").await.is_none(), "and its key with it");
    })
    .await;
}

/// Waits for the next notification on `listener` (at most 10 s); its channel.
async fn next_channel(listener: &mut sqlx::postgres::PgListener) -> String {
    let note = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification arrives")
        .expect("the listener works");
    note.channel().to_owned()
}

#[tokio::test]
async fn workers_are_notified_when_the_enqueueing_transaction_commits_and_never_on_rollback() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("listener connects");
    // A plain name and one the channel hashes: the SQL function must name
    // the channel as the listening store does. Both of this test's own:
    // channels are per database, and the tests of other schemas (and other
    // runs) enqueue meanwhile, so a shared name would let their
    // notifications stand in for this one's.
    let plain = support::process_name("committed");
    let hashed = format!("Committed machines/ü {plain}");
    for process in [plain.as_str(), hashed.as_str()] {
        let channel = PostgresStore::notify_channel(process);
        listener.listen(&channel).await.expect("listen");
        listener.listen("marker").await.expect("listen");
        let mut rolled_back = CallerTx::begin(&db.store).await;
        let params = ItemEnqueue::new(process, ["m1"]);
        rolled_back.enqueue(params.clone()).await.expect("enqueue");
        rolled_back
            .enqueue_sql(process, "m2")
            .await
            .expect("SQL enqueue");
        rolled_back.rollback().await;
        db.execute("NOTIFY marker").await;
        let mut committed = CallerTx::begin(&db.store).await;
        committed.enqueue(params).await.expect("enqueue");
        db.execute("NOTIFY marker").await; // while the enqueue is uncommitted
        committed.commit().await;
        // Notifications arrive in commit order.
        let order = [
            next_channel(&mut listener).await,
            next_channel(&mut listener).await,
            next_channel(&mut listener).await,
        ];
        assert_eq!(order, ["marker", "marker", channel.as_str()], "{process}");
        listener.unlisten(&channel).await.expect("unlisten");
    }
    db.store.close().await;
    drop(listener);
    support::drop_schema(&base, &schema).await;
}

/// Whether `woken` has fired, without waiting.
async fn fired(woken: &mut std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) -> bool {
    tokio::select! {
        biased;
        () = woken.as_mut() => true,
        () = std::future::ready(()) => false,
    }
}

#[tokio::test]
async fn a_commit_wakes_this_processs_idle_workers_and_a_rollback_does_not() {
    each_enqueue_path(|db| async move {
        // A process of its own: wake-ups are per process name in this test
        // binary, and the other tests here enqueue to `P` at the same time.
        let p = format!("woken_{:08x}", rand::random::<u32>());
        let wake = db.store.wakeup(&p);
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let mut tx = CallerTx::begin(&db.store).await;
        tx.enqueue(ItemEnqueue::new(&p, ["a"]))
            .await
            .expect("enqueue");
        assert!(
            !fired(&mut woken).await,
            "nothing to wake for before the commit"
        );
        tx.rollback().await;
        assert!(!fired(&mut woken).await, "nor after a rollback");
        let mut tx = CallerTx::begin(&db.store).await;
        tx.enqueue(ItemEnqueue::new(&p, ["a"]))
            .await
            .expect("enqueue");
        tx.commit().await;
        assert!(fired(&mut woken).await, "the commit wakes the workers");
    })
    .await;
}

#[tokio::test]
async fn a_delete_in_a_transaction_forgets_the_key_only_when_it_commits_and_never_a_running_one() {
    each_enqueue_path(|db| async move {
        let s = db.session().await;
        enqueue(&db.store, &["gone"]).await;
        let delete = |key: &str| ItemDelete {
            process: P.into(),
            key: key.into(),
            actor: "producer".into(),
        };
        let mut tx = CallerTx::begin(&db.store).await;
        assert!(tx.delete(delete("gone")).await.expect("delete"));
        tx.rollback().await;
        assert!(
            item(&db.store, "gone").await.is_some(),
            "a rollback keeps the key"
        );
        let running = claim(&db.store, s.id, 1).await;
        assert_eq!(keys(&running), ["gone"]);
        complete(&db.store, &running[0], Outcome::Done)
            .await
            .expect("done");
        enqueue(&db.store, &["busy"]).await;
        let busy = claim(&db.store, s.id, 1).await;
        assert_eq!(keys(&busy), ["busy"]);
        let mut tx = CallerTx::begin(&db.store).await;
        let refused = tx.delete(delete("busy")).await;
        assert!(
            matches!(refused, Err(StoreError::AlreadyLeased { .. })),
            "{refused:?}"
        );
        assert!(tx.delete(delete("gone")).await.expect("delete"));
        assert!(
            !tx.delete(delete("never")).await.expect("delete"),
            "no such key"
        );
        tx.commit().await;
        assert!(
            item(&db.store, "gone").await.is_none(),
            "the commit forgets it"
        );
        assert!(item(&db.store, "busy").await.is_some());
        let history = db
            .store
            .run_list(RunList {
                process: Some(P.into()),
                key: Some("gone".into()),
                limit: 10,
                ..RunList::default()
            })
            .await
            .expect("runs");
        assert_eq!(history[0].outcome, RunOutcome::Deleted);
        assert_eq!(history[0].actor.as_deref(), Some("producer"));
        drop(busy);
    })
    .await;
}

/// A delete in a caller's transaction refused because the key is running
/// leaves no lock on its row, and the transaction goes on: the worker's
/// completion of that key is not held up by a caller that carries on working.
/// Before, the refused delete's `FOR UPDATE` stayed until the caller's
/// transaction ended (PostgreSQL; SQLite's caller holds the whole file's write
/// lock for its transaction anyway).
#[tokio::test]
async fn a_refused_delete_in_a_transaction_leaves_the_running_keys_row_unlocked() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let s = db.session().await;
    enqueue(&db.store, &["busy", "gone"]).await;
    let busy = claim(&db.store, s.id, 1).await;
    assert_eq!(keys(&busy), ["busy"]);
    let delete = |key: &str| ItemDelete {
        process: P.into(),
        key: key.into(),
        actor: "producer".into(),
    };
    let mut tx = db.store.begin().await.expect("begin");
    let refused = tx.item_delete(delete("busy")).await;
    assert!(
        matches!(refused, Err(StoreError::AlreadyLeased { .. })),
        "{refused:?}"
    );
    let other = sqlx::PgPool::connect(&db.url)
        .await
        .expect("another connection");
    let row = sqlx::query(
        "SELECT 1 FROM drover_items WHERE process = $1 AND key = 'busy' FOR UPDATE NOWAIT",
    )
    .bind(P)
    .execute(&other)
    .await;
    assert!(
        row.is_ok(),
        "the refused delete still holds the running key's row: {row:?}"
    );
    assert!(
        tx.item_delete(delete("gone"))
            .await
            .expect("the transaction goes on")
    );
    tx.commit().await.expect("commit");
    assert!(item(&db.store, "gone").await.is_none());
    // Nor does it leave its savepoint: each refusal nested the caller's
    // transaction one level deeper (past 64, every snapshot on the server
    // slows down).
    let mut tx = db.store.begin().await.expect("begin");
    for _ in 0..3 {
        assert!(tx.item_delete(delete("busy")).await.is_err());
    }
    let conn = tx.postgres().expect("a PostgreSQL transaction");
    let left = sqlx::query("RELEASE SAVEPOINT drover_item_delete")
        .execute(&mut *conn)
        .await;
    let code = left
        .as_ref()
        .err()
        .and_then(|e| e.as_database_error())
        .and_then(|d| d.code().map(|c| c.into_owned()));
    assert_eq!(
        code.as_deref(),
        Some("3B001"),
        "a refused delete left its savepoint: {left:?}"
    );
    tx.rollback().await.expect("rollback");
    // On a connection outside any transaction: refused in words.
    let pg = db.store.postgres().expect("a PostgreSQL store");
    let mut conn = pg.pool().acquire().await.expect("a connection");
    let outside = pg.item_delete_in(&mut conn, delete("busy")).await;
    assert!(
        matches!(&outside, Err(StoreError::InvalidArgument(why)) if why.contains("BEGIN")),
        "{outside:?}"
    );
    drop(conn);
    complete(&db.store, &busy[0], Outcome::Done)
        .await
        .expect("done");
    other.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A caller's transaction is bounded by its own idle timeout
/// (`StoreOptions::caller_idle_timeout`, issue 35): past it the database ends
/// the transaction, so a stalled caller cannot hold its keys' rows locked for
/// ever, and drover's next call in it says so in words; nothing of it is
/// written. A caller that sets a longer bound may think between statements.
/// On PostgreSQL (SQLite's caller holds the one write lock; no such timer).
/// The waits are time passing on the database's timer, not synchronisation.
/// A caller's open transaction that enqueued a running key holds back that
/// key's outcome alone (PostgreSQL; on SQLite such a transaction holds the
/// one write lock, and every write waits). A completion batch skips the row
/// the caller holds and answers its lease `KeyBusy`, nothing written for it,
/// and commits the batch's other outcomes at once, on both of the batch's
/// paths (all clean `done`s, one statement; a mixed batch, the general way).
/// Sent again once the caller has committed, the held key's outcome is
/// written, and the caller's enqueue makes the key run once more. Before,
/// every outcome of the batch (and of every controller writing through the
/// store) waited for the caller's commit.
#[tokio::test]
async fn a_callers_open_transaction_holds_back_the_outcome_of_its_own_key_only() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let s = db.session().await;
    enqueue(&db.store, &["clean", "held", "mixed"]).await;
    let running = claim(&db.store, s.id, 10).await;
    assert_eq!(keys(&running), ["clean", "held", "mixed"]);
    let lease = |key: &str| {
        running
            .iter()
            .find(|l| l.key == key)
            .expect("claimed")
            .clone()
    };
    let mut tx = CallerTx::begin(&db.store).await;
    let report = tx.enqueue(ItemEnqueue::new(P, ["held"])).await;
    assert_eq!(report.expect("enqueue").dirty, 1);
    let (held, failed) = (lease("held"), Outcome::Transient("flaky".into()));
    let batches = [
        vec![
            (lease("clean"), Outcome::Done),
            (held.clone(), Outcome::Done),
        ],
        vec![(held.clone(), failed.clone()), (lease("mixed"), failed)],
    ];
    for (n, batch) in batches.iter().enumerate() {
        let params: Vec<LeaseComplete<'_>> = batch
            .iter()
            .map(|(lease, outcome)| LeaseComplete {
                lease,
                outcome,
                trace_id: None,
            })
            .collect();
        // Under the caller's idle bound (5 s), after which the old code's
        // wait ended with the caller's transaction.
        let written = tokio::time::timeout(
            Duration::from_secs(4),
            db.store.lease_complete_batch(&params),
        )
        .await
        .unwrap_or_else(|_| panic!("batch {n} waited for the caller's transaction"))
        .expect("the batch");
        for ((lease, _), result) in batch.iter().zip(&written) {
            if lease.key == "held" {
                assert!(
                    matches!(result, Err(StoreError::KeyBusy { key, .. }) if key == "held"),
                    "batch {n}: {result:?}"
                );
            } else {
                assert!(result.is_ok(), "batch {n}, {}: {result:?}", lease.key);
            }
        }
    }
    assert_eq!(events(&db.store, "clean").await, [RunOutcome::Done]);
    assert_eq!(events(&db.store, "mixed").await, [RunOutcome::Retry]);
    assert_eq!(
        events(&db.store, "held").await,
        [],
        "nothing written for it"
    );
    let it = item(&db.store, "held").await.expect("held");
    assert_eq!(it.state, ItemState::Running, "still its lease's");
    assert_eq!(it.lease_token, Some(held.token));
    tx.commit().await;
    complete(&db.store, &held, Outcome::Done)
        .await
        .expect("sent again, it is written");
    assert_eq!(events(&db.store, "held").await, [RunOutcome::Done]);
    let again = claim(&db.store, s.id, 10).await;
    assert_eq!(
        keys(&again),
        ["held"],
        "the caller's enqueue runs it once more"
    );
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

#[tokio::test]
async fn a_callers_transaction_idle_past_its_own_timeout_is_ended_in_words_and_writes_nothing() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    for (timeout_ms, survives) in [(300, false), (5_000, true)] {
        let options = drover::store::StoreOptions::default()
            .caller_idle_timeout(std::time::Duration::from_millis(timeout_ms));
        let store = Store::connect_with(&db.url, &options)
            .await
            .expect("connect");
        let key = format!("k{timeout_ms}");
        let mut tx = store.begin().await.expect("begin");
        tx.item_enqueue(ItemEnqueue::new(P, [key.as_str()]))
            .await
            .expect("enqueue in the transaction");
        tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
        let next = tx.item_enqueue(ItemEnqueue::new(P, ["later"])).await;
        if survives {
            next.expect("a longer bound lets the caller wait");
            tx.commit().await.expect("commit");
            assert!(item(&store, &key).await.is_some(), "committed");
        } else {
            let err = next.expect_err("the database ended the idle transaction");
            let shown = err.to_string();
            assert!(matches!(err, StoreError::IdleTimeout(_)), "{err:?}");
            assert!(shown.contains("caller_idle_timeout"), "{shown}");
            drop(tx);
            assert!(item(&store, &key).await.is_none(), "nothing written");
        }
        store.close().await;
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}
