//! Controllers sharing one PostgreSQL store, whose claims and completions go
//! together (the store's groups): when the link is cut after a group
//! commits, each controller in it must act on an unknown commit. A claim's
//! controller gives its session up, so the keys leased to it come back; a
//! completion's run writes its outcome again and is told the lease is gone.
//! Either way each key runs once and is left idle with one `done` run.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{ItemGet, ItemState, Run, RunList, RunOutcome, Store, StoreEngine as _};
use support::TestDb;
use support::backend::TestBackend;
use support::commit_cut::CommitCut;
use support::locks::Holder;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The controllers, one per process, each claiming both keys of its own.
const PROCESSES: [&str; 4] = ["g0", "g1", "g2", "g3"];
const KEYS: [&str; 2] = ["a", "b"];

/// Text only the statement of a group of claims holds (`claims.rs`'s
/// `CLAIM_GROUP`), not a claim on its own.
const CLAIM_GROUP: &str = "unnest(";

/// Text of the history rows a batch of completions written the general way
/// appends (`runs.rs`'s `LOG_FROM_ROWS`), as a group of several sessions'
/// batches is; one controller's clean batch is written by one other
/// statement.
const COMPLETION_GROUP: &str = "AS r(outcome, ctid";

/// Every key of [`PROCESSES`] pending, on `db`, enqueued in one transaction
/// so that their controllers are woken together.
async fn enqueue(db: &TestDb) {
    let calls: Vec<String> = PROCESSES
        .iter()
        .map(|p| format!("drover_enqueue('{p}', ARRAY['{}'])", KEYS.join("', '")))
        .collect();
    db.execute(&format!("SELECT {}", calls.join(", "))).await;
}

/// A controller per process on one store, each reporting its runs.
struct Fleet {
    running: Vec<(CancellationToken, JoinHandle<()>)>,
    ran: mpsc::UnboundedReceiver<(String, String)>,
}

impl Fleet {
    fn start(store: &Store) -> Self {
        let (tx, ran) = mpsc::unbounded_channel();
        let running = PROCESSES
            .iter()
            .map(|process| {
                let tx = tx.clone();
                let reconciler = move |task: Task| {
                    let tx = tx.clone();
                    async move {
                        tx.send((task.process().to_owned(), task.key().to_owned()))
                            .expect("the test listens");
                        Ok::<_, BoxError>(Action::Done)
                    }
                };
                // A TTL far past the test: only closing a session frees its
                // leases.
                let backend = TestBackend::Store(store.clone());
                let controller = Controller::builder(backend, *process, reconciler)
                    .parallelism(KEYS.len())
                    .ttl(Duration::from_secs(600))
                    .idle_poll(Duration::from_secs(3600))
                    .build()
                    .expect("valid settings");
                support::running::spawn(controller)
            })
            .collect();
        Self { running, ran }
    }

    /// Waits until every key has run, stops the controllers, and fails
    /// unless each key ran exactly once: judged by what the work reports.
    async fn each_key_ran_once(&mut self) {
        let mut ran = BTreeMap::new();
        for _ in 0..PROCESSES.len() * KEYS.len() {
            let run = tokio::time::timeout(Duration::from_secs(20), self.ran.recv())
                .await
                .expect("every key ran within 20 s")
                .expect("a controller reports");
            *ran.entry(run).or_insert(0) += 1;
        }
        for (stop, handle) in self.running.drain(..) {
            stop.cancel();
            tokio::time::timeout(Duration::from_secs(20), handle)
                .await
                .expect("shutdown within 20 s")
                .expect("controller task");
        }
        assert!(self.ran.try_recv().is_err(), "no key ran a second time");
        assert_eq!(ran.len(), PROCESSES.len() * KEYS.len());
        assert!(ran.values().all(|n| *n == 1), "each key ran once: {ran:?}");
    }
}

/// `process/key`'s runs, oldest first, after checking that it is idle.
async fn idle_with_runs(db: &TestDb, process: &str, key: &str) -> Vec<Run> {
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
    runs
}

/// A fleet on a store whose group's commit was cut, and its database.
struct Cut {
    db: TestDb,
    schema: String,
    /// The store behind the proxy, which the fleet works on.
    store: Store,
    fleet: Fleet,
}

impl Cut {
    /// Enqueues every key, starts a [`Fleet`] on a store behind a
    /// [`CommitCut`] while a test transaction holds `table` locked, lets it go
    /// once a statement containing `group` (which only a group of several
    /// controllers' requests runs) waits for it, and returns once that
    /// group's commit has been cut.
    async fn of_a_group(base: &str, table: &'static str, group: &'static str) -> Self {
        let (db, schema) = support::postgres(base).await;
        enqueue(&db).await;
        let (proxy, store) = CommitCut::in_front_of(base, &db.url).await;
        proxy.arm_for(group);
        let pool = db.store.postgres_pool().expect("postgres").clone();
        let holder = Holder::lock_table(&pool, table).await;
        let fleet = Fleet::start(&store);
        holder.wait_for_a_waiter_running(&pool, group).await;
        holder.release().await;
        tokio::time::timeout(Duration::from_secs(20), proxy.cut())
            .await
            .expect("the group's commit was cut");
        Self {
            db,
            schema,
            store,
            fleet,
        }
    }

    /// Closes both stores and drops the test's schema.
    async fn finish(self, base: &str) {
        self.store.close().await;
        self.db.store.close().await;
        support::drop_schema(base, &self.schema).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_claims_whose_commit_is_unknown_gives_every_session_up_and_loses_no_key() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    // Every claim reads the items: the first controller's claim runs on
    // its own, the others queue behind it and then go as one statement.
    let mut cut = Cut::of_a_group(&base, "drover_items", CLAIM_GROUP).await;
    let db = &cut.db;
    cut.fleet.each_key_ran_once().await;

    // The group's keys were leased by the lost commit, handed back when
    // each session was given up, then leased again; the others once.
    let mut grouped: BTreeMap<&str, usize> = BTreeMap::new();
    for process in PROCESSES {
        for key in KEYS {
            let runs = idle_with_runs(db, process, key).await;
            let outcomes: Vec<RunOutcome> = runs.iter().map(|r| r.outcome).collect();
            match outcomes.as_slice() {
                [RunOutcome::Done] => {}
                [RunOutcome::Canceled, RunOutcome::Done] => {
                    assert_ne!(runs[0].session, runs[1].session, "{process}/{key}");
                    *grouped.entry(process).or_insert(0) += 1;
                }
                other => panic!("{process}/{key}: runs {other:?}"),
            }
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
    cut.finish(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_completions_whose_commit_is_unknown_writes_each_outcome_once() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    // Every completion appends runs: the first controller's batch is written
    // on its own, the others queue behind it and then go as one transaction.
    let mut cut = Cut::of_a_group(&base, "drover_runs", COMPLETION_GROUP).await;
    let db = &cut.db;
    cut.fleet.each_key_ran_once().await;

    // Written once, by the lost commit or by the run's retry.
    for process in PROCESSES {
        for key in KEYS {
            let runs = idle_with_runs(db, process, key).await;
            let outcomes: Vec<RunOutcome> = runs.iter().map(|r| r.outcome).collect();
            assert_eq!(outcomes, [RunOutcome::Done], "{process}/{key}");
        }
    }
    cut.finish(&base).await;
}
