//! PostgreSQL-only behaviour, beyond the shared contract: `NOTIFY` on enqueue,
//! the all-new-keys enqueue losing a race to a concurrent one, a clean `done`
//! waiting on an uncommitted enqueue of its key, a clean batch settling a row
//! updated while it waited, statistics refreshed after bulk enqueues, running
//! and parked keys listed from their own indexes, a full disk reported as
//! such, no index entry written for the item id, the count deltas folded
//! behind a limited claim. Skipped (with a message)
//! unless `DROVER_TEST_POSTGRES_URL` is set.

mod support;

use std::time::Duration;

use drover::store::{
    ItemEnqueue, ItemList, ItemState, LeaseComplete, Outcome, PostgresStore, RunOutcome,
    StoreEngine as _, StoreError,
};
use support::locks::Holder;
use support::process::eventually;
use support::store::{P, batch, claim, complete, enqueue, events, item, keys};

#[tokio::test]
async fn an_enqueue_notifies_the_process_channel_on_commit() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("listener connects");
    // A process of its own: channels are per database, and the tests of
    // other schemas (and other runs) enqueue to "provision" meanwhile.
    let process = support::process_name("notified");
    let channel = PostgresStore::notify_channel(&process);
    listener.listen(&channel).await.expect("listen");
    db.store
        .item_enqueue(ItemEnqueue::new(process.as_str(), ["m1"]))
        .await
        .expect("enqueue");
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification arrives")
        .expect("listener works");
    assert_eq!(note.channel(), channel);
    db.store.close().await;
    drop(listener);
    support::drop_schema(&base, &schema).await;
}

/// A key that another transaction inserts after the enqueue checked for
/// existing keys (so it takes the plain insert) and commits while the insert
/// waits on it: the enqueue starts over and coalesces instead of failing,
/// and each key counts exactly one enqueue.
#[tokio::test]
async fn an_all_new_batch_that_loses_a_race_for_a_key_coalesces_with_it() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let mut rival = pool.begin().await.expect("begin");
    let rival_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *rival)
        .await
        .expect("rival pid");
    sqlx::query(
        "INSERT INTO drover_items (process, key, state, ready_at, enqueued_at)
         VALUES ('provision', 'k2', 'pending', now(), now())",
    )
    .execute(&mut *rival)
    .await
    .expect("rival insert");
    let store = db.store.clone();
    // Enough keys for the bulk (`COPY`) path, k2 among them.
    let batch: Vec<String> = ["k1", "k2", "k3"]
        .into_iter()
        .map(String::from)
        .chain((0..1000).map(|i| format!("m{i:04}")))
        .collect();
    let enqueue = tokio::spawn(async move {
        store
            .item_enqueue(ItemEnqueue::new("provision", batch))
            .await
    });
    // The plain insert blocks on the rival's uncommitted row.
    let waiting =
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))";
    tokio::time::timeout(Duration::from_secs(10), async {
        while !sqlx::query_scalar::<_, bool>(waiting)
            .bind(rival_pid)
            .fetch_one(&pool)
            .await
            .expect("pg_locks")
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the enqueue waits for the rival");
    rival.commit().await.expect("rival commits");
    let report = enqueue.await.expect("joined").expect("enqueue");
    assert_eq!((report.pending, report.dirty), (1003, 0));
    let list = ItemList {
        process: "provision".into(),
        state: None,
        after_key: None,
        limit: 2000,
    };
    let items = db.store.item_list(list).await.expect("items");
    assert_eq!(items.len(), 1003);
    let counts: Vec<_> = items
        .iter()
        .filter(|i| i.key.starts_with('k'))
        .map(|i| (i.key.as_str(), i.enqueue_count))
        .collect();
    assert_eq!(
        counts,
        [("k1", 1), ("k2", 1), ("k3", 1)],
        "the lost attempt counted nothing"
    );
    assert!(items.iter().all(|i| i.enqueue_count == 1));
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// The planner must not keep believing a process is empty after a burst of
/// enqueues (it then reads every pending row per claim), so the store runs
/// `ANALYZE` itself rather than waiting for autovacuum (`last_autoanalyze`):
/// past 50,000 rows in all, spread here over 100 processes of 600 keys, too
/// few for any of them to ask on its own.
#[tokio::test]
async fn a_bulk_enqueue_refreshes_the_planner_statistics() {
    analysed_after(|batch| {
        (
            format!("burst-{batch}"),
            (0..600).map(|i| format!("k{i:05}")).collect(),
        )
    })
    .await;
}

/// A process the statistics do not know is as badly served with far fewer
/// keys: its first thousand ask for an analysis on their own.
#[tokio::test]
async fn a_new_processs_first_thousand_keys_refresh_the_planner_statistics() {
    analysed_after(|batch| {
        (
            "new".to_owned(),
            (0..10).map(|i| format!("k{batch}-{i:05}")).collect(),
        )
    })
    .await;
}

/// Enqueues `batch(n)`'s keys for n = 0..100 into a fresh schema whose
/// `drover_items` autovacuum leaves alone, then waits until the store has
/// analysed it.
async fn analysed_after(batch: impl Fn(usize) -> (String, Vec<String>)) {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema, pool) = unvacuumed(&base).await;
    let analyzed = "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables
                    WHERE relname = 'drover_items' AND schemaname = current_schema()";
    let before: bool = sqlx::query_scalar(analyzed).fetch_one(&pool).await.unwrap();
    assert!(!before, "a fresh schema was never analysed");
    for n in 0..100 {
        let (process, keys) = batch(n);
        db.store
            .item_enqueue(ItemEnqueue::new(process, keys))
            .await
            .expect("enqueue");
    }
    eventually("drover_items analysed after the enqueues", || async {
        sqlx::query_scalar::<_, bool>(analyzed)
            .fetch_one(&pool)
            .await
            .unwrap()
    })
    .await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A fresh schema whose `drover_items` autovacuum leaves alone, so that
/// only the store's own `ANALYZE` gives it statistics; and a pool on it.
async fn unvacuumed(base: &str) -> (support::TestDb, String, sqlx::PgPool) {
    let (db, schema) = support::postgres(base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    sqlx::query("ALTER TABLE drover_items SET (autovacuum_enabled = false)")
        .execute(&pool)
        .await
        .expect("autovacuum off");
    (db, schema, pool)
}

/// Bursts into ten new processes, back to back: each asks for an analysis,
/// most while one is running. Every process must end up in the statistics,
/// so an analysis must begin after the last burst committed.
#[tokio::test]
async fn every_burst_of_back_to_back_new_processes_is_seen_by_an_analysis() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema, pool) = unvacuumed(&base).await;
    let processes: Vec<String> = (0..10).map(|n| format!("burst{n}")).collect();
    for process in &processes {
        let keys = (0..2_000).map(|i| format!("k{i:05}"));
        db.store
            .item_enqueue(ItemEnqueue::new(process.clone(), keys))
            .await
            .expect("enqueue");
    }
    let known = "SELECT coalesce(most_common_vals::text, '') FROM pg_stats
                 WHERE schemaname = current_schema() AND tablename = 'drover_items'
                   AND attname = 'process'";
    eventually("every process's burst in the statistics", || async {
        let seen: Option<String> = sqlx::query_scalar(known)
            .fetch_optional(&pool)
            .await
            .expect("pg_stats");
        let seen = seen.unwrap_or_default();
        processes.iter().all(|p| seen.contains(p.as_str()))
    })
    .await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

#[test]
fn channel_names_are_short_valid_identifiers() {
    assert_eq!(
        PostgresStore::notify_channel("provision"),
        "drover_provision"
    );
    let odd = PostgresStore::notify_channel("Name With Spaces/and/a/very/long/path/that/goes/on");
    assert!(odd.len() <= 63 && odd.starts_with("drover_"), "{odd}");
    assert!(odd.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    assert_ne!(odd, PostgresStore::notify_channel("Name With Spaces"));
}

#[tokio::test]
async fn the_server_ends_a_drover_transaction_whose_client_went_silent() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("a PostgreSQL store");
    // A frozen client's open transaction must not hold its row locks (and so
    // every other node's reclaim) until the server notices the dead link.
    let timeout: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(timeout, "5s");
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5500)).await; // the silence itself
    let after = sqlx::query("SELECT 1").execute(&mut *tx).await;
    assert!(after.is_err(), "the server ended the idle transaction");
    drop(tx);
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A full disk is [`StoreError::Full`] (nothing written, worth retrying once
/// space is freed), not an opaque database error. The test cannot fill the
/// server's disk, so a trigger raises PostgreSQL's `disk_full` as the server
/// would.
#[tokio::test]
async fn a_full_disk_is_reported_as_full() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    db.execute(
        "CREATE FUNCTION drover_test_full() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'
             USING ERRCODE = 'disk_full'; END $$",
    )
    .await;
    db.execute(
        "CREATE TRIGGER drover_test_full BEFORE INSERT ON drover_items
         FOR EACH ROW EXECUTE FUNCTION drover_test_full()",
    )
    .await;
    let e = db
        .store
        .item_enqueue(ItemEnqueue::new("provision", ["m1"]))
        .await
        .expect_err("the insert is refused");
    assert!(matches!(e, StoreError::Full(_)), "{e:?}");
    assert!(e.is_transient(), "worth retrying");
    db.execute("DROP TRIGGER drover_test_full ON drover_items")
        .await;
    db.store
        .item_enqueue(ItemEnqueue::new("provision", ["m1"]))
        .await
        .expect("space again: the same enqueue goes through");
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// The running rows have one index (the lease index, migration 0014) and the
/// parked rows one of their own: listing either in key order reads that small
/// index, never a walk over every idle key of the process. Judged from the
/// database's own index-scan counters, so it holds for the statements the
/// store actually sends.
#[tokio::test]
async fn running_and_parked_keys_are_listed_from_their_own_small_indexes() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    db.store
        .item_enqueue(ItemEnqueue::new("fleet", ["seed"]))
        .await
        .expect("enqueue");
    // 20,000 idle keys, then five running and five parked among them.
    sqlx::query(
        "INSERT INTO drover_items (process, key, state, ready_at, enqueued_at)
         SELECT 'fleet', 'k' || lpad(g::text, 5, '0'), 'idle', now(), now()
         FROM generate_series(1, 20000) g",
    )
    .execute(&pool)
    .await
    .expect("idle keys");
    sqlx::query(
        "UPDATE drover_items SET state = 'running', lease_session = 1, lease_token = id,
             started_at = now()
         WHERE process = 'fleet' AND key IN ('k00007', 'k05000', 'k09999', 'k15000', 'k19999')",
    )
    .execute(&pool)
    .await
    .expect("running keys");
    sqlx::query(
        "UPDATE drover_items SET state = 'parked'
         WHERE process = 'fleet' AND key IN ('k00008', 'k05001', 'k10000', 'k15001', 'k20000')",
    )
    .execute(&pool)
    .await
    .expect("parked keys");
    sqlx::query("ANALYZE drover_items")
        .execute(&pool)
        .await
        .expect("analyze");
    let scans = |index: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT idx_scan FROM pg_stat_user_indexes
                 WHERE schemaname = current_schema() AND indexrelname = $1",
            )
            .bind(index)
            .fetch_one(&pool)
            .await
            .expect("index statistics")
        }
    };
    for (state, index, keys) in [
        (
            ItemState::Running,
            "drover_items_leases",
            ["k00007", "k05000", "k09999", "k15000", "k19999"],
        ),
        (
            ItemState::Parked,
            "drover_items_parked",
            ["k00008", "k05001", "k10000", "k15001", "k20000"],
        ),
    ] {
        let before = scans(index).await;
        // More listings than PostgreSQL plans for the parameters before it may
        // switch a prepared statement to its generic plan (five): every one
        // must read the index, whatever the plan cache chose.
        const LISTINGS: i64 = 8;
        for _ in 0..LISTINGS {
            let listed = db
                .store
                .item_list(ItemList {
                    process: "fleet".into(),
                    state: Some(state),
                    after_key: Some("k00001".into()),
                    limit: 10,
                })
                .await
                .expect("list");
            let listed: Vec<&str> = listed.iter().map(|i| i.key.as_str()).collect();
            assert_eq!(listed, keys, "{state:?} keys in key order");
        }
        // Backends report their counters when they go idle, within seconds.
        tokio::time::timeout(Duration::from_secs(30), async {
            while scans(index).await < before + LISTINGS {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("listing {state:?} keys never scanned {index}"));
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A fresh schema on the server at `base` (with `pg_walinspect` installed
/// in the database) holding 1,000 pending keys of [`P`], its store's pool and
/// the keys, and a connection holding the log from now on (a temporary
/// replication slot: a checkpoint, the five-minute timer's or another
/// client's, would otherwise remove the segments the test reads): for the
/// tests that read the write-ahead log.
async fn walinspected(
    base: &str,
) -> (
    support::TestDb,
    String,
    sqlx::PgPool,
    Vec<String>,
    sqlx::PgConnection,
) {
    support::admin_execute(
        base,
        "CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public",
    )
    .await;
    let mut holder = <sqlx::PgConnection as sqlx::Connection>::connect(base)
        .await
        .expect("a connection to hold the log");
    sqlx::query("SELECT pg_create_physical_replication_slot('drover_test_' || pg_backend_pid(), true, true)")
        .execute(&mut holder)
        .await
        .expect("a temporary slot (the test server's user is a superuser)");
    let (db, schema) = support::postgres(base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let names: Vec<String> = (0..1_000).map(|i| format!("k{i:04}")).collect();
    db.store
        .item_enqueue(ItemEnqueue::new(P, names.iter().map(String::as_str)))
        .await
        .expect("enqueue");
    (db, schema, pool, names, holder)
}

/// The write-ahead log's current `which` position (`insert` or `flush`).
async fn wal_lsn(pool: &sqlx::PgPool, which: &str) -> String {
    sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
        "SELECT pg_current_wal_{which}_lsn()::text"
    )))
    .fetch_one(pool)
    .await
    .expect("lsn")
}

/// Item pages keep room for their rows' next versions (migration 0016's
/// fillfactor): a claim that takes every key of a fresh batch writes each new
/// version beside the old one, so PostgreSQL logs about one row lock per key
/// (the claim's own) instead of two (the second when an update moves a row to
/// another page). Judged from the write-ahead log of this schema's table.
#[tokio::test]
async fn a_claim_writes_its_new_row_versions_beside_the_old_ones() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema, pool, names, _log) = walinspected(&base).await;
    // The end is the flushed position: pg_walinspect refuses one past it, and
    // the insert position runs ahead of it while other tests write. Each
    // claim has committed (and so flushed) its records before it is read.
    let lsn = |which: &'static str| wal_lsn(&pool, which);
    let session = db.session().await;
    let from = lsn("insert").await;
    let mut claimed = 0;
    while claimed < names.len() {
        let leases = claim(&db.store, session.id, 1_000).await;
        assert!(!leases.is_empty(), "every key is ready");
        claimed += leases.len();
    }
    let to = lsn("flush").await;
    let locks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
         WHERE resource_manager = 'Heap' AND record_type LIKE 'LOCK%'
             AND block_ref LIKE '%/' || pg_relation_filenode('drover_items') || ' %'",
    )
    .bind(&from)
    .bind(&to)
    .fetch_one(&pool)
    .await
    .expect("write-ahead log");
    let per_key = locks as f64 / names.len() as f64;
    // 2.0 on full pages, 1.45 at a fillfactor of 60, 1.17 at 50.
    assert!(
        (1.0..1.3).contains(&per_key),
        "{per_key:.2} row-lock records per claimed key"
    );
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A claim and a completion write an entry into each index of `drover_items`
/// whose rows they change (neither is a HOT update: `state` decides the
/// partial indexes), and since migration 0023 the table has no index on `id`:
/// a claim writes two entries per key (the primary key `(process, key)` and
/// the lease index), a completion that leaves the key idle one (the primary
/// key). Counted from the write-ahead log of this schema's indexes, by index.
#[tokio::test]
async fn a_claim_and_a_completion_write_no_index_entry_for_the_item_id() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema, pool, names, _log) = walinspected(&base).await;
    let lsn = |which: &'static str| wal_lsn(&pool, which);
    // Index entries written per key between two positions of the log, by
    // index: each leaf insert is one record, or part of the split it caused.
    let entries = |from: String, to: String| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT c.relname::text, count(w.*) FROM pg_index x
                 JOIN pg_class c ON c.oid = x.indexrelid
                 LEFT JOIN public.pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) w
                     ON w.resource_manager = 'Btree'
                     AND w.record_type IN ('INSERT_LEAF', 'INSERT_POST', 'SPLIT_L', 'SPLIT_R')
                     AND w.block_ref LIKE '%/' || (SELECT oid FROM pg_database
                                                   WHERE datname = current_database())
                         || '/' || pg_relation_filenode(c.oid) || ' %'
                 WHERE x.indrelid = 'drover_items'::regclass
                 GROUP BY c.relname HAVING count(w.*) > 0 ORDER BY c.relname",
            )
            .bind(from)
            .bind(to)
            .fetch_all(&pool)
            .await
            .expect("write-ahead log");
            rows.into_iter()
                .map(|(index, n)| (index, n as f64 / 1_000.0))
                .collect::<Vec<_>>()
        }
    };
    let session = db.session().await;
    let from = lsn("insert").await;
    let mut leases = Vec::new();
    while leases.len() < names.len() {
        let claimed = claim(&db.store, session.id, 1_000).await;
        assert!(!claimed.is_empty(), "every key is ready");
        leases.extend(claimed);
    }
    let claimed = lsn("flush").await;
    let claims = entries(from, claimed.clone()).await;
    for chunk in leases.chunks(250) {
        let batch: Vec<LeaseComplete<'_>> = chunk
            .iter()
            .map(|lease| LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            })
            .collect();
        let answers = db.store.lease_complete_batch(&batch).await.expect("batch");
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    }
    let completions = entries(claimed, lsn("flush").await).await;
    let names = |e: &[(String, f64)]| e.iter().map(|(i, _)| i.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&claims),
        ["drover_items_leases", "drover_items_pkey"],
        "{claims:?}"
    );
    assert_eq!(
        names(&completions),
        ["drover_items_pkey"],
        "{completions:?}"
    );
    for (index, per_key) in claims.iter().chain(&completions) {
        assert!(
            (0.99..1.01).contains(per_key),
            "{index}: {per_key:.3} entries per key"
        );
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// The worst moment for a clean `done`: another transaction has enqueued the
/// running key (its row locked, the change not yet committed) when the
/// completion reads the row. The completion skips that row and answers its
/// lease `KeyBusy` after waiting 100 ms, writing nothing for it, and settles the batch's
/// other keys. Sent again once the rival has ended, the outcome honours the
/// enqueue when it committed (the key pending for one more run) and leaves
/// the key idle when it rolled back.
#[tokio::test]
async fn a_done_that_meets_an_uncommitted_enqueue_of_its_key_honours_it_when_sent_again() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    for commits in [true, false] {
        let s = db.session().await;
        enqueue(&db.store, &["a", "b", "c"]).await;
        let running = claim(&db.store, s.id, 10).await;
        assert_eq!(keys(&running), ["a", "b", "c"]);
        let runs_of_b = events(&db.store, "b").await.len();
        let mut rival = pool.begin().await.expect("begin");
        sqlx::query("SELECT drover_enqueue($1, ARRAY['b'])")
            .bind(P)
            .execute(&mut *rival)
            .await
            .expect("enqueue b in the rival transaction");
        let answers = tokio::time::timeout(
            Duration::from_secs(4),
            db.store
                .lease_complete_batch(&batch(&running, &Outcome::Done)),
        )
        .await
        .expect("the completion does not wait for the rival")
        .expect("batch");
        assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
        assert!(
            matches!(&answers[1], Err(StoreError::KeyBusy { key, .. }) if key == "b"),
            "{answers:?}"
        );
        assert_eq!(
            events(&db.store, "b").await.len(),
            runs_of_b,
            "nothing written for b"
        );
        if commits {
            rival.commit().await.expect("commit");
        } else {
            rival.rollback().await.expect("rollback");
        }
        complete(&db.store, &running[1], Outcome::Done)
            .await
            .expect("b's outcome, sent again");
        let again = claim(&db.store, s.id, 10).await;
        let expected: &[&str] = if commits { &["b"] } else { &[] };
        assert_eq!(keys(&again), expected, "rival commits: {commits}");
        for key in ["a", "c"] {
            let item = item(&db.store, key).await.expect("known");
            assert_eq!(item.state, ItemState::Idle, "{key}");
        }
        for lease in &again {
            complete(&db.store, lease, Outcome::Done)
                .await
                .expect("done");
        }
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A batch of clean `done`s meeting a row that another transaction updated
/// (leaving its lease as it was) and holds: the rest settle at once, and
/// the held one, answered `KeyBusy`, settles when sent again after the
/// update committed, though its row's version (and `ctid`) is not the one
/// the claim left. Each key is idle and each run logged once. (Before, the
/// batch waited for the lock and then held a version newer than its
/// snapshot, which its one-statement update by `ctid` could not see.)
#[tokio::test]
async fn a_clean_batch_settles_the_rest_beside_a_row_another_transaction_updates() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let s = db.session().await;
    enqueue(&db.store, &["a", "b", "c"]).await;
    let running = claim(&db.store, s.id, 10).await;
    assert_eq!(keys(&running), ["a", "b", "c"]);
    // A new version of b's row, its lease as it was, not yet committed.
    let holder = Holder::lock(
        &pool,
        "UPDATE drover_items SET last_enqueued_at = last_enqueued_at
         WHERE state = 'running' AND lease_token = $1",
        running[1].token.0,
    )
    .await;
    let answers = db
        .store
        .lease_complete_batch(&batch(&running, &Outcome::Done))
        .await
        .expect("batch");
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert!(
        matches!(&answers[1], Err(StoreError::KeyBusy { .. })),
        "{answers:?}"
    );
    holder.release().await;
    complete(&db.store, &running[1], Outcome::Done)
        .await
        .expect("b's outcome, sent again");
    for key in ["a", "b", "c"] {
        let item = item(&db.store, key).await.expect("known");
        assert_eq!(item.state, ItemState::Idle, "{key}");
        assert_eq!(events(&db.store, key).await, [RunOutcome::Done], "{key}");
    }
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// The count deltas of [`P`] not folded into its counts yet, and whether the
/// counts (folded figure plus deltas) match its rows state by state.
async fn deltas_and_exact_counts(pool: &sqlx::PgPool) -> (i64, bool) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM drover_item_count_deltas WHERE process = $1),
             (SELECT coalesce(array_agg(state || '=' || n ORDER BY state), '{}') FROM (
                 SELECT state, count(*) AS n FROM drover_items WHERE process = $1
                 GROUP BY state) r)
             = (SELECT coalesce(array_agg(state || '=' || n ORDER BY state), '{}') FROM (
                 SELECT state, sum(n) AS n FROM (
                     SELECT state, n FROM drover_item_counts WHERE process = $1
                     UNION ALL
                     SELECT state, delta FROM drover_item_count_deltas WHERE process = $1) u
                 GROUP BY state HAVING sum(n) <> 0) c)",
    )
    .bind(P)
    .fetch_one(pool)
    .await
    .expect("the deltas and the counts")
}

/// A limited claim's running count sums the deltas appended since the last
/// fold, and the reclaim passes that fold them run only twice per TTL: the
/// store folds them in behind its limited claims, so the next claim reads a
/// short tail. Nothing else folds here (no reclaim pass, no count read).
#[tokio::test]
async fn the_store_folds_the_count_deltas_behind_a_limited_claim() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let names: Vec<String> = (0..20).map(|n| format!("k{n:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    enqueue(&db.store, &names).await;
    let session = db.session().await.id;
    for _ in 0..3 {
        let leases = claim(&db.store, session, 3).await;
        let results = db
            .store
            .lease_complete_batch(&batch(&leases, &Outcome::Done))
            .await
            .expect("complete");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    let (unfolded, exact) = deltas_and_exact_counts(&pool).await;
    assert!(
        unfolded >= 6,
        "{unfolded} deltas after three unlimited claims"
    );
    assert!(exact);

    db.store
        .process_configure(drover::store::ProcessConfigure::new(P).concurrency(Some(100)))
        .await
        .expect("configure");
    assert_eq!(claim(&db.store, session, 2).await.len(), 2);
    eventually("the deltas folded behind the limited claim", || async {
        deltas_and_exact_counts(&pool).await == (0, true)
    })
    .await;

    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// Requests the server never answers (its link frozen while both ends live,
/// so the kernel keeps the socket open and nothing fails by itself) end
/// within the answer timeout and a look for a sign of life on a new
/// connection (10 s and 5 s) as `CommitUnknown`, for a claim, a batch of
/// completions and a lock alike (a heartbeat and the rest are bounded the
/// same way), instead of waiting for ever: a
/// worker's claim loop, its completer and its keeper wait on them, so one
/// frozen old primary stalled the worker for good (found with a primary
/// stopped by SIGSTOP while its standby was promoted). Once the link heals
/// the store works again, on new connections.
#[tokio::test]
async fn requests_on_a_frozen_link_end_unknown_within_the_answer_timeout() {
    use drover::store::{LeaseClaim, LeaseLock, SessionStart};
    use support::fault_proxy::FaultProxy;
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let (proxy, node) = FaultProxy::in_front_of(&base, &db.url).await;
    enqueue(&node, &["a", "b", "c"]).await;
    let session = node
        .session_start(SessionStart::new("node", Duration::from_secs(300)))
        .await
        .expect("session")
        .id;
    let held = claim(&node, session, 1).await;
    assert_eq!(keys(&held), ["a"]);
    proxy.freeze();
    let done = Outcome::Done;
    let unanswered = |what: &str, took: Duration, result: Result<(), StoreError>| {
        assert!(
            took < Duration::from_secs(25),
            "{what} answered after {took:?}"
        );
        match result {
            Err(e) if e.is_commit_unknown() => {}
            other => panic!("{what}: {other:?}"),
        }
    };
    let within = Duration::from_secs(60);
    let started = std::time::Instant::now();
    let claimed = tokio::time::timeout(
        within,
        node.lease_claim(LeaseClaim {
            session,
            process: P.into(),
            max: 1,
            trace_links: false,
        }),
    )
    .await
    .expect("a claim on a frozen link ends");
    unanswered("claim", started.elapsed(), claimed.map(drop));
    let started = std::time::Instant::now();
    let completed = tokio::time::timeout(within, node.lease_complete_batch(&batch(&held, &done)))
        .await
        .expect("completions on a frozen link end");
    unanswered("completion", started.elapsed(), completed.map(drop));
    let started = std::time::Instant::now();
    let locked = tokio::time::timeout(
        within,
        node.lease_lock(LeaseLock {
            session,
            process: P.into(),
            key: "c".into(),
        }),
    )
    .await
    .expect("a lock on a frozen link ends");
    unanswered("lock", started.elapsed(), locked.map(drop));
    proxy.heal();
    let results = node
        .lease_complete_batch(&batch(&held, &done))
        .await
        .expect("completions once the link healed");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(events(&node, "a").await, [RunOutcome::Done]);
    node.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// Requests stuck on a frozen link at once share one look at the server's
/// sign of life: one new connection, not one per request. Before, each
/// opened its own, so a hundred requests stuck behind a busy pool opened a
/// hundred connections to the busy server about together.
#[tokio::test]
async fn requests_stuck_together_share_one_look_at_the_server() {
    use drover::store::{SessionHeartbeat, SessionStart};
    use support::fault_proxy::FaultProxy;
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let (proxy, node) = FaultProxy::in_front_of(&base, &db.url).await;
    let mut sessions = Vec::new();
    for _ in 0..6 {
        let start = SessionStart::new("node", Duration::from_secs(300));
        sessions.push(node.session_start(start).await.expect("session").id);
    }
    // Six pooled connections open before the link freezes, so each request
    // has one and opens none: every connection made later is a look.
    let mut open = Vec::new();
    for _ in 0..6 {
        open.push(node.begin().await.expect("a transaction"));
    }
    for tx in open {
        tx.rollback().await.expect("rollback");
    }
    proxy.freeze();
    let before = proxy.accepted();
    let stuck = sessions.into_iter().map(|session| {
        let node = node.clone();
        tokio::spawn(async move {
            node.session_heartbeat(SessionHeartbeat { session })
                .await
                .map(drop)
        })
    });
    let stuck: Vec<_> = stuck.collect();
    for request in stuck {
        let answer = tokio::time::timeout(Duration::from_secs(60), request)
            .await
            .expect("a request on a frozen link ends")
            .expect("the request's task");
        assert!(
            matches!(&answer, Err(e) if e.is_commit_unknown()),
            "{answer:?}"
        );
    }
    // One look, and the connections the first request's notice has the
    // store open again in the background (the `LISTEN` connection, the
    // pool's), whose number depends on how the machine's timers fall: 2 in
    // most runs, 3 in one CI run. One look per request opened 8.
    let looks = proxy.accepted() - before;
    assert!(
        looks < 6,
        "six requests stuck together opened {looks} connections to look at the server"
    );
    proxy.heal();
    node.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A claim that waits 13 s behind a table lock on a healthy server (a DBA's
/// `CREATE INDEX` on `drover_items` takes SHARE for as long as the build
/// lasts; `VACUUM FULL`, `ALTER TABLE`, `pg_repack`'s swap do likewise) is
/// answered once the lock goes: past the answer timeout the server still
/// answers a new connection, so the claim is awaited on. A first version of
/// the timeout answered it `CommitUnknown` at 10 s, which a worker answers by
/// giving its whole session up, every run cancelled (found in review).
#[tokio::test]
async fn a_claim_behind_a_table_lock_past_the_answer_timeout_is_answered() {
    use drover::store::{LeaseClaim, SessionStart};
    use std::time::Instant;
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let store = db.store.clone();
    store
        .item_enqueue(ItemEnqueue::new(P, ["a"]))
        .await
        .expect("enqueue");
    let session = store
        .session_start(SessionStart::new("node", Duration::from_secs(120)))
        .await
        .expect("session");
    let admin = sqlx::PgPool::connect(&db.url).await.expect("admin");
    let holder = support::locks::items_held_for(&db.url, Duration::from_secs(13)).await;
    let started = Instant::now();
    let claimed = store
        .lease_claim(LeaseClaim {
            session: session.id,
            process: P.into(),
            max: 1,
            trace_links: false,
        })
        .await;
    let took = started.elapsed();
    holder.await.expect("holder");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let state: (String, Option<i64>) =
        sqlx::query_as("SELECT state, lease_session FROM drover_items WHERE key = 'a'")
            .fetch_one(&admin)
            .await
            .expect("state");
    eprintln!(
        "claim took {took:?}: {:?}; afterwards key a is {state:?} (session {})",
        claimed.as_ref().map(|c| c.leases.len()),
        session.id.0
    );
    match claimed {
        Ok(c) => assert_eq!(c.leases.len(), 1),
        Err(e) => panic!(
            "a claim on a healthy server that waited {took:?} for a lock failed: {e} \
             (commit unknown: {})",
            e.is_commit_unknown()
        ),
    }
    admin.close().await;
    store.close().await;
    support::drop_schema(&base, &schema).await;
}
