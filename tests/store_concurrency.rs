//! Concurrency: parallel claimers (tasks on every engine, and OS processes on one
//! SQLite file) never hold the same key at once, never get the same fencing
//! token, and together drain every key.

mod support;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::store::{
    ItemEnqueue, ItemGet, ItemState, LeaseClaim, LeaseComplete, Outcome, RunList, SessionStart,
    Store, StoreEngine as _,
};
use support::each_engine_and_pooler;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

const P: &str = "drain";

fn key_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key-{i:04}")).collect()
}

/// Every run of [`P`]'s fencing token, read back from the history a page at a
/// time: what each claim handed out, whichever claimer or process took it.
async fn run_tokens(store: &Store) -> Vec<i64> {
    let mut tokens = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .run_list(RunList {
                process: Some(P.into()),
                before,
                limit: 500,
                ..RunList::default()
            })
            .await
            .expect("runs");
        let Some(last) = page.last() else {
            return tokens;
        };
        before = Some(last.id);
        tokens.extend(page.iter().map(|run| run.token.expect("a run's token").0));
    }
}

/// Fails unless no two of `tokens` are the same.
fn assert_distinct(mut tokens: Vec<i64>) {
    let all = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), all, "a fencing token handed out twice");
}

/// Claims and completes until a claim comes back empty; returns the keys it ran.
/// Each claimed key is registered in `in_flight` for the duration of its run, and
/// finding it already there fails the test.
async fn drain(store: Store, in_flight: Arc<Mutex<HashSet<String>>>) -> Vec<String> {
    let session = store
        .session_start(SessionStart::new("claimer", Duration::from_secs(60)))
        .await
        .expect("session");
    let mut ran = Vec::new();
    loop {
        let claim = LeaseClaim {
            session: session.id,
            process: P.into(),
            max: 7,
            trace_links: false,
        };
        let leases = store.lease_claim(claim).await.expect("claim").leases;
        if leases.is_empty() {
            return ran;
        }
        for lease in &leases {
            let fresh = in_flight.lock().expect("lock").insert(lease.key.clone());
            assert!(fresh, "{} handed out twice at once", lease.key);
        }
        tokio::task::yield_now().await;
        for lease in &leases {
            in_flight.lock().expect("lock").remove(&lease.key);
            let done = LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            };
            store.lease_complete(done).await.expect("complete");
            ran.push(lease.key.clone());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_claimers_never_share_a_key_and_together_drain_every_key() {
    each_engine_and_pooler(|db| async move {
        let keys = key_names(400);
        let enqueue = ItemEnqueue::new(P, keys.iter().cloned());
        db.store.item_enqueue(enqueue).await.expect("enqueue");
        let in_flight = Arc::new(Mutex::new(HashSet::new()));
        let workers: Vec<_> = (0..12)
            .map(|_| tokio::spawn(drain(db.store.clone(), in_flight.clone())))
            .collect();
        let mut ran = Vec::new();
        for worker in workers {
            ran.extend(worker.await.expect("worker"));
        }
        ran.sort();
        assert_eq!(ran, keys, "every key ran exactly once");
        let tokens = run_tokens(&db.store).await;
        assert_eq!(tokens.len(), keys.len());
        assert_distinct(tokens);
        let counts = db.store.process_counts_all().await.expect("counts");
        assert_eq!((counts[0].pending, counts[0].running), (0, 0));
    })
    .await;
}

/// The world a reconciler converges, one change counter per key: a producer
/// bumps a key's counter before it enqueues the key, and a run reads the
/// counter after its claim returns, as a reconciler reads the object it was
/// handed. The test judges from what the runs read, not from drover's
/// timestamps: on PostgreSQL a claim statement that began before an enqueue
/// may still lock the row that enqueue wrote, so a run's `started_at` can be
/// earlier than the `last_enqueued_at` it saw, and comparing the two failed a
/// correct run (seen once in CI).
struct World {
    /// How many changes each key has had.
    changes: Vec<AtomicU64>,
    /// The newest change any run of each key read.
    reconciled: Vec<AtomicU64>,
}

impl World {
    fn new(keys: usize) -> Self {
        Self {
            changes: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            reconciled: (0..keys).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The index of a key of [`key_names`].
    fn index(key: &str) -> usize {
        key.trim_start_matches("key-")
            .parse()
            .expect("a key of key_names")
    }

    /// A run of `key`, started after its claim returned, reads the world.
    fn reconcile(&self, key: &str) {
        let i = Self::index(key);
        let seen = self.changes[i].load(Ordering::SeqCst);
        self.reconciled[i].fetch_max(seen, Ordering::SeqCst);
    }
}

/// Claims and completes until `stop` is set and a claim comes back empty;
/// each run reads `world` first.
async fn work_until_stopped(store: Store, world: Arc<World>, stop: Arc<AtomicBool>) {
    let session = store
        .session_start(SessionStart::new("claimer", Duration::from_secs(60)))
        .await
        .expect("session");
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        let claim = LeaseClaim {
            session: session.id,
            process: P.into(),
            max: 3,
            trace_links: false,
        };
        let leases = store.lease_claim(claim).await.expect("claim").leases;
        if leases.is_empty() && stopping {
            return;
        }
        for lease in &leases {
            world.reconcile(&lease.key);
        }
        tokio::task::yield_now().await;
        let done: Vec<_> = leases
            .iter()
            .map(|lease| LeaseComplete {
                lease,
                outcome: &Outcome::Done,
                trace_id: None,
            })
            .collect();
        for result in support::store::complete_batch_as_a_worker(&store, &done).await {
            result.expect("lease held");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_enqueue_during_concurrent_runs_is_followed_by_a_run_that_sees_it() {
    each_engine_and_pooler(|db| async move {
        let keys = key_names(12);
        let world = Arc::new(World::new(keys.len()));
        let stop = Arc::new(AtomicBool::new(false));
        let claimers: Vec<_> = (0..6)
            .map(|_| {
                let (store, world, stop) = (db.store.clone(), world.clone(), stop.clone());
                tokio::spawn(work_until_stopped(store, world, stop))
            })
            .collect();
        let producers: Vec<_> = (0..3)
            .map(|p| {
                let (store, keys, world) = (db.store.clone(), keys.clone(), world.clone());
                tokio::spawn(async move {
                    for i in 0..60 {
                        let k = (i * 7 + p) % keys.len();
                        world.changes[k].fetch_add(1, Ordering::SeqCst);
                        store
                            .item_enqueue(ItemEnqueue::new(P, [keys[k].clone()]))
                            .await
                            .expect("enqueue");
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.expect("producer");
        }
        stop.store(true, Ordering::SeqCst);
        for claimer in claimers {
            claimer.await.expect("claimer");
        }
        for (i, key) in keys.iter().enumerate() {
            let item = db
                .store
                .item_get(ItemGet {
                    process: P.into(),
                    key: key.clone(),
                    runs_limit: 1,
                })
                .await
                .expect("item")
                .expect("a known key");
            assert_eq!(item.item.state, ItemState::Idle, "{key}");
            let (changes, reconciled) = (
                world.changes[i].load(Ordering::SeqCst),
                world.reconciled[i].load(Ordering::SeqCst),
            );
            assert_eq!(
                reconciled, changes,
                "{key}: its last change ({changes}) was read by no run (the newest read {reconciled})"
            );
        }
        let counts = db.store.process_counts_all().await.expect("counts");
        assert_eq!((counts[0].pending, counts[0].running), (0, 0));
    })
    .await;
}

/// The variable that turns [`worker_process`] into a claimer on a given database.
const WORKER_ENV: &str = "DROVER_TEST_WORKER_URL";

/// Not a test of its own: run by [`two_processes_on_one_sqlite_file_share_the_work`]
/// as a child process (ignored, so it never counts as a passing test; run
/// alone, without the variable, it fails). It claims one key, says `HOLDING`
/// and waits for a line on stdin (so the parent can see both processes hold a
/// lease at the same time), then drains, printing `RAN key` per key.
#[tokio::test]
#[ignore = "a child process of two_processes_on_one_sqlite_file_share_the_work"]
async fn worker_process() {
    let url = std::env::var(WORKER_ENV).unwrap_or_else(|_| {
        panic!("worker_process is a child of two_processes_on_one_sqlite_file_share_the_work: {WORKER_ENV} is not set")
    });
    let store = Store::connect(&url).await.expect("child connects");
    let session = store
        .session_start(SessionStart::new("child", Duration::from_secs(60)))
        .await
        .expect("session");
    let claim = LeaseClaim {
        session: session.id,
        process: P.into(),
        max: 1,
        trace_links: false,
    };
    let first = store
        .lease_claim(claim)
        .await
        .expect("claim")
        .leases
        .remove(0);
    println!("\nHOLDING {}", first.key);
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("go signal");
    let done = LeaseComplete {
        lease: &first,
        outcome: &Outcome::Done,
        trace_id: None,
    };
    store.lease_complete(done).await.expect("complete");
    println!("RAN {}", first.key);
    for key in drain(store, Arc::default()).await {
        println!("RAN {key}");
    }
}

/// Spawns a worker child and waits until it holds its first lease.
async fn ready_child(exe: &std::path::Path, url: &str) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = tokio::process::Command::new(exe)
        .args([
            "--exact",
            "worker_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await.expect("child output") {
        if line.starts_with("HOLDING ") {
            return (child, lines);
        }
    }
    panic!(
        "child exited before it held a lease: {:?}",
        child.wait().await
    );
}

#[tokio::test]
async fn two_processes_on_one_sqlite_file_share_the_work() {
    let (db, _dir) = support::sqlite().await;
    let keys = key_names(600);
    let enqueue = ItemEnqueue::new(P, keys.iter().cloned());
    db.store.item_enqueue(enqueue).await.expect("enqueue");
    let exe = std::env::current_exe().expect("test binary");
    let mut children = Vec::new();
    // The first child holds its lease until told to go, so the second claims while
    // it does: two processes hold distinct leases on one file at the same time.
    for _ in 0..2 {
        children.push(ready_child(&exe, &db.url).await);
    }
    for (child, _) in &mut children {
        let stdin = child.stdin.as_mut().expect("child stdin");
        stdin.write_all(b"go\n").await.expect("start child");
    }
    let mut ran = Vec::new();
    for (mut child, mut lines) in children {
        let mut mine = 0;
        while let Some(line) = lines.next_line().await.expect("child output") {
            if let Some((_, key)) = line.split_once("RAN ") {
                ran.push(key.to_owned());
                mine += 1;
            }
        }
        assert!(
            child.wait().await.expect("child exits").success(),
            "child failed"
        );
        assert!(mine > 0, "each process ran at least the key it held");
    }
    ran.sort();
    assert_eq!(
        ran, keys,
        "every key ran exactly once across both processes"
    );
    // Both processes took tokens from one counter, each under the file's write
    // lock: none was handed out twice.
    let tokens = run_tokens(&db.store).await;
    assert_eq!(tokens.len(), keys.len());
    assert_distinct(tokens);
}

/// A quiet node's heartbeat gets the file's write lock while a busy node on
/// the same SQLite file writes back to back. Each store has a writer
/// connection of its own, as two processes do. Before, the quiet one waited in
/// SQLite's busy handler, which sleeps 1, 2, 5 … up to 100 ms between tries:
/// the busy node took the lock again microseconds after each commit, so the
/// heartbeat kept missing the gap, for seconds, past its session's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_node_heartbeats_while_a_busy_node_writes_the_same_file() {
    let (db, _dir) = support::sqlite().await;
    let busy = Store::connect(&db.url).await.expect("the busy node");
    let quiet = Store::connect(&db.url).await.expect("the quiet node");
    let session = quiet
        .session_start(SessionStart::new("quiet", Duration::from_secs(60)))
        .await
        .expect("session");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    // Several tasks keep the busy node's writer queued for: one transaction
    // starts the moment the one before commits, as under a burn-down.
    for w in 0..4 {
        let (busy, stop) = (busy.clone(), Arc::clone(&stop));
        writers.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let keys = (0..200).map(|i| format!("busy-{w}-{round}-{i}"));
                busy.item_enqueue(ItemEnqueue::new("busy", keys))
                    .await
                    .expect("a busy enqueue");
                round += 1;
            }
            round
        }));
    }
    // Let the busy node get going, then time the quiet node's heartbeats.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..30 {
        let started = std::time::Instant::now();
        quiet
            .session_heartbeat(drover::store::SessionHeartbeat {
                session: session.id,
            })
            .await
            .expect("a heartbeat");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut rounds = 0;
    for writer in writers {
        rounds += writer.await.expect("a busy writer");
    }
    assert!(
        rounds > 30,
        "the busy node hardly wrote: {rounds} transactions"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a heartbeat waited {slowest:?} for the write lock while the busy node \
         committed {rounds} transactions"
    );
}
