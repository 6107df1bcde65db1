//! The pause after a fork in the database's history (DESIGN.md rule 12), on
//! one PostgreSQL server: the test makes drover's record of the server's
//! identity disagree with the server (as a promoted standby's new timeline
//! would), so the next new connection notices a fork. `tests/failover.rs`
//! drives the same through a real promotion. PostgreSQL only (skipped with
//! the reason printed when `DROVER_TEST_POSTGRES_URL` is not set).

mod support;

use drover::store::{
    ItemEnqueue, LeaseClaim, LeaseLock, ProcessConfigure, SessionHeartbeat, SessionStart, Store,
    StoreEngine as _, StoreError,
};
use support::store::{P, secs};

/// A process with a concurrency limit: its claims take the gated path.
const LIMITED: &str = "limited";

#[tokio::test]
async fn after_a_fork_old_sessions_expire_and_nothing_is_claimed_for_the_longest_ttl() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let store = db.store.clone();
    // A worker with a 60 s TTL came and went; one with 20 s is running.
    let long = store
        .session_start(SessionStart::new("long gone", secs(60)))
        .await
        .expect("session");
    store
        .session_close(drover::store::SessionClose { session: long.id })
        .await
        .expect("close");
    let old = store
        .session_start(SessionStart::new("old", secs(20)))
        .await
        .expect("session");
    store
        .process_configure(ProcessConfigure::new(LIMITED).concurrency(Some(5)))
        .await
        .expect("configure");
    for process in [P, LIMITED] {
        store
            .item_enqueue(ItemEnqueue::new(process, ["a", "b"]))
            .await
            .expect("enqueue");
    }
    let claim = |session, process: &str| LeaseClaim {
        session,
        process: process.into(),
        max: 1,
        trace_links: false,
    };
    let before = store.lease_claim(claim(old.id, P)).await.expect("claim");
    assert_eq!(before.leases.len(), 1, "no pause before a fork");

    // The server's identity changes under drover; a new store's first
    // connection meets it.
    db.execute("UPDATE drover_lineage SET timeline = timeline + 1")
        .await;
    let node = db.reconnect().await;
    let err = node
        .session_heartbeat(SessionHeartbeat { session: old.id })
        .await
        .expect_err("a session of before the fork is expired");
    assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
    let report = node.session_reclaim().await.expect("reclaim");
    assert_eq!(
        (report.sessions, report.leases),
        (1, 1),
        "its lease goes back"
    );
    let new = node
        .session_start(SessionStart::new("new", secs(20)))
        .await
        .expect("a new session starts during the pause");
    for process in [P, LIMITED] {
        let claimed = node
            .lease_claim(claim(new.id, process))
            .await
            .expect("claim");
        assert!(
            claimed.leases.is_empty(),
            "{process}: claimed during the pause"
        );
    }
    // A third store does not notice the same fork again.
    let third = db.reconnect().await;
    third.clock().advance(secs(59));
    node.clock().advance(secs(59));
    let late = node
        .session_start(SessionStart::new("late", secs(20)))
        .await
        .expect("session");
    let claimed = node.lease_claim(claim(late.id, P)).await.expect("claim");
    assert!(
        claimed.leases.is_empty(),
        "the pause is the longest TTL ever started, 60 s"
    );

    third.clock().advance(secs(2));
    node.clock().advance(secs(2));
    let alive = node
        .session_start(SessionStart::new("after", secs(20)))
        .await
        .expect("session");
    for process in [P, LIMITED] {
        let claimed = node
            .lease_claim(claim(alive.id, process))
            .await
            .expect("claim");
        assert_eq!(
            claimed.leases.len(),
            1,
            "{process}: claims resume after the pause"
        );
    }
    third
        .session_reclaim()
        .await
        .expect("a reclaim on the third store");
    let still = node
        .session_heartbeat(SessionHeartbeat { session: alive.id })
        .await;
    assert!(still.is_ok(), "no second fork: {still:?}");
    node.close().await;
    third.close().await;
    store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A connection that outlived a fork (one opened to a standby before its
/// promotion, one a pooler's server connections moved under) hands no key
/// out before the fork is observed, and a lock (a query source's path) is
/// held back like a claim, before the fork is observed and during the pause.
/// Before, the claims asked only for the pause, which only a new connection
/// or the reclaim started, and `lease_lock` asked for nothing: both handed a
/// key out that a worker of before the fork may still run.
#[tokio::test]
async fn a_connection_that_outlived_a_fork_and_a_lock_hand_nothing_out_until_the_pause_ends() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let store = db.store.clone();
    store
        .process_configure(ProcessConfigure::new(LIMITED).concurrency(Some(5)))
        .await
        .expect("configure");
    for process in [P, LIMITED] {
        store
            .item_enqueue(ItemEnqueue::new(process, ["a", "b"]))
            .await
            .expect("enqueue");
    }
    // One connection, opened and observed before the fork.
    let options = drover::store::StoreOptions::default().max_connections(1);
    let node = Store::connect_with(&db.url, &options)
        .await
        .expect("connect");
    let session = node
        .session_start(SessionStart::new("node", secs(20)))
        .await
        .expect("session");
    let claim = |session, process: &str| LeaseClaim {
        session,
        process: process.into(),
        max: 1,
        trace_links: false,
    };
    let lock = |session, process: &str| LeaseLock {
        session,
        process: process.into(),
        key: "b".into(),
    };
    // The server's timeline moves under the open connection, as a promotion's.
    db.execute("UPDATE drover_lineage SET timeline = timeline + 1")
        .await;
    for process in [P, LIMITED] {
        let claimed = node
            .lease_claim(claim(session.id, process))
            .await
            .expect("claim");
        assert!(
            claimed.leases.is_empty(),
            "{process}: claimed through a connection that outlived the fork"
        );
        let locked = node.lease_lock(lock(session.id, process)).await;
        assert!(
            matches!(locked, Err(StoreError::Held { .. })),
            "{process}: locked through a connection that outlived the fork: {locked:?}"
        );
    }
    // The reclaim observes the fork: the pause starts, and holds locks too.
    node.session_reclaim().await.expect("reclaim");
    let new = node
        .session_start(SessionStart::new("new", secs(20)))
        .await
        .expect("a new session starts during the pause");
    let locked = node.lease_lock(lock(new.id, P)).await;
    let Err(StoreError::Held { why, .. }) = &locked else {
        panic!("locked during the pause: {locked:?}");
    };
    assert!(why.contains("fork"), "{why}");
    node.clock().advance(secs(21));
    let after = node
        .session_start(SessionStart::new("after", secs(20)))
        .await
        .expect("session");
    for process in [P, LIMITED] {
        let claimed = node
            .lease_claim(claim(after.id, process))
            .await
            .expect("claim");
        assert_eq!(claimed.leases.len(), 1, "{process}: claims resume");
    }
    let locked = node.lease_lock(lock(after.id, P)).await;
    assert!(locked.is_ok(), "locks resume: {locked:?}");
    node.close().await;
    store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// Creates a database of its own (the revokes below are per database) and a
/// login role with every privilege on the test schema's objects.
async fn restricted(base: &str, tag: &str, revoke: &str) -> (String, String, String, String) {
    let dbname = format!("lineage_role_{tag}_{}", std::process::id());
    let role = format!("lineage_role_{tag}_{}", std::process::id());
    support::admin_execute(base, &format!("DROP DATABASE IF EXISTS {dbname}")).await;
    support::admin_execute(base, &format!("CREATE DATABASE {dbname}")).await;
    support::admin_execute(base, &format!("DROP ROLE IF EXISTS {role}")).await;
    support::admin_execute(base, &format!("CREATE ROLE {role} LOGIN")).await;
    let (prefix, _) = base.rsplit_once('/').expect("a base URL with a database");
    let db_base = format!("{prefix}/{dbname}");
    let (url, schema) = support::postgres_schema(&db_base).await;
    // An administrator migrates (and so records the server's timeline).
    let admin = Store::connect(&url).await.expect("admin connect");
    admin.close().await;
    for sql in [
        format!("GRANT ALL ON SCHEMA {schema} TO {role}"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}"),
        format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"),
        revoke.to_owned(),
    ] {
        support::admin_execute(&url, &sql).await;
    }
    let worker_url = url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(worker_url, url, "the base URL names the user postgres");
    (url, worker_url, dbname, role)
}

async fn cleanup(base: &str, dbname: &str, role: &str) {
    support::admin_execute(
        base,
        &format!("DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"),
    )
    .await;
    support::admin_execute(base, &format!("DROP ROLE IF EXISTS {role}")).await;
}

/// A worker role that may not call `pg_walfile_name` (revoked, as hardened or
/// managed servers do) while the timeline was recorded by the administrator
/// who migrated: its claims work, as `drover_observe_lineage` tolerates the
/// same. Migration 0026's first check failed every claim of such a role with
/// "permission denied" (found in review; migration 0027).
#[tokio::test]
async fn a_worker_role_without_pg_walfile_name_can_still_claim() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (_admin_url, worker_url, dbname, role) = restricted(
        &base,
        "wal",
        "REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC",
    )
    .await;
    let outcome = async {
        let worker = Store::connect(&worker_url).await.expect("worker connect");
        worker
            .item_enqueue(ItemEnqueue::new(P, ["a"]))
            .await
            .expect("enqueue");
        let claimed = claim_one(&worker).await;
        worker.close().await;
        claimed
    }
    .await;
    cleanup(&base, &dbname, &role).await;
    match outcome {
        Ok(n) => assert_eq!(n, 1),
        Err(e) => panic!("claim as a role without pg_walfile_name: {e}"),
    }
}

/// How many keys (at most one) a new session of `worker` claims from [`P`].
async fn claim_one(worker: &Store) -> Result<usize, StoreError> {
    let session = worker
        .session_start(SessionStart::new("node", secs(20)))
        .await?;
    let claim = LeaseClaim {
        session: session.id,
        process: P.into(),
        max: 1,
        trace_links: false,
    };
    Ok(worker.lease_claim(claim).await?.leases.len())
}

/// A worker role that may not call `pg_control_system` (so its
/// `drover_observe_lineage` returns early and never records a timeline)
/// while an administrator recorded one is not paused for ever after the
/// server's timeline moves: it compares no timeline it could not record.
/// Migration 0026's first check compared the stale record with the new
/// timeline, which nothing the worker does could update (found in review).
#[tokio::test]
async fn a_worker_role_without_pg_control_system_is_not_paused_for_ever() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (admin_url, worker_url, dbname, role) = restricted(
        &base,
        "ctl",
        "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC",
    )
    .await;
    let outcome: Result<usize, StoreError> = async {
        let worker = Store::connect(&worker_url).await?;
        worker.item_enqueue(ItemEnqueue::new(P, ["a"])).await?;
        // The promotion, as the tests above make it.
        support::admin_execute(
            &admin_url,
            "UPDATE drover_lineage SET timeline = timeline + 1",
        )
        .await;
        // Every node reclaims every few seconds: its observation is all
        // that could notice the fork. An hour passes.
        worker.session_reclaim().await?;
        worker.clock().advance(secs(3600));
        worker.session_reclaim().await?;
        let claimed = claim_one(&worker).await?;
        worker.close().await;
        Ok(claimed)
    }
    .await;
    cleanup(&base, &dbname, &role).await;
    assert_eq!(
        outcome.expect("worker"),
        1,
        "claims paused an hour after the fork by a worker that cannot observe it"
    );
}

/// Ids handed out after the standby's last replayed record are lost with
/// the fork, and so is the sequences' own record of them: the promoted
/// standby can hand the same session id and the same fencing token out
/// again. The fork moves both sequences past anything the old primary could
/// have handed out. Before, a worker of before the fork whose session was
/// lost heartbeated on its old id and renewed the session a new worker had
/// just been given under that id, so it kept running its keys past the pause
/// (their claims lost, they run again elsewhere: twice at once), and could
/// claim, complete or close under the new worker's session (through a server
/// too, with the one worker token of a fleet); and the new primary's fencing
/// tokens restarted below the stale writer's, so a downstream system keeping
/// the highest token per key refused the new runs and took the stale one.
#[tokio::test]
async fn after_a_fork_no_session_id_or_fencing_token_of_before_is_handed_out_again() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let store = db.store.clone();
    store
        .item_enqueue(ItemEnqueue::new(P, ["a"]))
        .await
        .expect("enqueue");
    // A worker started a session and claimed a key on the old primary,
    // after the standby's last replayed record.
    let lost = store
        .session_start(SessionStart::new("lost", secs(20)))
        .await
        .expect("session");
    let claim = |session| LeaseClaim {
        session,
        process: P.into(),
        max: 1,
        trace_links: false,
    };
    let stale = store.lease_claim(claim(lost.id)).await.expect("claim");
    let stale_token = stale.leases[0].token.0;
    // The promoted standby never saw them: the key is pending, the session
    // unknown, and both sequences are where they were before.
    store
        .session_close(drover::store::SessionClose { session: lost.id })
        .await
        .expect("close");
    db.execute(&format!(
        "SELECT setval(pg_get_serial_sequence('drover_sessions', 'id'), {}, false), \
         setval('drover_lease_tokens', {stale_token}, false)",
        lost.id.0
    ))
    .await;
    db.execute("UPDATE drover_lineage SET timeline = timeline + 1")
        .await;
    let node = db.reconnect().await;
    let new = node
        .session_start(SessionStart::new("new", secs(20)))
        .await
        .expect("a session on the new primary");
    assert_ne!(new.id, lost.id, "a session id of before the fork again");
    let err = store
        .session_heartbeat(SessionHeartbeat { session: lost.id })
        .await
        .expect_err("the lost session is gone");
    assert!(matches!(err, StoreError::SessionExpired { .. }), "{err}");
    node.clock().advance(secs(21));
    let after = node
        .session_start(SessionStart::new("after the pause", secs(20)))
        .await
        .expect("a session after the pause");
    let fresh = node.lease_claim(claim(after.id)).await.expect("claim");
    assert_eq!(fresh.leases.len(), 1, "claims resume after the pause");
    assert!(
        fresh.leases[0].token.0 > stale_token,
        "the new run's fencing token {} is not above the stale writer's {stale_token}",
        fresh.leases[0].token.0
    );
    node.close().await;
    store.close().await;
    support::drop_schema(&base, &schema).await;
}

/// A promoted standby's run and item sequences can restart below what the
/// old primary handed out, as its session and token sequences can (the test
/// above). A run id is history's page cursor: a reader holding a page's
/// `next_before` from the old primary was shown, as older than that page, a
/// run that ended after the fork; and a reader following history by the
/// highest id it has seen skipped it. An item id is the claim order's FIFO
/// tie-break and part of a triage page cursor. Before, the fork moved the
/// session and token sequences only.
#[tokio::test]
async fn after_a_fork_no_run_id_or_item_id_of_before_is_handed_out_again() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let store = db.store.clone();
    let history = |store: Store, before: Option<i64>| async move {
        store
            .run_list(drover::store::RunList {
                process: Some(P.into()),
                before,
                limit: 1,
                ..Default::default()
            })
            .await
            .expect("history")
    };
    // The old primary ran "a" twice and made "b" known, after the standby's
    // last replayed record; a reader read history's first page of one.
    let session = store
        .session_start(SessionStart::new("lost", secs(20)))
        .await
        .expect("session");
    for _ in 0..2 {
        support::store::enqueue(&store, &["a"]).await;
        let leases = support::store::claim(&store, session.id, 1).await;
        support::store::complete(&store, &leases[0], drover::store::Outcome::Done)
            .await
            .expect("complete");
    }
    support::store::enqueue(&store, &["b"]).await;
    let page = history(store.clone(), None).await;
    let newest_seen = page[0].id;
    let item_id = |key: &'static str| {
        let url = db.sql_url.clone();
        async move {
            let pool = sqlx::PgPool::connect(&url).await.expect("connect");
            let id: i64 = sqlx::query_scalar("SELECT id FROM drover_items WHERE key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .expect("item id");
            pool.close().await;
            id
        }
    };
    let lost_item = item_id("b").await;
    // The promoted standby has none of it: both runs, "b" and the session
    // are gone, and both sequences are where they were before.
    let oldest_lost = history(store.clone(), Some(newest_seen)).await[0].id;
    store
        .session_close(drover::store::SessionClose {
            session: session.id,
        })
        .await
        .expect("close");
    db.execute(&format!(
        "DELETE FROM drover_runs WHERE id >= {oldest_lost}"
    ))
    .await;
    db.execute("DELETE FROM drover_items WHERE key = 'b'").await;
    db.execute(&format!(
        "SELECT setval(pg_get_serial_sequence('drover_runs', 'id'), {oldest_lost}, false), \
         setval(pg_get_serial_sequence('drover_items', 'id'), {lost_item}, false)"
    ))
    .await;
    db.execute("UPDATE drover_lineage SET timeline = timeline + 1")
        .await;
    let node = db.reconnect().await;
    support::store::enqueue(&node, &["c"]).await;
    assert!(
        item_id("c").await > lost_item,
        "an item id of before the fork again: {} (\"b\" had {lost_item})",
        item_id("c").await
    );
    node.clock().advance(secs(21));
    let after = node
        .session_start(SessionStart::new("after the pause", secs(20)))
        .await
        .expect("a session after the pause");
    let leases = support::store::claim(&node, after.id, 1).await;
    assert_eq!(leases.len(), 1, "claims resume after the pause");
    support::store::complete(&node, &leases[0], drover::store::Outcome::Done)
        .await
        .expect("complete");
    let new_run = history(node.clone(), None).await[0].id;
    assert!(
        new_run > newest_seen,
        "the run after the fork has id {new_run}, not above {newest_seen} that a reader saw before it"
    );
    let older = history(node.clone(), Some(newest_seen)).await;
    assert!(
        older.iter().all(|r| r.key != "c"),
        "the page older than the one read before the fork shows the run after it: {older:?}"
    );
    node.close().await;
    store.close().await;
    support::drop_schema(&base, &schema).await;
}
