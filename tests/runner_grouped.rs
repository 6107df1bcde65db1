//! Controllers sharing one PostgreSQL store, whose claims and completions go
//! together (the store's groups): when the link is cut after a group
//! commits, each controller in it must act on an unknown commit. A claim's
//! controller gives its session up, so the keys leased to it come back; a
//! completion's run writes its outcome again and is told it was written.
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

/// The controllers of a test, one per process, each claiming both keys of
/// its own: each test has its own names, so that the counts of one
/// (`drover_outcomes_total`, one registry per test binary) are its own.
type Processes = [&'static str; 4];
const KEYS: [&str; 2] = ["a", "b"];

/// Text only the statement of a group of claims holds (`claims.rs`'s
/// `CLAIM_GROUP`), not a claim on its own.
const CLAIM_GROUP: &str = "unnest(";

/// Text of the history rows a batch of completions written the general way
/// appends (`runs.rs`'s `LOG_FROM_ROWS`), as a group of several sessions'
/// batches is; one controller's clean batch is written by one other
/// statement.
const COMPLETION_GROUP: &str = "AS r(outcome, ctid";

/// Every key of `processes` pending, on `db`, enqueued in one transaction
/// so that their controllers are woken together.
async fn enqueue(db: &TestDb, processes: Processes) {
    let calls: Vec<String> = processes
        .iter()
        .map(|p| format!("drover_enqueue('{p}', ARRAY['{}'])", KEYS.join("', '")))
        .collect();
    db.execute(&format!("SELECT {}", calls.join(", "))).await;
}

/// A controller per process on one store, each reporting its runs.
struct Fleet {
    processes: Processes,
    running: Vec<(CancellationToken, JoinHandle<()>)>,
    ran: mpsc::UnboundedReceiver<(String, String)>,
}

impl Fleet {
    fn start(store: &Store, processes: Processes) -> Self {
        let (tx, ran) = mpsc::unbounded_channel();
        let running = processes
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
        Self {
            processes,
            running,
            ran,
        }
    }

    /// Waits until every key has run, stops the controllers, and fails
    /// unless each key ran exactly once: judged by what the work reports.
    async fn each_key_ran_once(&mut self) {
        let mut ran = BTreeMap::new();
        for _ in 0..self.processes.len() * KEYS.len() {
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
        assert_eq!(ran.len(), self.processes.len() * KEYS.len());
        assert!(ran.values().all(|n| *n == 1), "each key ran once: {ran:?}");
    }
}

/// `drover_outcomes_total{process, outcome}` in this test binary's registry.
fn counted(process: &str, outcome: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, drover::metrics::registry())
        .expect("the registry encodes");
    let series = format!(r#"drover_outcomes_total{{process="{process}",outcome="{outcome}"}} "#);
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().expect("a count"))
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
    async fn of_a_group(
        base: &str,
        table: &'static str,
        group: &'static str,
        processes: Processes,
    ) -> Self {
        let (db, schema) = support::postgres(base).await;
        enqueue(&db, processes).await;
        let (proxy, store) = CommitCut::in_front_of(base, &db.url).await;
        proxy.arm_for(group);
        let pool = db.store.postgres_pool().expect("postgres").clone();
        let holder = Holder::lock_table(&pool, table).await;
        let fleet = Fleet::start(&store, processes);
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
    let processes = ["c0", "c1", "c2", "c3"];
    let mut cut = Cut::of_a_group(&base, "drover_items", CLAIM_GROUP, processes).await;
    let db = &cut.db;
    cut.fleet.each_key_ran_once().await;

    // The group's keys were leased by the lost commit, handed back when
    // each session was given up, then leased again; the others once.
    let mut grouped: BTreeMap<&str, usize> = BTreeMap::new();
    for process in processes {
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
    let processes = ["w0", "w1", "w2", "w3"];
    let mut cut = Cut::of_a_group(&base, "drover_runs", COMPLETION_GROUP, processes).await;
    let db = &cut.db;
    cut.fleet.each_key_ran_once().await;

    // Written once, by the lost commit; its retry was told so, and each run
    // counted `done`, none `lost`.
    for process in processes {
        for key in KEYS {
            let runs = idle_with_runs(db, process, key).await;
            let outcomes: Vec<RunOutcome> = runs.iter().map(|r| r.outcome).collect();
            assert_eq!(outcomes, [RunOutcome::Done], "{process}/{key}");
        }
        assert_eq!(counted(process, "lost"), 0, "{process}");
        assert_eq!(counted(process, "done"), KEYS.len() as u64, "{process}");
    }
    cut.finish(&base).await;
}
