//! Table watching on every engine: a watched table's inserts, updates and
//! deletes enqueue their keys in the transaction that made them, filtered
//! updates do not, bad watches are refused with one line and install nothing,
//! and under 10,000 concurrent updates every changed key runs after its last
//! change while coalescing keeps runs far below updates.

mod support;

use std::collections::HashMap;
use std::process::Output;
use std::sync::{Arc, Mutex};

use drover::store::{
    ItemState, LeaseClaim, LeaseComplete, Outcome, SessionId, StoreEngine as _, StoreError,
    TableWatch,
};
use support::caller_tx::CallerTx;
use support::store::{P, claim, complete, item, keys};
use support::{TestDb, each_enqueue_path};
use tokio::sync::mpsc;

/// The user's table: machines with a key, a watched column and another one.
async fn machines(db: &TestDb) {
    db.execute("CREATE TABLE machines (id TEXT UNIQUE, wanted TEXT, note TEXT)")
        .await;
}

/// Whether `key` is pending.
async fn pending(db: &TestDb, key: &str) -> bool {
    item(&db.store, key)
        .await
        .is_some_and(|i| i.state == ItemState::Pending)
}

/// Claims every ready key and finishes it: the keys, sorted.
async fn drain(db: &TestDb) -> Vec<String> {
    let s = db.session().await;
    let leases = claim(&db.store, s.id, 100).await;
    for lease in &leases {
        complete(&db.store, lease, Outcome::Done)
            .await
            .expect("done");
    }
    let mut keys: Vec<_> = keys(&leases).into_iter().map(str::to_owned).collect();
    keys.sort();
    keys
}

/// The error `sql` fails with on the store's pool, or `None` if it succeeds.
async fn failure(db: &TestDb, sql: &str) -> Option<String> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let result = if let Some(pool) = db.store.postgres_pool() {
        sqlx::query(sql).execute(pool).await.map(drop)
    } else {
        let pool = db.store.sqlite_pool().expect("an engine");
        sqlx::query(sql).execute(pool).await.map(drop)
    };
    result.err().map(|e| e.to_string())
}

/// Whether `sql` succeeds on the store's pool.
async fn succeeds(db: &TestDb, sql: &str) -> bool {
    failure(db, sql).await.is_none()
}

#[tokio::test]
async fn a_watched_table_enqueues_each_change_in_its_transaction_and_filters_updates() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let watch = TableWatch::new("machines", P, "id").columns(["wanted"]);
        db.store.table_watch(&watch).await.expect("watch");
        let mut tx = CallerTx::begin(&db.store).await;
        tx.execute("INSERT INTO machines VALUES ('m0', 'on', '')")
            .await;
        tx.rollback().await;
        assert!(
            item(&db.store, "m0").await.is_none(),
            "a rollback enqueues nothing"
        );
        let mut tx = CallerTx::begin(&db.store).await;
        tx.execute(
            "INSERT INTO machines VALUES ('m1', 'on', ''), ('m2', 'on', ''), (NULL, 'x', '')",
        )
        .await;
        tx.commit().await;
        assert_eq!(
            drain(&db).await,
            ["m1", "m2"],
            "inserts enqueue; a NULL key does not"
        );
        db.execute("UPDATE machines SET note = 'seen'").await;
        db.execute("UPDATE machines SET wanted = 'on'").await; // no change
        assert!(
            drain(&db).await.is_empty(),
            "updates of other columns are filtered"
        );
        db.execute("UPDATE machines SET wanted = 'off' WHERE id = 'm1'")
            .await;
        db.execute("DELETE FROM machines WHERE id = 'm2'").await;
        assert_eq!(
            drain(&db).await,
            ["m1", "m2"],
            "an update and a delete enqueue"
        );
        db.execute("UPDATE machines SET id = 'm3', wanted = 'on' WHERE id = 'm1'")
            .await;
        assert_eq!(drain(&db).await, ["m1", "m3"], "a moved key enqueues both");
        let empty = "INSERT INTO machines VALUES ('', 'on', '')";
        assert!(
            !succeeds(&db, empty).await,
            "a key drover refuses fails the change"
        );
        // Only SQLite's text can hold bytes that are not UTF-8.
        let bytes = "INSERT INTO machines VALUES (CAST(X'6DFF' AS TEXT), 'on', '')";
        assert!(
            db.engine != "sqlite" || !succeeds(&db, bytes).await,
            "a key that is not UTF-8 fails the change"
        );
        assert_eq!(drain(&db).await, Vec::<String>::new());
        let listed = db.store.table_watches().await.expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].columns.clone(), listed[0].process.as_str()),
            (vec!["wanted".to_owned()], P)
        );
        let unwatched = db.store.table_unwatch("machines").await.expect("unwatch");
        assert!(unwatched.is_some_and(|t| t.ends_with("machines")));
        db.execute("INSERT INTO machines VALUES ('m4', 'on', '')")
            .await;
        assert!(
            !pending(&db, "m4").await,
            "an unwatched table enqueues nothing"
        );
        assert!(db.store.table_watches().await.expect("list").is_empty());
        assert_eq!(
            db.store.table_unwatch("machines").await.expect("unwatch"),
            None
        );
    })
    .await;
}

#[tokio::test]
async fn a_key_that_moves_is_seen_under_a_filter_and_a_truncate_enqueues_every_key() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let watch = TableWatch::new("machines", P, "id").columns(["wanted"]);
        db.store.table_watch(&watch).await.expect("watch");
        db.execute("INSERT INTO machines VALUES ('m1', 'on', ''), ('m2', 'on', '')")
            .await;
        assert_eq!(drain(&db).await, ["m1", "m2"]);
        db.execute("UPDATE machines SET id = 'm9' WHERE id = 'm1'")
            .await;
        assert_eq!(
            drain(&db).await,
            ["m1", "m9"],
            "only the key changed, outside the filter: both keys run"
        );
        if db.engine == "postgres" {
            db.execute("TRUNCATE machines").await;
            assert_eq!(
                drain(&db).await,
                ["m2", "m9"],
                "a truncate enqueues every key"
            );
            db.execute("INSERT INTO machines VALUES ('m5', 'on', '')")
                .await;
            drain(&db).await;
            db.store.table_unwatch("machines").await.expect("unwatch");
            db.execute("TRUNCATE machines").await;
            assert!(
                drain(&db).await.is_empty(),
                "unwatched, a truncate enqueues nothing"
            );
        }
    })
    .await;
}

/// `ALTER TABLE … RENAME` keeps the triggers on the table: the watch goes
/// with it, is listed and unwatched under its new name, and the old name is
/// free for another table to be watched.
#[tokio::test]
async fn a_renamed_table_stays_watched_under_its_new_name_and_can_be_unwatched() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let watch = TableWatch::new("machines", P, "id").columns(["wanted"]);
        db.store.table_watch(&watch).await.expect("watch");
        db.execute("ALTER TABLE machines RENAME TO hosts").await;
        db.execute("INSERT INTO hosts VALUES ('h1', 'on', '')")
            .await;
        assert_eq!(drain(&db).await, ["h1"], "the triggers went with the table");
        let listed = db.store.table_watches().await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].table.ends_with("hosts"), "{listed:?}");
        refused(&db, TableWatch::new("hosts", P, "id"), "already watched").await;
        assert_eq!(
            db.store.table_unwatch("machines").await.expect("unwatch"),
            None,
            "no table is called machines now"
        );
        machines(&db).await;
        db.store
            .table_watch(&TableWatch::new("machines", "other", "id"))
            .await
            .expect("a new table under the old name is watched on its own");
        let unwatched = db.store.table_unwatch("hosts").await.expect("unwatch");
        assert!(
            unwatched.is_some_and(|t| t.ends_with("hosts")),
            "unwatched under its new name"
        );
        db.execute("INSERT INTO hosts VALUES ('h2', 'on', '')")
            .await;
        assert!(!pending(&db, "h2").await, "its triggers are gone");
        db.store
            .table_watch(&TableWatch::new("hosts", P, "id"))
            .await
            .expect("watched again");
        db.execute("INSERT INTO hosts VALUES ('h3', 'on', '')")
            .await;
        assert_eq!(drain(&db).await, ["h3"]);
        let listed = db.store.table_watches().await.expect("list");
        let listed: Vec<_> = listed
            .iter()
            .map(|w| (w.table.rsplit('.').next().unwrap_or_default(), &*w.process))
            .collect();
        assert_eq!(listed, [("hosts", P), ("machines", "other")]);
    })
    .await;
}

/// PostgreSQL's triggers name the key column as it was: once it is renamed
/// or dropped, a change of the table fails, saying what to do, rather than
/// enqueueing nothing, and the listing names the columns gone. SQLite
/// rewrites the triggers on a rename of a column (the watch follows it and
/// is listed under the new names) and refuses to drop a column they use.
#[tokio::test]
async fn a_renamed_or_dropped_key_column_is_followed_or_fails_the_change_never_silently() {
    each_enqueue_path(|db| async move {
        db.execute("CREATE TABLE machines (id TEXT, wanted TEXT, note TEXT)")
            .await;
        let watch = TableWatch::new("machines", P, "id").columns(["wanted"]);
        db.store.table_watch(&watch).await.expect("watch");
        db.execute("INSERT INTO machines VALUES ('m1', 'on', '')")
            .await;
        assert_eq!(drain(&db).await, ["m1"]);
        db.execute(r#"ALTER TABLE machines RENAME COLUMN id TO "i""d""#)
            .await;
        db.execute(r#"ALTER TABLE machines RENAME COLUMN wanted TO "want; ed""#)
            .await;
        let listed = db.store.table_watches().await.expect("list").remove(0);
        let list = drover(&db, &["watch", "--list"]);
        let list = String::from_utf8_lossy(&list.stdout);
        if db.engine == "sqlite" {
            assert_eq!(
                (&*listed.key_column, &listed.columns[..], &listed.gone[..]),
                ("i\"d", &["want; ed".to_owned()][..], &[][..]),
                "listed as the triggers are now"
            );
            assert!(
                list.contains("machines: i\"d -> provision (updates of want; ed)\n"),
                "{list}"
            );
            db.execute("INSERT INTO machines VALUES ('m2', 'on', '')")
                .await;
            db.execute(r#"UPDATE machines SET "want; ed" = 'off' WHERE "i""d" = 'm1'"#)
                .await;
            db.execute("UPDATE machines SET note = 'filtered'").await;
            assert_eq!(drain(&db).await, ["m1", "m2"], "the triggers followed");
            let refusal = failure(&db, r#"ALTER TABLE machines DROP COLUMN "i""d""#)
                .await
                .expect("SQLite refuses to drop a column the triggers use");
            assert!(refusal.contains("drover_watch_"), "{refusal}");
            return;
        }
        assert_eq!(listed.gone, ["id", "wanted"], "{listed:?}");
        assert!(
            list.contains("gone from the table: id, wanted (run drover unwatch"),
            "{list}"
        );
        let changes = [
            "INSERT INTO machines VALUES ('m2', 'on', '')",
            r#"UPDATE machines SET "want; ed" = 'off'"#,
            "DELETE FROM machines",
            "TRUNCATE machines",
        ];
        for change in changes {
            let error = failure(&db, change).await;
            let error = error.unwrap_or_else(|| panic!("{change} must fail, not enqueue nothing"));
            assert!(
                error.contains(
                    r#"machines: key column "id" is gone (renamed or dropped); run drover unwatch "#
                ),
                "{change}: {error}"
            );
        }
        assert!(
            succeeds(&db, "UPDATE machines SET note = 'filtered'").await,
            "an update the filter leaves out does not fire"
        );
        assert!(drain(&db).await.is_empty());
        let unwatched = db.store.table_unwatch("machines").await.expect("unwatch");
        assert!(unwatched.is_some());
        let watch = TableWatch::new("machines", P, "i\"d");
        db.store.table_watch(&watch).await.expect("watched again");
        db.execute("INSERT INTO machines VALUES ('m3', 'on', '')")
            .await;
        assert_eq!(drain(&db).await, ["m3"]);
        db.execute(r#"ALTER TABLE machines DROP COLUMN "i""d""#)
            .await;
        let error = failure(&db, "INSERT INTO machines VALUES ('on', '')").await;
        let error = error.expect("a change of a table whose key column was dropped fails");
        assert!(error.contains(r#"key column "i""d" is gone"#), "{error}");
        let listed = db.store.table_watches().await.expect("list").remove(0);
        assert_eq!(listed.gone, ["i\"d"]);
    })
    .await;
}

/// SQLite's `OR REPLACE` deletes the rows the new values collide with on a
/// unique index without firing their delete trigger (the writer's
/// `recursive_triggers` is off): their keys are enqueued before the change,
/// whichever unique index (a collation's, the rowid, a WITHOUT ROWID
/// table's key) they collide on, and an update does not count its own row.
#[tokio::test]
async fn an_or_replace_enqueues_the_keys_of_the_rows_it_deletes() {
    each_enqueue_path(|db| async move {
        if db.engine != "sqlite" {
            return; // PostgreSQL has no OR REPLACE; its upsert is an update.
        }
        db.execute(
            "CREATE TABLE machines (id TEXT PRIMARY KEY, serial TEXT COLLATE NOCASE UNIQUE, \
             note TEXT)",
        )
        .await;
        db.execute("INSERT INTO machines VALUES ('a', 's1', ''), ('b', 's2', '')")
            .await;
        let watch = TableWatch::new("machines", P, "id");
        db.store.table_watch(&watch).await.expect("watch");
        db.execute("INSERT OR REPLACE INTO machines VALUES ('c', 'S1', '')")
            .await;
        assert_eq!(drain(&db).await, ["a", "c"], "a was replaced by c");
        db.execute("UPDATE OR REPLACE machines SET serial = 's2' WHERE id = 'c'")
            .await;
        assert_eq!(drain(&db).await, ["b", "c"], "b was replaced by c");
        db.execute("REPLACE INTO machines VALUES ('d', 's2', '')")
            .await;
        assert_eq!(drain(&db).await, ["c", "d"]);
        db.execute("UPDATE OR REPLACE machines SET note = 'x' WHERE id = 'd'")
            .await;
        assert_eq!(
            drain(&db).await,
            ["d"],
            "an update collides not with itself"
        );
        db.execute("CREATE TABLE racks (n INTEGER PRIMARY KEY, name TEXT)")
            .await;
        db.execute("INSERT INTO racks VALUES (1, 'r1')").await;
        let racks = TableWatch::new("racks", P, "name");
        db.store.table_watch(&racks).await.expect("watch racks");
        db.execute("INSERT OR REPLACE INTO racks VALUES (1, 'r2')")
            .await;
        assert_eq!(drain(&db).await, ["r1", "r2"], "on the rowid");
        db.execute("CREATE TABLE slots (k TEXT PRIMARY KEY, u TEXT UNIQUE) WITHOUT ROWID")
            .await;
        db.execute("INSERT INTO slots VALUES ('x', 'u1'), ('y', 'u2')")
            .await;
        let slots = TableWatch::new("slots", P, "k");
        db.store.table_watch(&slots).await.expect("watch slots");
        db.execute("UPDATE OR REPLACE slots SET u = 'u2' WHERE k = 'x'")
            .await;
        assert_eq!(drain(&db).await, ["x", "y"], "WITHOUT ROWID");
        db.execute("UPDATE OR REPLACE slots SET u = 'u2' WHERE k = 'x'")
            .await;
        assert_eq!(drain(&db).await, ["x"], "its own key only");
        let unwatched = db.store.table_unwatch("machines").await.expect("unwatch");
        assert!(unwatched.is_some());
        db.execute("INSERT OR REPLACE INTO machines VALUES ('e', 's2', '')")
            .await;
        assert!(
            drain(&db).await.is_empty(),
            "unwatched: every trigger is gone"
        );
    })
    .await;
}

/// A writer whose `search_path` does not name drover's schema, and names one
/// with a `drover_enqueue` of its own, changes a watched table: drover's
/// enqueue runs, the impostor does not.
#[tokio::test]
async fn a_writer_with_another_search_path_is_seen_and_cannot_redirect_the_trigger() {
    each_enqueue_path(|db| async move {
        if db.engine != "postgres" {
            return; // SQLite has no schemas or search path.
        }
        machines(&db).await;
        let watch = TableWatch::new("machines", P, "id");
        db.store.table_watch(&watch).await.expect("watch");
        let pool = db.store.postgres_pool().expect("postgres");
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(pool)
            .await
            .expect("schema");
        let impostor = format!("{schema}_impostor");
        let writer = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
        let setup = [
            format!("CREATE SCHEMA \"{impostor}\""),
            format!(
                "CREATE FUNCTION \"{impostor}\".drover_enqueue(p text, k text[]) RETURNS void \
                 LANGUAGE sql AS $$ SELECT 1/0 $$"
            ),
        ];
        for sql in setup {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&writer)
                .await
                .expect("set-up");
        }
        let mut conn = writer.acquire().await.expect("a connection");
        let path = format!("SET search_path = \"{impostor}\"");
        sqlx::query(sqlx::AssertSqlSafe(path))
            .execute(&mut *conn)
            .await
            .expect("path");
        let insert = format!("INSERT INTO \"{schema}\".machines VALUES ('w1', 'on', '')");
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .execute(&mut *conn)
            .await
            .expect("the writer's change succeeds");
        drop(conn);
        let drop_it = format!("DROP SCHEMA \"{impostor}\" CASCADE");
        sqlx::query(sqlx::AssertSqlSafe(drop_it))
            .execute(&writer)
            .await
            .expect("clean-up");
        writer.close().await;
        assert_eq!(drain(&db).await, ["w1"], "drover's enqueue ran");
    })
    .await;
}

/// Asserts `watch` is refused with a one-line [`StoreError::Watch`] that
/// contains `needle`.
async fn refused(db: &TestDb, watch: TableWatch, needle: &str) {
    match db.store.table_watch(&watch).await {
        Err(StoreError::Watch(message)) => {
            assert!(
                message.contains(needle),
                "{message:?} should mention {needle:?}"
            );
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
        other => panic!("{watch:?} should be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_watches_are_refused_with_one_line_and_install_nothing() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let odd_type = if db.engine == "postgres" {
            "jsonb"
        } else {
            "BLOB"
        };
        db.execute(&format!("CREATE TABLE blobs (id {odd_type}, v TEXT)"))
            .await;
        let w = |table: &str, key: &str| TableWatch::new(table, P, key);
        refused(&db, w("nope", "id"), "no table").await;
        refused(&db, w("machines; DROP TABLE machines", "id"), "").await;
        refused(&db, w("machines", "nope"), "no column").await;
        refused(
            &db,
            w("machines", "id\"; DROP TABLE machines; --"),
            "no column",
        )
        .await;
        refused(
            &db,
            w("machines", "id").columns(["wanted", "nope"]),
            "no column",
        )
        .await;
        refused(&db, w("blobs", "id"), "use a").await;
        refused(&db, w("drover_items", "key"), "drover's own").await;
        db.store
            .table_watch(&w("machines", "id"))
            .await
            .expect("a good watch");
        refused(&db, w("machines", "wanted"), "already watched").await;
        let listed = db.store.table_watches().await.expect("list");
        assert_eq!(listed.len(), 1, "only the good watch: {listed:?}");
        db.execute("INSERT INTO blobs VALUES (NULL, 'b')").await;
        db.execute("INSERT INTO machines VALUES ('m1', 'on', '')")
            .await;
        assert!(pending(&db, "m1").await, "the table survived the attempts");
        assert_eq!(
            db.store.process_counts_all().await.expect("counts").len(),
            1
        );
    })
    .await;
}

#[tokio::test]
async fn names_with_quotes_semicolons_and_schemas_are_quoted_correctly() {
    each_enqueue_path(|db| async move {
        db.execute(r#"CREATE TABLE "odd; ""name""" ("k""ey" INTEGER, "v;" TEXT)"#)
            .await;
        let watch = TableWatch::new(r#""odd; ""name""""#, P, r#"k"ey"#).columns(["v;"]);
        db.store
            .table_watch(&watch)
            .await
            .expect("watch an oddly named table");
        db.execute(r#"INSERT INTO "odd; ""name""" VALUES (42, 'a')"#)
            .await;
        assert!(
            pending(&db, "42").await,
            "an integer key is enqueued as text"
        );
        if db.engine == "postgres" {
            let pool = db.store.postgres_pool().expect("postgres");
            let schema: String = sqlx::query_scalar("SELECT current_schema()")
                .fetch_one(pool)
                .await
                .expect("schema");
            db.execute("CREATE TABLE machines (id uuid, v TEXT)").await;
            let qualified = format!("{schema}.machines");
            let name = db
                .store
                .table_watch(&TableWatch::new(&qualified, "uuids", "id"))
                .await
                .expect("watch a schema-qualified table");
            assert_eq!(name, qualified);
            db.execute("INSERT INTO machines VALUES ('00000000-0000-0000-0000-000000000001', 'a')")
                .await;
            let counts = db.store.process_counts_all().await.expect("counts");
            assert!(counts.iter().any(|c| c.process == "uuids"), "{counts:?}");
        }
    })
    .await;
}

fn drover(db: &TestDb, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(args)
        .args(["--db", &db.url])
        .output()
        .expect("drover runs")
}

/// Asserts a failed command printed exactly one line, an error containing `needle`.
fn one_line_error(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "should fail: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(needle),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_cli_watches_lists_and_unwatches_and_refuses_bad_input_in_one_line() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let watch = [
            "watch",
            "machines",
            "--process",
            P,
            "--key",
            "id",
            "--columns",
            "wanted",
        ];
        one_line_error(
            &drover(&db, &["watch", "nope", "--process", P, "--key", "id"]),
            "no table",
        );
        one_line_error(
            &drover(&db, &["watch", "machines", "--process", P, "--key", "x"]),
            "no column",
        );
        let installed = drover(&db, &watch);
        assert!(
            installed.status.success(),
            "{}",
            String::from_utf8_lossy(&installed.stderr)
        );
        one_line_error(&drover(&db, &watch), "already watched");
        let list = drover(&db, &["watch", "--list"]);
        let listed = String::from_utf8_lossy(&list.stdout);
        assert!(
            listed.contains("machines: id -> provision (updates of wanted)"),
            "{listed}"
        );
        assert!(drover(&db, &["unwatch", "machines"]).status.success());
        one_line_error(&drover(&db, &["unwatch", "machines"]), "not watched");
    })
    .await;
}

/// A table, a key column and a process may be named with any character: the
/// CLI's lines (what it did, the list, an error naming the table) must stay
/// one line each and send the terminal nothing. They printed the names raw,
/// so a newline forged a line and an escape recoloured the terminal.
#[tokio::test]
async fn the_cli_prints_names_with_control_characters_escaped_on_one_line() {
    each_enqueue_path(|db| async move {
        let table = "odd\nwatched: forged\u{1b}[31m";
        let quoted = format!("\"{table}\"");
        db.execute(&format!("CREATE TABLE {quoted} (\"k\rey\" TEXT)"))
            .await;
        let process = "prov\u{1b}]0;title\u{7}ision";
        let args = [
            "watch",
            quoted.as_str(),
            "--process",
            process,
            "--key",
            "k\rey",
        ];
        let installed = drover(&db, &args);
        let said = String::from_utf8_lossy(&installed.stdout);
        assert!(
            installed.status.success(),
            "{}",
            String::from_utf8_lossy(&installed.stderr)
        );
        let list = drover(&db, &["watch", "--list"]);
        let listed = String::from_utf8_lossy(&list.stdout);
        one_line_error(&drover(&db, &args), "already watched");
        let again = String::from_utf8_lossy(&drover(&db, &args).stderr).into_owned();
        assert!(drover(&db, &["unwatch", quoted.as_str()]).status.success());
        let gone = drover(&db, &["unwatch", quoted.as_str()]);
        one_line_error(&gone, "not watched");
        let gone = String::from_utf8_lossy(&gone.stderr).into_owned();
        for (what, text) in [
            ("watch", &*said),
            ("list", &*listed),
            ("refusal", &*again),
            ("unwatch", &*gone),
        ] {
            assert_eq!(text.lines().count(), 1, "{what} on one line: {text:?}");
            assert!(
                !text.contains(['\u{1b}', '\r', '\u{7}']),
                "{what} sends the terminal nothing: {text:?}"
            );
            assert!(
                text.contains("odd\\nwatched"),
                "{what} names the table: {text:?}"
            );
        }
        assert!(said.contains("prov\\u{1b}]0;title\\u{7}ision"), "{said:?}");
    })
    .await;
}

/// Updates `keys` (sorted, so concurrent producers never deadlock) in one
/// transaction, bumping each row's version: the change log is the table.
async fn bump(db: &TestDb, keys: &[String]) {
    let mut tx = CallerTx::begin(&db.store).await;
    for key in keys {
        tx.execute(&format!(
            "UPDATE versions SET version = version + 1 WHERE id = '{key}'"
        ))
        .await;
    }
    tx.commit().await;
}

/// What the work saw: per key, every version a run read when it started.
type RunLog = Arc<Mutex<HashMap<String, Vec<i64>>>>;

/// Claims up to 100 ready keys once, logs the version each run reads (the
/// work's own log) and finishes them: how many it ran.
async fn run_once(db: &TestDb, session: SessionId, log: &RunLog) -> usize {
    let claim = LeaseClaim {
        session,
        process: P.into(),
        max: 100,
        trace_links: false,
    };
    let leases = db.store.lease_claim(claim).await.expect("claim").leases;
    for lease in &leases {
        let version = version(db, &lease.key).await;
        log.lock()
            .expect("log")
            .entry(lease.key.clone())
            .or_default()
            .push(version);
    }
    let batch: Vec<_> = leases
        .iter()
        .map(|lease| LeaseComplete {
            lease,
            outcome: &Outcome::Done,
            trace_id: None,
        })
        .collect();
    for answer in support::store::complete_batch_as_a_worker(&db.store, &batch).await {
        answer.expect("complete");
    }
    leases.len()
}

/// One worker, paced by the producers' progress instead of a clock: a round
/// of claims per tick (changes pile up and coalesce between rounds, as they do
/// behind a busy controller), then, when every producer is done, rounds until
/// nothing is left.
async fn work(db: &TestDb, log: RunLog, mut ticks: mpsc::UnboundedReceiver<()>) {
    let s = db.session().await;
    while ticks.recv().await.is_some() {
        run_once(db, s.id, &log).await;
    }
    while run_once(db, s.id, &log).await > 0 {}
}

/// The row's version now.
async fn version(db: &TestDb, key: &str) -> i64 {
    if let Some(pool) = db.store.postgres_pool() {
        let sql = "SELECT version FROM versions WHERE id = $1";
        sqlx::query_scalar(sql).bind(key).fetch_one(pool).await
    } else {
        let pool = db.store.sqlite_pool().expect("an engine");
        sqlx::query_scalar("SELECT version FROM versions WHERE id = ?1")
            .bind(key)
            .fetch_one(pool)
            .await
    }
    .expect("read the version")
}

#[tokio::test]
async fn every_key_changed_by_ten_thousand_updates_runs_after_its_last_change() {
    const KEYS: usize = 100;
    const PRODUCERS: usize = 4;
    const TRANSACTIONS: usize = 250; // per producer, 10 updates each
    each_enqueue_path(|db| async move {
        db.execute("CREATE TABLE versions (id TEXT PRIMARY KEY, version BIGINT NOT NULL)")
            .await;
        let rows: Vec<_> = (0..KEYS).map(|i| format!("('k{i:03}', 0)")).collect();
        db.execute(&format!("INSERT INTO versions VALUES {}", rows.join(", ")))
            .await;
        db.store
            .table_watch(&TableWatch::new("versions", P, "id"))
            .await
            .expect("watch");
        let db = Arc::new(db);
        let log = RunLog::default();
        let (tick, ticks) = mpsc::unbounded_channel();
        let worker = tokio::spawn({
            let (db, log) = (Arc::clone(&db), Arc::clone(&log));
            async move { work(&db, log, ticks).await }
        });
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (db, tick) = (Arc::clone(&db), tick.clone());
                tokio::spawn(async move {
                    for t in 0..TRANSACTIONS {
                        if t % 50 == 49 {
                            tick.send(()).expect("the worker listens");
                        }
                        // A spread of keys that differs per producer and transaction.
                        let mut keys: Vec<_> = (0..10)
                            .map(|u| format!("k{:03}", (p * 7919 + t * 104_729 + u * 31) % KEYS))
                            .collect();
                        keys.sort();
                        bump(&db, &keys).await;
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.expect("producer");
        }
        drop(tick); // the worker drains what is left and stops
        worker.await.expect("worker");
        let log = log.lock().expect("log").clone();
        let mut updates = 0;
        for i in 0..KEYS {
            let key = format!("k{i:03}");
            let last = version(&db, &key).await;
            updates += last;
            if last == 0 {
                continue;
            }
            let seen = log.get(&key).and_then(|v| v.iter().max().copied());
            assert_eq!(seen, Some(last), "{key}: a run must see its last change");
        }
        let runs: usize = log.values().map(Vec::len).sum();
        eprintln!("{updates} updates, {runs} runs");
        assert_eq!(updates, 10_000);
        // At most 100 keys per round, 20 rounds and the last: 2,100 at most,
        // whatever the timing; without coalescing there would be 10,000.
        assert!(
            runs <= 2_100,
            "coalescing keeps runs far below updates: {runs}"
        );
    })
    .await;
}

/// Poison in a watched SQLite table's key column (SQLite stores any bytes
/// and any type in any column): NUL inside text, a blob, bytes that are not
/// UTF-8 (a lone continuation byte, an overlong form, a surrogate, a code
/// point past U+10FFFF, too many continuation bytes), text over 1,024 bytes,
/// and a blob in an INTEGER column each fail the change that wrote it with
/// drover's one-line message and enqueue nothing, while NULL enqueues nothing
/// and succeeds; the claims and the good keys go on.
#[tokio::test]
async fn poison_in_a_watched_sqlite_key_column_fails_its_change_and_never_reaches_a_claim() {
    each_enqueue_path(|db| async move {
        if db.engine != "sqlite" {
            return;
        }
        machines(&db).await;
        db.execute("CREATE TABLE numbered (id INTEGER UNIQUE, v TEXT)")
            .await;
        for table in ["machines", "numbered"] {
            db.store
                .table_watch(&TableWatch::new(table, P, "id"))
                .await
                .expect("watch");
        }
        let poison = [
            "'a' || char(0) || 'b'",
            "X'6100'",
            "X'FF'",
            "CAST(X'80' AS TEXT)",
            "CAST(X'C0AF' AS TEXT)",
            "CAST(X'EDA080' AS TEXT)",
            "CAST(X'F4908080' AS TEXT)",
            "CAST(X'C3A9A9' AS TEXT)",
            "printf('%.1025c', 'x')",
            "zeroblob(3)",
        ];
        for value in poison {
            let sql = format!("INSERT INTO machines VALUES ({value}, 'on', '')");
            let Some(error) = failure(&db, &sql).await else {
                panic!("{value}: a key drover refuses was written");
            };
            assert!(
                error.contains("drover_enqueue") && !error.contains('\n'),
                "{value}: {error}"
            );
        }
        for value in ["X'FF'", "X''"] {
            let sql = format!("INSERT INTO numbered VALUES ({value}, 'a')");
            let error = failure(&db, &sql).await.expect("a refused key was written");
            assert!(error.contains("drover_enqueue"), "{value}: {error}");
        }
        assert!(succeeds(&db, "INSERT INTO numbered VALUES (1.5, 'a')").await);
        assert!(succeeds(&db, "INSERT INTO machines VALUES (NULL, 'on', '')").await);
        assert!(succeeds(&db, "INSERT INTO machines VALUES ('good', 'on', '')").await);
        assert_eq!(drain(&db).await, ["1.5", "good"]);
        let counts = db.store.process_counts_all().await.expect("counts");
        assert_eq!(counts.len(), 1, "{counts:?}");
        let c = &counts[0];
        assert_eq!(c.pending + c.parked + c.running, 0, "{counts:?}");
    })
    .await;
}

/// A table that already holds a row whose key drover refuses (written
/// before any watch: a NUL in it, bytes that are not UTF-8, an empty one)
/// is refused a watch with one line naming the row's key, and nothing is
/// installed; once the row is fixed the watch goes on. Before, the watch
/// was made, and then every change of that row failed, its `DELETE` too,
/// with `drover_enqueue: a key is text of 1 to 1024 bytes without NUL`:
/// the row could not be removed while the table was watched.
#[tokio::test]
async fn a_table_holding_a_key_drover_refuses_is_refused_a_watch_until_it_is_fixed() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        let watch = TableWatch::new("machines", P, "id");
        let mut bad = vec![("''".to_owned(), "empty"), ("'m' || repeat('x', 1024)".to_owned(), "1025 bytes")];
        if db.engine == "sqlite" {
            bad = vec![
                ("'old' || char(0) || 'x'".to_owned(), "old\\0x"),
                ("CAST(X'6FFF' AS TEXT)".to_owned(), "o\u{fffd}"),
                ("''".to_owned(), "\"\""),
                (format!("'m' || '{}'", "x".repeat(1024)), "mxxx"),
            ];
        }
        for (value, shown) in bad {
            db.execute(&format!("INSERT INTO machines VALUES ({value}, 'on', '')"))
                .await;
            refused(&db, watch.clone(), shown).await;
            assert!(db.store.table_watches().await.expect("list").is_empty());
            assert!(
                succeeds(&db, &format!("DELETE FROM machines WHERE id = {value}")).await,
                "the row can be removed"
            );
        }
        db.execute("INSERT INTO machines VALUES ('m1', 'on', ''), (NULL, 'on', ''), ('\u{e9}t\u{e9}', 'on', '')")
            .await;
        db.store.table_watch(&watch).await.expect("a clean table is watched");
        db.execute("DELETE FROM machines").await;
        assert_eq!(drain(&db).await, ["m1", "\u{e9}t\u{e9}"]);
        if db.engine == "postgres" {
            // Padded keys: a short char column's are fine, a wide one's never are.
            db.execute("CREATE TABLE racks (id char(4), wide char(1100))").await;
            db.execute("INSERT INTO racks VALUES ('r1', NULL)").await;
            db.store
                .table_watch(&TableWatch::new("racks", P, "id"))
                .await
                .expect("a char(4) key is watched");
            db.execute("DELETE FROM racks").await;
            assert_eq!(drain(&db).await, ["r1  "], "as the trigger reads it");
            db.store.table_unwatch("racks").await.expect("unwatch");
            refused(&db, TableWatch::new("racks", P, "wide"), "character(1100)").await;
        }
    })
    .await;
}

/// Two nodes that watch the same table at once (each making sure of its
/// watch as it starts): one installs it, the other is refused with the one
/// line that says the table is already watched, and the table carries one
/// watch that enqueues each change once. On PostgreSQL a transaction holding
/// the table in a mode that every trigger change waits for (SHARE ROW
/// EXCLUSIVE, which lets the watches' reads through) makes both watches get
/// past their checks before either installs.
#[tokio::test]
async fn two_nodes_watching_one_table_at_once_install_one_watch_and_refuse_the_other_in_words() {
    each_enqueue_path(|db| async move {
        machines(&db).await;
        db.execute("INSERT INTO machines VALUES ('m0', 'on', '')")
            .await;
        let other = db.reconnect().await;
        let holder = if db.engine == "postgres" {
            let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
            let mut tx = pool.begin().await.expect("begin");
            sqlx::query("LOCK TABLE machines IN SHARE ROW EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await
                .expect("lock");
            Some((tx, pool))
        } else {
            None
        };
        let watch = TableWatch::new("machines", P, "id");
        let (first, second) = (db.store.clone(), other.clone());
        let (w1, w2) = (watch.clone(), watch.clone());
        let one = tokio::spawn(async move { first.table_watch(&w1).await });
        let two = tokio::spawn(async move { second.table_watch(&w2).await });
        if let Some((tx, pool)) = holder {
            // Both watches wait for the holder: observable in pg_locks.
            tokio::time::timeout(std::time::Duration::from_secs(10), async {
                loop {
                    let waiting: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pg_locks l
                         WHERE l.relation = 'machines'::regclass AND NOT l.granted",
                    )
                    .fetch_one(&pool)
                    .await
                    .expect("pg_locks");
                    if waiting >= 2 {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("both watches wait for the holder");
            tx.commit().await.expect("commit");
            pool.close().await;
        }
        let outcomes = [
            one.await.expect("first watch"),
            two.await.expect("second watch"),
        ];
        let installed = outcomes.iter().filter(|o| o.is_ok()).count();
        assert_eq!(installed, 1, "exactly one watch installs: {outcomes:?}");
        for outcome in &outcomes {
            match outcome {
                Ok(_) => {}
                Err(StoreError::Watch(message)) => {
                    assert!(message.contains("already watched"), "{message:?}")
                }
                Err(e) => panic!("the other watch should be refused as already watched: {e:?}"),
            }
        }
        let listed = db.store.table_watches().await.expect("list");
        assert_eq!(listed.len(), 1, "one watch listed: {listed:?}");
        db.execute("INSERT INTO machines VALUES ('m1', 'on', '')")
            .await;
        let m1 = item(&db.store, "m1").await.expect("m1 enqueued");
        assert_eq!(m1.enqueue_count, 1, "one watch enqueued m1 once");
        other.close().await;
    })
    .await;
}

/// A row with a key drover refuses, written by a transaction still open
/// while the table is watched, is seen by the watch's check of the keys:
/// the watch waits for that writer, then refuses the table, rather than
/// install triggers that would fail every later change of that row, its
/// `DELETE` too. (SQLite's watch holds the one write lock from its start.)
#[tokio::test]
async fn a_refused_key_written_while_the_table_is_being_watched_is_seen_by_the_check() {
    each_enqueue_path(|db| async move {
        if db.engine != "postgres" {
            return;
        }
        machines(&db).await;
        let pool = sqlx::PgPool::connect(&db.sql_url).await.expect("connect");
        let mut writer = pool.begin().await.expect("begin");
        sqlx::query("INSERT INTO machines VALUES ('', 'on', '')")
            .execute(&mut *writer)
            .await
            .expect("an empty key, before any watch");
        let store = db.store.clone();
        let watch = tokio::spawn(async move {
            store
                .table_watch(&TableWatch::new("machines", P, "id"))
                .await
        });
        // The watch waits for the writer's lock: observable in pg_locks.
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let waiting: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks l
                                    WHERE l.relation = 'machines'::regclass AND NOT l.granted)",
                )
                .fetch_one(&pool)
                .await
                .expect("pg_locks");
                if waiting {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the watch waits for the writer");
        writer.commit().await.expect("the writer commits");
        let outcome = watch.await.expect("watch");
        let deleted = failure(&db, "DELETE FROM machines WHERE id = ''").await;
        pool.close().await;
        assert!(
            matches!(&outcome, Err(StoreError::Watch(m)) if m.contains("refuses")),
            "the table holding an empty key is refused a watch: {outcome:?}; \
             the row's DELETE then: {deleted:?}"
        );
        assert_eq!(deleted, None, "the row can be deleted");
    })
    .await;
}

/// A change is a change of the value as written, whatever the column's
/// collation says is equal: a key that moves by a change of case only, in a
/// case-insensitive column (SQLite's `COLLATE NOCASE`, a nondeterministic
/// ICU collation on PostgreSQL), enqueues both keys, with a filter or
/// without, and so does a filtered column's change of case. A filter column
/// of a type without an equality operator (PostgreSQL's `json`) is watched
/// like any other.
#[tokio::test]
async fn a_change_that_a_columns_collation_calls_equal_is_seen_and_a_json_column_can_filter() {
    each_enqueue_path(|db| async move {
        let (text, json) = if db.engine == "postgres" {
            db.execute(
                "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', \
                 deterministic = false)",
            )
            .await;
            ("text COLLATE ci", "json")
        } else {
            ("TEXT COLLATE NOCASE", "TEXT")
        };
        db.execute(&format!(
            "CREATE TABLE machines (id {text}, wanted {text}, spec {json})"
        ))
        .await;
        let filtered = TableWatch::new("machines", P, "id").columns(["wanted", "spec"]);
        db.store
            .table_watch(&filtered)
            .await
            .expect("watch, filtered on a text and a json column");
        db.execute("INSERT INTO machines VALUES ('M1', 'on', '{}')")
            .await;
        assert_eq!(drain(&db).await, ["M1"]);
        db.execute("UPDATE machines SET id = 'm1'").await;
        assert_eq!(
            drain(&db).await,
            ["M1", "m1"],
            "a key that moved by its case only, under a filter"
        );
        db.execute("UPDATE machines SET wanted = 'ON'").await;
        assert_eq!(
            drain(&db).await,
            ["m1"],
            "a filtered column's change of case"
        );
        db.execute("UPDATE machines SET spec = '{\"a\": 1}'").await;
        assert_eq!(drain(&db).await, ["m1"], "a json column's change");
        db.store.table_unwatch("machines").await.expect("unwatch");
        db.store
            .table_watch(&TableWatch::new("machines", P, "id"))
            .await
            .expect("watch every update");
        db.execute("UPDATE machines SET id = 'M1'").await;
        assert_eq!(
            drain(&db).await,
            ["M1", "m1"],
            "a key that moved by its case only, without a filter"
        );
    })
    .await;
}

/// A partitioned table's row triggers are cloned onto its partitions, its
/// `TRUNCATE` trigger is not: a watch puts that on every partition too, so a
/// partition truncated by itself enqueues the keys it held, a truncate of
/// the whole table enqueues each key once (a partition made since the watch
/// included), and an unwatch leaves no trigger on any partition.
#[tokio::test]
async fn a_truncate_of_a_watched_tables_partition_enqueues_the_keys_it_held() {
    each_enqueue_path(|db| async move {
        if db.engine != "postgres" {
            return; // SQLite has neither partitions nor TRUNCATE
        }
        db.execute("CREATE TABLE parts (id text, day int) PARTITION BY RANGE (day)")
            .await;
        db.execute("CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10)")
            .await;
        db.execute("CREATE TABLE parts_2 PARTITION OF parts FOR VALUES FROM (10) TO (20)")
            .await;
        db.store
            .table_watch(&TableWatch::new("parts", P, "id"))
            .await
            .expect("watch a partitioned table");
        db.execute("INSERT INTO parts VALUES ('a', 1), ('b', 2), ('c', 15)")
            .await;
        assert_eq!(drain(&db).await, ["a", "b", "c"]);
        db.execute("TRUNCATE parts_1").await;
        assert_eq!(
            drain(&db).await,
            ["a", "b"],
            "a partition truncated by itself enqueues its keys"
        );
        db.execute("CREATE TABLE parts_3 PARTITION OF parts FOR VALUES FROM (20) TO (30)")
            .await;
        db.execute("INSERT INTO parts VALUES ('a', 1), ('d', 25)")
            .await;
        assert_eq!(drain(&db).await, ["a", "d"]);
        let before = item(&db.store, "c").await.expect("c").enqueue_count;
        db.execute("TRUNCATE parts").await;
        assert_eq!(
            drain(&db).await,
            ["a", "c", "d"],
            "the whole table truncated, a partition made since the watch too"
        );
        let after = item(&db.store, "c").await.expect("c").enqueue_count;
        assert_eq!(after, before + 1, "each key enqueued once");
        db.store.table_unwatch("parts").await.expect("unwatch");
        db.execute("INSERT INTO parts VALUES ('e', 1)").await;
        db.execute("TRUNCATE parts_1").await;
        assert!(
            drain(&db).await.is_empty(),
            "unwatched, a partition's truncate enqueues nothing"
        );
    })
    .await;
}
