//! What a store configured for a transaction-pooling PgBouncer
//! (`?pool_mode=transaction`) sends, judged on the wire by the pool lint
//! (`support/pool_lint.rs`): no statement is prepared before a moment the
//! server is idle and used after it, the one thing that lets a pooler bind
//! one client's parameters to a statement another server never parsed. A
//! real PgBouncer shows that only when another client takes the server at
//! that moment (CI saw it once: "unnamed prepared statement does not exist"
//! while a store connected); the lint sees it every time. Needs only
//! `DROVER_TEST_POSTGRES_URL`.

mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::runner::{Action, Controller, Task};
use drover::store::{
    ErrorGroups, HistoryActivity, ItemEnqueue, ItemGet, ItemList, ItemPark, ItemRetry, LeaseClaim,
    LeaseComplete, LeaseLock, LeaseRelease, Outcome, ProcessPage, ProcessPause, RunList,
    SessionHeartbeat, SessionStart, Store, StoreEngine as _,
};
use support::pool_lint::through_lint;
use support::{drop_database, postgres_url};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn connecting_prepares_nothing_across_an_idle_moment() {
    let Some(direct) = postgres_url() else {
        return;
    };
    let (db, name, lint) = through_lint(&direct).await;
    // A second store on a migrated database: the connect checks (role,
    // lineage) and the migration check, on connections of their own.
    let again = Store::connect(&db.url).await.expect("connect again");
    again.clock_now().await.expect("a first statement");
    again.close().await;
    lint.assert_clean(3);
    db.store.close().await;
    drop_database(&direct, &name).await;
}

#[tokio::test]
async fn the_store_api_prepares_nothing_across_an_idle_moment() {
    let Some(direct) = postgres_url() else {
        return;
    };
    let (db, name, lint) = through_lint(&direct).await;
    let store = &db.store;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
    store
        .item_enqueue(ItemEnqueue::new("api", keys.iter().cloned()))
        .await
        .expect("enqueue");
    let session = store
        .session_start(SessionStart::new("lint", Duration::from_secs(30)))
        .await
        .expect("session");
    let claimed = store
        .lease_claim(LeaseClaim {
            session: session.id,
            process: "api".into(),
            max: 6,
            // The claim that reads each run's trace contexts too.
            trace_links: true,
        })
        .await
        .expect("claim");
    assert_eq!(claimed.leases.len(), 6);
    store
        .session_heartbeat(SessionHeartbeat {
            session: session.id,
        })
        .await
        .expect("heartbeat");
    let outcomes = [
        Outcome::Done,
        Outcome::Transient("flaky".into()),
        Outcome::Permanent("broken".into()),
        Outcome::RequeueAfter(Duration::from_secs(60)),
    ];
    let batch: Vec<_> = claimed.leases[..4]
        .iter()
        .zip(&outcomes)
        .map(|(lease, outcome)| LeaseComplete {
            lease,
            outcome,
            trace_id: None,
        })
        .collect();
    for answer in store.lease_complete_batch(&batch).await.expect("batch") {
        answer.expect("completed");
    }
    store
        .lease_complete(LeaseComplete {
            lease: &claimed.leases[4],
            outcome: &Outcome::Done,
            trace_id: None,
        })
        .await
        .expect("complete");
    store
        .lease_release(LeaseRelease {
            lease: &claimed.leases[5],
        })
        .await
        .expect("release");
    let locked = store
        .lease_lock(LeaseLock {
            session: session.id,
            process: "api".into(),
            key: "k19".into(),
        })
        .await
        .expect("lock an idle key");
    store
        .lease_complete(LeaseComplete {
            lease: &locked,
            outcome: &Outcome::Done,
            trace_id: None,
        })
        .await
        .expect("complete the locked key");
    // The admin's reads and writes.
    store
        .item_list(ItemList {
            process: "api".into(),
            state: None,
            after_key: None,
            limit: 100,
        })
        .await
        .expect("list");
    let key = claimed.leases[2].key.clone();
    store
        .item_get(ItemGet {
            process: "api".into(),
            key: key.clone(),
            runs_limit: 10,
        })
        .await
        .expect("get")
        .expect("the key exists");
    store
        .item_retry(ItemRetry {
            process: "api".into(),
            key: key.clone(),
            actor: "test".into(),
        })
        .await
        .expect("retry");
    store
        .item_park(ItemPark {
            process: "api".into(),
            key,
            reason: "by hand".into(),
            actor: "test".into(),
        })
        .await
        .expect("park");
    store
        .error_groups(ErrorGroups {
            process: "api".into(),
            limit: 10,
        })
        .await
        .expect("error groups");
    store
        .run_list(RunList {
            limit: 50,
            ..RunList::default()
        })
        .await
        .expect("runs");
    store
        .history_activity(HistoryActivity {
            window: Duration::from_secs(3600),
            page: ProcessPage::first(10),
        })
        .await
        .expect("activity");
    store.process_counts_all().await.expect("counts");
    store
        .process_pause(ProcessPause {
            process: "api".into(),
            paused: true,
            actor: "test".into(),
        })
        .await
        .expect("pause");
    store.process_list().await.expect("processes");
    store.session_reclaim().await.expect("reclaim");
    lint.assert_clean(20);
    db.store.close().await;
    drop_database(&direct, &name).await;
}

#[tokio::test]
async fn two_controllers_prepare_nothing_across_an_idle_moment() {
    let Some(direct) = postgres_url() else {
        return;
    };
    let (db, name, lint) = through_lint(&direct).await;
    const KEYS: usize = 100;
    let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
    let done = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let store = Store::connect(&db.url).await.expect("connect");
        let (seen, done) = (seen.clone(), done.clone());
        let reconcile = move |task: Task| {
            let (seen, done) = (seen.clone(), done.clone());
            async move {
                let mut seen = seen.lock().expect("seen");
                seen.insert(task.key().to_owned());
                if seen.len() == KEYS {
                    done.notify_one();
                }
                Ok::<_, std::io::Error>(Action::Done)
            }
        };
        let controller = Controller::builder(store, "loop", reconcile)
            .parallelism(8)
            .idle_poll(Duration::from_millis(50))
            .build()
            .expect("a valid controller");
        handles.push(tokio::spawn(controller.run(stop.clone())));
    }
    db.store
        .item_enqueue(ItemEnqueue::new(
            "loop",
            (0..KEYS).map(|i| format!("k{i:03}")),
        ))
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(60), done.notified())
        .await
        .expect("every key ran");
    stop.cancel();
    for handle in handles {
        handle.await.expect("join").expect("a clean shutdown");
    }
    lint.assert_clean(10);
    db.store.close().await;
    drop_database(&direct, &name).await;
}
