//! The store's contract for migrations: idempotent, a newer schema is
//! refused, an old database is converted; on every engine via `support::each_engine`.

mod support;

use drover::store::{
    ErrorGroups, FencingToken, ItemFilter, ItemState, ItemsRetry, Outcome, RunList, RunOutcome,
    SessionStart, Store, StoreEngine as _, StoreError, error_signature,
};
use support::each_engine;
use support::store::{P, claim, complete, enqueue, item};

#[tokio::test]
async fn migrating_again_is_a_no_op_and_a_newer_schema_is_refused() {
    each_engine(|db| async move {
        enqueue(&db.store, &["a"]).await;
        db.store.migrate().await.expect("migrate again");
        db.reconnect()
            .await
            .migrate()
            .await
            .expect("migrate from another node");
        assert!(item(&db.store, "a").await.is_some(), "data kept");
        sqlx_insert_future_migration(&db).await;
        let err = Store::connect(&db.url).await.expect_err("newer schema");
        assert!(
            matches!(err, StoreError::SchemaTooNew { found: 99_999, .. }),
            "{err}"
        );
    })
    .await;
}

/// Pretends a newer drover migrated the database.
async fn sqlx_insert_future_migration(db: &support::TestDb) {
    let sql =
        "INSERT INTO drover_migrations (version, description, success, checksum, execution_time)
               VALUES (99999, 'from the future', true, x'00', 0)";
    let sql = if db.engine == "postgres" {
        sql.replace("x'00'", "'\\x00'::bytea")
    } else {
        sql.to_owned()
    };
    match db.engine {
        "postgres" => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("insert");
        }
        _ => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("insert");
        }
    }
}

/// The tables of a database at schema version 2 (before known keys and runs).
const DROP_ALL: [&str; 15] = [
    "DROP TABLE IF EXISTS drover_lineage",
    "DROP TABLE IF EXISTS drover_prune_turns",
    "DROP TABLE IF EXISTS drover_resync",
    "DROP VIEW IF EXISTS drover_enqueue",
    // SQLite's (PostgreSQL's is a function, dropped with the others).
    "DROP VIEW IF EXISTS drover_trace_link",
    "DROP TABLE IF EXISTS drover_watches",
    "DROP TABLE drover_items",
    "DROP TABLE IF EXISTS drover_item_counts",
    "DROP TABLE IF EXISTS drover_item_count_deltas",
    "DROP TABLE IF EXISTS drover_depth_samples",
    "DROP TABLE drover_runs",
    "DROP TABLE drover_processes",
    "DROP TABLE drover_sessions",
    "DROP TABLE drover_migrations",
    "DROP TABLE IF EXISTS drover_counters",
];

/// An old database's rows, with `{tN}` standing for the Nth second of a day.
const OLD_ROWS: &str = "
INSERT INTO drover_processes (process, created_at) VALUES ('provision', {t0});
INSERT INTO drover_items (process, key, state, ready_at, enqueued_at, failures, last_error)
VALUES ('provision', 'p', 'pending', {t1}, {t1}, 0, NULL),
       ('provision', 'b', 'parked', {t2}, {t2}, 0, 'by hand'),
       ('provision', 'c', 'parked', {t5}, {t5}, 0, 'broken'),
       ('provision', 'vm-42', 'parked', {t5}, {t5}, 0, 'vm-42 down, vm-7 up after 12.5s ٣');
INSERT INTO drover_history (at, process, key, event, session, token, attempt, error, transient)
VALUES ({t1}, 'provision', 'a', 'enqueued', NULL, NULL, NULL, NULL, NULL),
       ({t2}, 'provision', 'a', 'started', 7, 1, 1, NULL, NULL),
       ({t3}, 'provision', 'a', 'failed', 7, 1, 1, 'flaky', {true}),
       ({t4}, 'provision', 'a', 'started', 7, 2, 2, NULL, NULL),
       ({t5}, 'provision', 'a', 'finished', 7, 2, 2, NULL, NULL),
       ({t2}, 'provision', 'b', 'parked', NULL, NULL, NULL, 'by hand', NULL),
       ({t3}, 'provision', 'c', 'started', 7, 3, 1, NULL, NULL),
       ({t5}, 'provision', 'c', 'failed', 7, 3, 1, 'broken', {false}),
       ({t5}, 'provision', 'c', 'parked', 7, 3, 1, 'broken', NULL),
       ({t1}, 'provision', 'd', 'retried', NULL, NULL, NULL, NULL, NULL),
       ({t2}, 'provision', 'd', 'deleted', NULL, NULL, NULL, NULL, NULL)";

/// [`OLD_ROWS`] in `engine`'s SQL, one statement at a time.
fn old_rows(engine: &str) -> Vec<String> {
    let mut sql = OLD_ROWS.to_owned();
    for n in 0..6 {
        let at = if engine == "postgres" {
            format!("'2026-01-01T00:00:0{n}Z'::timestamptz")
        } else {
            (1_767_225_600_000_i64 + n * 1000).to_string()
        };
        sql = sql.replace(&format!("{{t{n}}}"), &at);
    }
    let (yes, no) = if engine == "postgres" {
        ("true", "false")
    } else {
        ("1", "0")
    };
    sql = sql.replace("{true}", yes).replace("{false}", no);
    sql.split(';').map(str::to_owned).collect()
}

/// Rebuilds `db` at schema version 2 with [`OLD_ROWS`] in it.
async fn old_database(db: &support::TestDb) {
    let (old, _dir) = support::migrations_before(db.engine, "0003").await;
    match db.engine {
        "postgres" => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            let drop_sequence = [
                "DROP SEQUENCE drover_lease_tokens",
                "DROP FUNCTION drover_watch, drover_unwatch, drover_watch_row, drover_enqueue, \
                 drover_claim_gated, drover_watch_truncate, drover_watch_install, \
                 drover_channel, drover_observe_lineage, drover_items_trace_run, \
                 drover_trace_link, drover_running_count, drover_items_counted_truncate, \
                 drover_trace_context_valid, drover_claim, drover_claims_paused, drover_watch_check_keys",
            ];
            for sql in DROP_ALL.into_iter().chain(drop_sequence) {
                sqlx::query(sql).execute(&pool).await.expect(sql);
            }
            old.run(&pool).await.expect("migrate to 2");
            for sql in old_rows(db.engine) {
                let q = sqlx::query(sqlx::AssertSqlSafe(sql));
                q.execute(&pool).await.expect("old rows");
            }
        }
        _ => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            for sql in DROP_ALL {
                sqlx::query(sql).execute(&pool).await.expect(sql);
            }
            old.run(&pool).await.expect("migrate to 2");
            for sql in old_rows(db.engine) {
                let q = sqlx::query(sqlx::AssertSqlSafe(sql));
                q.execute(&pool).await.expect("old rows");
            }
        }
    }
}

#[tokio::test]
async fn an_old_database_is_converted_to_known_keys_and_one_row_per_run() {
    each_engine(|db| async move {
        old_database(&db).await;
        let store = Store::connect(&db.url)
            .await
            .expect("migrates to the new shape");
        let runs = |key: &'static str| {
            let store = store.clone();
            async move {
                let list = RunList {
                    process: Some(P.into()),
                    key: Some(key.into()),
                    limit: 10,
                    ..RunList::default()
                };
                let mut runs = store.run_list(list).await.expect("runs");
                runs.reverse();
                runs
            }
        };
        let a = runs("a").await;
        let shape: Vec<_> = a.iter().map(|r| (r.outcome, r.attempt, r.token)).collect();
        assert_eq!(
            shape,
            [
                (RunOutcome::Retry, Some(1), Some(FencingToken(1))),
                (RunOutcome::Done, Some(2), Some(FencingToken(2)))
            ]
        );
        assert_eq!(a[0].error.as_deref(), Some("flaky"));
        assert_eq!(a[0].duration(), Some(std::time::Duration::from_secs(1)));
        let b = runs("b").await;
        assert_eq!(b.len(), 1);
        assert_eq!(
            (b[0].outcome, b[0].actor.as_deref(), b[0].error.as_deref()),
            (RunOutcome::Parked, Some("unknown"), Some("by hand"))
        );
        let c = runs("c").await;
        assert_eq!(c.len(), 1, "a failure and its park are one run: {c:?}");
        assert!(c[0].failed());
        let d: Vec<_> = runs("d").await.iter().map(|r| r.outcome).collect();
        assert_eq!(d, [RunOutcome::Retried, RunOutcome::Deleted]);
        let counts = store.process_counts_all().await.expect("counts");
        let c = &counts[0];
        assert_eq!(
            (c.pending + c.backoff, c.running, c.parked, c.idle),
            (1, 0, 3, 0),
            "the existing items are counted: {counts:?}"
        );
        // The stored errors got their signatures, by the rule the store
        // wrote them with then: the groups count them and an action matches
        // them.
        let vm = error_signature("vm-42", "vm-42 down, vm-7 up after 12.5s ٣");
        assert_eq!(vm, "<key> down, vm-<n> up after <n>.<n>s ٣");
        let groups = store
            .error_groups(ErrorGroups {
                process: P.into(),
                limit: 10,
            })
            .await
            .expect("groups");
        let groups: Vec<_> = groups
            .iter()
            .map(|g| (g.signature.as_str(), g.count))
            .collect();
        // Migration 0009 replaced the key wherever it occurred, the rule of
        // its day; the store now replaces a key only where it stands on its
        // own. A stored signature stays as written until its key fails again.
        let b = "<key>y hand";
        assert_eq!(error_signature("b", "by hand"), "by hand");
        assert_eq!(groups, [(vm.as_str(), 1), (b, 1), ("broken", 1)]);
        let p = item(&store, "p").await.expect("p kept");
        assert_eq!((p.state, p.enqueue_count), (ItemState::Pending, 1));
        assert_eq!(p.last_enqueued_at, Some(p.enqueued_at));
        // And the converted database works: a run leaves its key idle.
        let session = store
            .session_start(SessionStart::new(
                "test",
                std::time::Duration::from_secs(30),
            ))
            .await
            .expect("session");
        let lease = claim(&store, session.id, 10).await.remove(0);
        complete(&store, &lease, Outcome::Done).await.expect("done");
        assert_eq!(
            item(&store, "p").await.map(|p| p.state),
            Some(ItemState::Idle)
        );
        let retry = ItemsRetry::new(ItemFilter::new(P).error_signature(&vm), "admin");
        assert_eq!(store.items_retry_where(retry).await.expect("retry"), 1);
        assert_eq!(
            item(&store, "vm-42").await.map(|i| i.state),
            Some(ItemState::Pending)
        );
        store.close().await;
    })
    .await;
}

/// Migration 0012 rebuilds SQLite's items table (its state CHECK written with
/// `OR`s, which SQLite checks far faster than an `IN` list). A database at
/// version 11 keeps its rows, counts and id sequence, and the constraint, the
/// triggers and the `drover_enqueue` view still hold on the new table.
#[tokio::test]
async fn sqlite_items_rebuilt_for_a_cheap_state_check_keep_rows_counts_and_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, pool) = support::old_sqlite(dir.path(), "v11.db", "0012").await;
    let run = |sql: &'static str| sqlx::query(sql).execute(&pool);
    run("INSERT INTO drover_processes (process, created_at) VALUES ('provision', 0)")
        .await
        .expect("process");
    for key in ["a", "b", "c", "d"] {
        sqlx::query("INSERT INTO drover_enqueue (process, key) VALUES ('provision', ?)")
            .bind(key)
            .execute(&pool)
            .await
            .expect("enqueue through the view");
    }
    run("UPDATE drover_items SET state = 'parked' WHERE key = 'b'")
        .await
        .expect("park");
    // The newest item goes: its id must not be handed out again.
    run("DELETE FROM drover_items WHERE key = 'd'")
        .await
        .expect("delete");
    let deleted_id: i64 =
        sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'drover_items'")
            .fetch_one(&pool)
            .await
            .expect("sequence");
    pool.close().await;

    let store = Store::connect(&url).await.expect("migrates to 12");
    let sqlite = store.sqlite().expect("a SQLite store").pool().clone();
    let check: String =
        sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'drover_items'")
            .fetch_one(&sqlite)
            .await
            .expect("schema");
    assert!(
        check.contains("state = 'pending' OR state = 'running'"),
        "{check}"
    );
    let counts = store.process_counts_all().await.expect("counts");
    let counted: Vec<_> = counts.iter().map(|c| (c.pending, c.parked)).collect();
    assert_eq!(counted, [(2, 1)], "{counts:?}");
    enqueue(&store, &["e"]).await;
    let id: i64 = sqlx::query_scalar("SELECT id FROM drover_items WHERE key = 'e'")
        .fetch_one(&sqlite)
        .await
        .expect("new item");
    assert!(
        id > deleted_id,
        "id {id} reused (the deleted item had {deleted_id})"
    );
    sqlx::query("INSERT INTO drover_enqueue (process, key) VALUES ('provision', 'f')")
        .execute(&sqlite)
        .await
        .expect("the view still enqueues into the new table");
    let bogus = sqlx::query("UPDATE drover_items SET state = 'bogus' WHERE key = 'a'")
        .execute(&sqlite)
        .await;
    assert!(bogus.is_err(), "the state CHECK still holds");
    let counts = store.process_counts_all().await.expect("counts");
    assert_eq!(
        counts[0].pending, 4,
        "{counts:?}: the triggers count the new rows"
    );
    let a = item(&store, "a").await.expect("a is known");
    assert_eq!(a.state, ItemState::Pending);
}

/// Migration 17 (SQLite): a watch made before it, whose table and key
/// column were renamed since, is found and listed by its triggers, gains the
/// triggers that see an `OR REPLACE` (written by the store as it migrates),
/// and leaves its old name free for another table to be watched.
#[tokio::test]
async fn sqlite_watches_made_before_17_follow_renames_and_see_or_replace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, pool) = support::old_sqlite(dir.path(), "v16.db", "0017").await;
    // A watch as drover made it before: a record and three triggers.
    let enqueue = |row: &str| {
        format!(
            "INSERT INTO drover_enqueue (process, key) SELECT 'provision', \
             CAST({row}.\"id\" AS TEXT) WHERE {row}.\"id\" IS NOT NULL;"
        )
    };
    let old_watch = [
        "CREATE TABLE machines (id TEXT PRIMARY KEY, serial TEXT UNIQUE)".to_owned(),
        "INSERT INTO machines VALUES ('a', 's1')".to_owned(),
        "INSERT INTO drover_watches (id, relation, process, key_column, columns, created_at) \
         VALUES (1, 'machines', 'provision', 'id', NULL, 0)"
            .to_owned(),
        format!(
            "CREATE TRIGGER \"drover_watch_1_insert\" AFTER INSERT ON \"machines\" BEGIN {} END",
            enqueue("NEW")
        ),
        format!(
            "CREATE TRIGGER \"drover_watch_1_update\" AFTER UPDATE ON \"machines\" BEGIN \
             INSERT INTO drover_enqueue (process, key) SELECT 'provision', \
             CAST(OLD.\"id\" AS TEXT) WHERE OLD.\"id\" IS NOT NULL AND OLD.\"id\" IS NOT \
             NEW.\"id\"; {} END",
            enqueue("NEW")
        ),
        format!(
            "CREATE TRIGGER \"drover_watch_1_delete\" AFTER DELETE ON \"machines\" BEGIN {} END",
            enqueue("OLD")
        ),
        "ALTER TABLE machines RENAME TO hosts".to_owned(),
        "ALTER TABLE hosts RENAME COLUMN id TO ident".to_owned(),
    ];
    for sql in old_watch {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    pool.close().await;

    let store = Store::connect(&url).await.expect("migrates to 17");
    let listed = store.table_watches().await.expect("list");
    let listed: Vec<_> = listed.iter().map(|w| (&*w.table, &*w.key_column)).collect();
    assert_eq!(listed, [("hosts", "ident")], "as its triggers are now");
    let sqlite = store.sqlite().expect("a SQLite store").pool().clone();
    sqlx::query("INSERT OR REPLACE INTO hosts VALUES ('b', 's1')")
        .execute(&sqlite)
        .await
        .expect("replace");
    for key in ["a", "b"] {
        let state = item(&store, key).await.map(|i| i.state);
        assert_eq!(state, Some(ItemState::Pending), "{key}");
    }
    sqlx::query("CREATE TABLE machines (id TEXT)")
        .execute(&sqlite)
        .await
        .expect("a new table under the old name");
    let watch = drover::store::TableWatch::new("machines", P, "id");
    store.table_watch(&watch).await.expect("watched on its own");
    let unwatched = store.table_unwatch("hosts").await.expect("unwatch");
    assert_eq!(unwatched.as_deref(), Some("hosts"));
    store.close().await;
}

/// Migration 26 (SQLite): a watch made before it, whose update trigger
/// compared the key and filter columns by the column's collation, is made
/// again as the store migrates, so a key that moves by its case only under
/// `COLLATE NOCASE` enqueues its old key and its new one, and keeps its
/// filter. The old watch is the one this version writes with `COLLATE
/// BINARY` and the key's test taken out of its `WHEN` (what the store wrote
/// before), on a file whose record of migration 26 is taken out.
#[tokio::test]
async fn sqlite_watches_made_before_26_see_a_key_move_by_its_case() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("v25.db").display());
    let store = Store::connect(&url).await.expect("connect");
    let pool = store.sqlite().expect("a SQLite store").pool().clone();
    let run = async |sql: &str| {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    };
    run("CREATE TABLE machines (id TEXT COLLATE NOCASE PRIMARY KEY, status TEXT)").await;
    run("INSERT INTO machines VALUES ('M1', 'new')").await;
    let watch = drover::store::TableWatch::new("machines", P, "id").columns(["status"]);
    store.table_watch(&watch).await.expect("watch");
    let update: String = sqlx::query_scalar(
        "SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND name LIKE 'drover_watch_%_update'",
    )
    .fetch_one(&pool)
    .await
    .expect("the update trigger");
    // As the oldest filtered watches were: no `COLLATE BINARY`, and the
    // filter columns alone in the `WHEN` (the key joined them later).
    let before = update
        .replace(" COLLATE BINARY", "")
        .replace("WHEN OLD.\"id\" IS NOT NEW.\"id\" OR ", "WHEN ");
    assert!(
        before.contains("WHEN OLD.\"status\" IS NOT NEW.\"status\" BEGIN"),
        "the trigger as the store writes it now: {update}"
    );
    // One transaction, one connection: the pool's other connections may
    // still hold the schema from before the drop.
    let mut tx = pool.begin().await.expect("begin");
    for sql in [
        "DROP TRIGGER \"drover_watch_1_update\"",
        &before,
        "DELETE FROM drover_migrations WHERE version = 26",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    tx.commit().await.expect("commit");
    // As the old trigger does: a move by case only is no change.
    run("UPDATE machines SET id = 'm1'").await;
    for key in ["M1", "m1"] {
        assert!(
            item(&store, key).await.is_none(),
            "{key} under the old trigger"
        );
    }
    run("UPDATE machines SET id = 'M1'").await;
    store.close().await;

    let store = Store::connect(&url).await.expect("migrates to 26");
    let pool = store.sqlite().expect("a SQLite store").pool().clone();
    sqlx::query("UPDATE machines SET id = 'm1'")
        .execute(&pool)
        .await
        .expect("a move by case");
    for key in ["M1", "m1"] {
        let state = item(&store, key).await.map(|i| i.state);
        assert_eq!(state, Some(ItemState::Pending), "{key}");
    }
    let listed = store.table_watches().await.expect("list");
    let listed: Vec<_> = listed
        .iter()
        .map(|w| (&*w.key_column, &w.columns))
        .collect();
    assert_eq!(
        listed,
        [("id", &vec!["status".to_owned()])],
        "its filter kept"
    );
    store.close().await;
}

/// Migration 25 (SQLite): numbers the view `drover_enqueue` stored unchecked
/// before it (a priority past an i32, text or bytes or a fraction for a
/// priority, a REAL ready time from a fractional delay or one that overflowed,
/// a REAL creation time from a fractional clock offset), and a time written
/// straight into `drover_items` as text, are made integers. The claim that met
/// such a row committed its leases and then failed to read them (on a limited
/// process, every claim failed); now it hands out every key, and the lists
/// read every row. The counts are untouched.
#[tokio::test]
async fn sqlite_numbers_the_enqueue_stored_unchecked_before_25_are_made_integers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, pool) = support::old_sqlite(dir.path(), "v24.db", "0025").await;
    let old_enqueues = [
        ("big", "priority", "5000000000"),
        ("below", "priority", "-5000000000"),
        ("high", "priority", "'high'"),
        ("fraction", "priority", "1.5"),
        ("bytes", "priority", "X'00'"),
        ("half", "delay_ms", "0.5"),
        ("never", "delay_ms", "9223372036854775807"),
        ("offset", "clock_offset_ms", "0.5"),
    ];
    for (key, column, value) in old_enqueues {
        let sql = format!(
            "INSERT INTO drover_enqueue (process, key, {column}) VALUES ('{P}', '{key}', {value})"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("the old view took {column} = {value}: {e}"));
    }
    sqlx::query(
        "INSERT INTO drover_enqueue (process, key, clock_offset_ms) VALUES ('other', 'k', 0.5)",
    )
    .execute(&pool)
    .await
    .expect("a process made at a REAL time");
    // Text in an INTEGER column stays text: only hand-written SQL does this.
    sqlx::query(
        "INSERT INTO drover_items (process, key, state, ready_at, enqueued_at)
         VALUES (?1, 'text-times', 'pending', 'soon', 'then')",
    )
    .bind(P)
    .execute(&pool)
    .await
    .expect("a row written straight into the table");
    let bad: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_items WHERE typeof(priority) <> 'integer'
            OR priority NOT BETWEEN -2147483648 AND 2147483647
            OR typeof(ready_at) <> 'integer' OR typeof(enqueued_at) <> 'integer'",
    )
    .fetch_one(&pool)
    .await
    .expect("bad rows");
    assert_eq!(bad, 10, "the old view stored them as given");
    pool.close().await;

    let store = Store::connect(&url).await.expect("migrates to 25");
    let sqlite = store.sqlite().expect("a SQLite store").pool().clone();
    let counts = store.process_counts_all().await.expect("counts");
    let counted: Vec<_> = counts
        .iter()
        .map(|c| (c.process.as_str(), c.pending, c.running))
        .collect();
    assert_eq!(counted, [("other", 1, 0), (P, 9, 0)], "counts untouched");
    let types: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT typeof(priority), typeof(ready_at) || ' ' || typeof(enqueued_at)
             || ' ' || typeof(first_enqueued_at) || ' ' || typeof(last_enqueued_at)
         FROM drover_items
         UNION SELECT DISTINCT 'process', typeof(created_at) FROM drover_processes
         ORDER BY 1, 2",
    )
    .fetch_all(&sqlite)
    .await
    .expect("types");
    let types: Vec<_> = types
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        types,
        [
            ("integer", "integer integer integer integer"),
            ("integer", "integer integer null null"),
            ("process", "integer"),
        ],
        "every number is an integer"
    );
    let listed = store
        .item_list(drover::store::ItemList {
            process: P.into(),
            state: None,
            after_key: None,
            limit: 100,
        })
        .await
        .expect("the list reads every row");
    assert_eq!(listed.len(), 9);

    // A limited process: its claim reads the highest pending priority first.
    let limited = drover::store::ProcessConfigure::new(P).concurrency(Some(100));
    store.process_configure(limited).await.expect("limit");
    let s = store
        .session_start(SessionStart::new(
            "test",
            std::time::Duration::from_secs(30),
        ))
        .await
        .expect("session");
    let leases = claim(&store, s.id, 20).await;
    let claimed: Vec<_> = leases
        .iter()
        .map(|l| (l.key.as_str(), l.priority))
        .collect();
    assert_eq!(
        claimed[..2],
        [("big", i32::MAX), ("fraction", 1)],
        "a priority past an i32 is clamped, a fraction cut: {claimed:?}"
    );
    assert_eq!(claimed.last(), Some(&("below", i32::MIN)), "{claimed:?}");
    let mut zero: Vec<_> = claimed[2..claimed.len() - 1].to_vec();
    zero.sort_unstable();
    assert_eq!(
        zero,
        [
            ("bytes", 0),
            ("half", 0),
            ("high", 0),
            ("offset", 0),
            ("text-times", 0)
        ],
        "a priority that is no number is 0; text times are now, so ready; \
         the overflowed delay still waits"
    );
    let never = item(&store, "never").await.expect("never is known");
    assert_eq!(never.state, ItemState::Pending);
    assert_eq!(never.ready_at, chrono::DateTime::<chrono::Utc>::MAX_UTC);
    store.close().await;
}

/// Migration 13 (PostgreSQL): the watches made before it are recorded by
/// their tables' oids: one under the name it was watched under, and one whose
/// table was renamed before the upgrade, by the one unrecorded trigger of
/// this installation with its process and key column. Both are listed and
/// unwatched under their tables' names now; one whose table is gone keeps
/// its old name until unwatched.
#[tokio::test]
async fn postgres_watches_made_before_13_are_found_by_their_tables() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (url, schema) = support::postgres_schema(&base).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (old, _dir) = support::migrations_before("postgres", "0013").await;
    old.run(&pool).await.expect("migrate to 12");
    let old_watches = [
        "CREATE TABLE machines (id text)",
        "CREATE TABLE racks (name text)",
        "CREATE TABLE dropped (k text)",
        "SELECT drover_watch('machines', 'provision', 'id')",
        "SELECT drover_watch('racks', 'provision', 'name')",
        "SELECT drover_watch('dropped', 'provision', 'k')",
        "ALTER TABLE racks RENAME TO shelves",
        "DROP TABLE dropped",
    ];
    for sql in old_watches {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    let store = Store::connect(&url).await.expect("migrates to 13");
    let listed = store.table_watches().await.expect("list");
    let listed: Vec<_> = listed.iter().map(|w| w.table.clone()).collect();
    let named = |table: &str| format!("{schema}.{table}");
    assert_eq!(
        listed,
        [named("dropped"), named("machines"), named("shelves")]
    );
    for table in ["shelves", "machines"] {
        let unwatched = store.table_unwatch(table).await.expect("unwatch");
        assert_eq!(unwatched, Some(named(table)));
    }
    let forgotten = store
        .table_unwatch(&named("dropped"))
        .await
        .expect("unwatch");
    assert_eq!(forgotten, Some(named("dropped")));
    assert!(store.table_watches().await.expect("list").is_empty());
    let triggers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid IN ('machines'::regclass, 'shelves'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .expect("triggers");
    assert_eq!(triggers, 0, "unwatched tables carry no trigger");
    store.close().await;
    pool.close().await;
    support::drop_schema(&base, &schema).await;
}

/// Migration 32 (PostgreSQL): the watches made before it are installed
/// again: a filtered one compares its columns as written (a key moved by its
/// case only under a case-insensitive collation enqueues both keys), and a
/// partitioned table's partitions get its `TRUNCATE` trigger (a partition
/// truncated by itself enqueues its keys). A watch whose filter names a
/// column gone since is left as it was.
#[tokio::test]
async fn postgres_watches_made_before_32_compare_as_written_and_follow_partitions() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (url, schema) = support::postgres_schema(&base).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (old, _dir) = support::migrations_before("postgres", "0032").await;
    old.run(&pool).await.expect("migrate to 31");
    let collation = support::process_name("ci");
    let old_watches = [
        format!(
            "CREATE COLLATION {collation} (provider = icu, locale = 'und-u-ks-level2', \
             deterministic = false)"
        ),
        format!("CREATE TABLE machines (id text COLLATE {collation}, status text)"),
        "INSERT INTO machines VALUES ('M1', 'new')".to_owned(),
        "SELECT drover_watch('machines', 'provision', 'id', ARRAY['status'])".to_owned(),
        "CREATE TABLE parts (id text, at int) PARTITION BY RANGE (at)".to_owned(),
        "CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10)".to_owned(),
        "INSERT INTO parts VALUES ('a', 1), ('b', 2)".to_owned(),
        "SELECT drover_watch('parts', 'archive', 'id')".to_owned(),
        "CREATE TABLE gone (id text, status text)".to_owned(),
        "SELECT drover_watch('gone', 'provision', 'id', ARRAY['status'])".to_owned(),
        "ALTER TABLE gone RENAME COLUMN status TO state".to_owned(),
    ];
    for sql in old_watches {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let gone_trigger = "SELECT pg_get_triggerdef(oid) FROM pg_trigger \
                        WHERE tgrelid = 'gone'::regclass AND tgname = 'drover_watch_update'";
    let gone_before: String = sqlx::query_scalar(gone_trigger)
        .fetch_one(&pool)
        .await
        .expect("the gone watch's trigger");
    let store = Store::connect(&url).await.expect("migrates to 32");
    for sql in ["UPDATE machines SET id = 'm1'", "TRUNCATE parts_1"] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    let keys = |process: &'static str| {
        let store = store.clone();
        async move {
            let items = store
                .item_list(drover::store::ItemList {
                    process: process.into(),
                    state: None,
                    after_key: None,
                    limit: 10,
                })
                .await
                .unwrap_or_else(|e| match e {
                    StoreError::UnknownProcess(_) => Vec::new(), // nothing enqueued to it
                    e => panic!("items: {e}"),
                });
            items.into_iter().map(|i| i.key).collect::<Vec<_>>()
        }
    };
    assert_eq!(keys("provision").await, ["M1", "m1"], "a move by case only");
    assert_eq!(keys("archive").await, ["a", "b"], "a partition truncated");
    let gone_after: String = sqlx::query_scalar(gone_trigger)
        .fetch_one(&pool)
        .await
        .expect("the gone watch's trigger");
    assert_eq!(
        gone_after, gone_before,
        "a watch naming a gone column is left"
    );
    store.close().await;
    pool.close().await;
    support::drop_schema(&base, &schema).await;
}

/// PostgreSQL migration 0033 brings a rate limit stored before the store
/// refused ones below [`MIN_RATE_PER_S`](drover::store::MIN_RATE_PER_S) up
/// to it: with such a rate every claim of its process failed in the gated
/// claim's refill ("value out of range: underflow"), so the process never ran
/// again. Hand-written SQL cannot store one again.
#[tokio::test]
async fn postgres_rates_stored_too_small_before_33_are_raised_to_the_least() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (url, schema) = support::postgres_schema(&base).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let (old, _dir) = support::migrations_before("postgres", "0033").await;
    old.run(&pool).await.expect("migrate to 32");
    for sql in [
        format!("SELECT drover_enqueue('{P}', ARRAY['a', 'b'])"),
        // Half a token left a moment ago: the next claim must refill.
        format!(
            "UPDATE drover_processes SET rate_per_s = 5e-324, rate_burst = 1, \
             rate_tokens = 0.5, rate_tokens_at = now() WHERE process = '{P}'"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let store = Store::connect(&url).await.expect("migrates to 33");
    let session = store
        .session_start(SessionStart::new(
            "test",
            std::time::Duration::from_secs(30),
        ))
        .await
        .expect("session");
    let claimed = store
        .lease_claim(drover::store::LeaseClaim {
            session: session.id,
            process: P.into(),
            max: 2,
            trace_links: false,
        })
        .await
        .expect("a claim of the process with the old rate");
    assert!(claimed.leases.is_empty(), "half a token is no run");
    let settings = store
        .process_get(P)
        .await
        .expect("settings")
        .expect("known");
    let rate = settings.limits.rate.expect("still limited");
    assert_eq!(rate.per_second, drover::store::MIN_RATE_PER_S);
    let err = sqlx::query("UPDATE drover_processes SET rate_per_s = 1e-300")
        .execute(&pool)
        .await
        .expect_err("a rate below the least, by hand");
    assert!(
        err.to_string().contains("drover_processes_rate_bounds"),
        "{err}"
    );
    store.close().await;
    pool.close().await;
    support::drop_schema(&base, &schema).await;
}

/// PostgreSQL migration 0022 makes `drover_enqueue` again with a `context`
/// parameter: the grants an operator gave on the old function (EXECUTE
/// revoked from PUBLIC, granted to the writers' role) hold on the new one.
#[tokio::test]
async fn the_enqueue_functions_grants_survive_its_new_parameter() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (url, schema) = support::postgres_schema(&base).await;
    let role = support::process_name("drover_writer");
    support::admin_execute(&base, &format!("CREATE ROLE {role}")).await;
    let (old, _dir) = support::migrations_before("postgres", "0022").await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    old.run(&pool).await.expect("migrate to 0021");
    let before = "drover_enqueue(text, text[], integer, bigint, boolean, bigint)";
    for sql in [
        format!("REVOKE ALL ON FUNCTION {before} FROM PUBLIC"),
        format!("GRANT EXECUTE ON FUNCTION {before} TO {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .expect("grant");
    }
    let store = Store::connect(&url).await.expect("migrates");
    let after = "drover_enqueue(text, text[], integer, bigint, boolean, bigint, text)";
    let may = |who: &str| {
        let sql = format!("SELECT has_function_privilege('{who}', '{after}', 'EXECUTE')");
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("privilege")
        }
    };
    assert!(may(&role).await, "the writers' role may still enqueue");
    // A role of no grant of its own has only what PUBLIC has.
    let other = support::process_name("drover_other");
    support::admin_execute(&base, &format!("CREATE ROLE {other}")).await;
    assert!(!may(&other).await, "PUBLIC may not enqueue again");
    store.close().await;
    pool.close().await;
    support::drop_schema(&base, &schema).await;
    support::admin_execute(&base, &format!("DROP ROLE {role}, {other}")).await;
}
