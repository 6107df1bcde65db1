//! Controllers sharing one PostgreSQL store, whose claims go together in one
//! statement (the store's claim groups): when the link is cut after that
//! statement commits, every controller in the group must treat its claim as
//! unknown and give its session up, so the keys leased to it come back and
//! run once, and no key runs twice.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{ItemGet, ItemState, RunList, RunOutcome, StoreEngine as _};
use support::backend::TestBackend;
use support::commit_cut::CommitCut;
use support::locks::Holder;
use tokio::sync::mpsc;

/// The controllers, one per process, each claiming both keys of its own.
const PROCESSES: [&str; 4] = ["g0", "g1", "g2", "g3"];
const KEYS: [&str; 2] = ["a", "b"];

/// Text only the statement of a group of claims holds (`claims.rs`'s
/// `CLAIM_GROUP`), not a claim on its own.
const GROUP: &str = "unnest(";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_claims_whose_commit_is_unknown_gives_every_session_up_and_loses_no_key() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let enqueue: Vec<String> = PROCESSES
        .iter()
        .map(|p| format!("drover_enqueue('{p}', ARRAY['a', 'b'])"))
        .collect();
    db.execute(&format!("SELECT {}", enqueue.join(", "))).await;
    let (proxy, store) = CommitCut::in_front_of(&base, &db.url).await;
    proxy.arm_for(GROUP);
    // Every claim waits for this lock: the first controller's runs on its
    // own, the others queue behind it and then go as one statement.
    let pool = db.store.postgres_pool().expect("postgres").clone();
    let holder = Holder::lock_table(&pool, "drover_items").await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut running = Vec::new();
    for process in PROCESSES {
        let tx = tx.clone();
        let reconciler = move |task: Task| {
            let tx = tx.clone();
            async move {
                tx.send((task.process().to_owned(), task.key().to_owned()))
                    .expect("the test listens");
                Ok::<_, BoxError>(Action::Done)
            }
        };
        // A TTL far past the test: only closing a session frees its leases.
        let controller =
            Controller::builder(TestBackend::Store(store.clone()), process, reconciler)
                .parallelism(KEYS.len())
                .ttl(Duration::from_secs(600))
                .idle_poll(Duration::from_secs(3600))
                .build()
                .expect("valid settings");
        running.push(support::running::spawn(controller));
    }
    holder.wait_for_a_waiter_running(&pool, GROUP).await;
    holder.release().await;
    tokio::time::timeout(Duration::from_secs(20), proxy.cut())
        .await
        .expect("the group's commit was cut");

    // Judged by what the work reports: each key ran once.
    let mut ran = BTreeMap::new();
    for _ in 0..PROCESSES.len() * KEYS.len() {
        let run = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("every key ran within 20 s")
            .expect("a controller reports");
        *ran.entry(run).or_insert(0) += 1;
    }
    for (stop, handle) in running {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("shutdown within 20 s")
            .expect("controller task");
    }
    assert!(rx.try_recv().is_err(), "no key ran a second time");
    assert_eq!(ran.len(), PROCESSES.len() * KEYS.len());
    assert!(ran.values().all(|n| *n == 1), "each key ran once: {ran:?}");

    // The group's keys were leased by the lost commit, handed back when
    // each session was given up, then leased again; the others once.
    let mut grouped: BTreeMap<&str, usize> = BTreeMap::new();
    for process in PROCESSES {
        for key in KEYS {
            let mut runs = db
                .store
                .run_list(RunList {
                    process: Some(process.into()),
                    key: Some(key.into()),
                    limit: 10,
                    ..RunList::default()
                })
                .await
                .expect("run_list");
            runs.reverse();
            let outcomes: Vec<RunOutcome> = runs.iter().map(|r| r.outcome).collect();
            match outcomes.as_slice() {
                [RunOutcome::Done] => {}
                [RunOutcome::Canceled, RunOutcome::Done] => {
                    assert_ne!(runs[0].session, runs[1].session, "{process}/{key}");
                    *grouped.entry(process).or_insert(0) += 1;
                }
                other => panic!("{process}/{key}: runs {other:?}"),
            }
            let item = db
                .store
                .item_get(ItemGet {
                    process: process.into(),
                    key: key.into(),
                    runs_limit: 0,
                })
                .await
                .expect("item_get")
                .expect("still an item");
            assert_eq!(item.item.state, ItemState::Idle, "{process}/{key}");
        }
    }
    assert!(
        grouped.values().all(|n| *n == KEYS.len()),
        "a claim takes both keys of its process, or none: {grouped:?}"
    );
    assert!(
        grouped.len() >= 2,
        "the cut statement held the claims of two controllers or more: {grouped:?}"
    );
    store.close().await;
    db.store.close().await;
    support::drop_schema(&base, &schema).await;
}
