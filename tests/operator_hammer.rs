//! Operators and maintenance hammering a process while two nodes run it, on
//! every engine, judged from what the runs themselves log: no key ever runs
//! twice at once (nor, under a concurrency limit, more keys than the limit),
//! each key's fencing tokens rise in the order its runs start, and once the
//! operators stop, one enqueue of every key runs each of them again.
//!
//! The operators do what a person and the maintenance tasks do at the worst
//! moments: enqueue, delete, retry and park single keys; bulk retry, park and
//! delete by filter; enqueue and delete inside a caller's transaction,
//! committed or rolled back; pause and resume; prune (one run kept per key,
//! idle keys forgotten after 1 ms); read the error groups; and a resyncer
//! every 100 ms (found sound in session 40's review, kept as a guard).

mod support;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use drover::backoff::Backoff;
use drover::runner::{Action, BoxError, Controller, Reconciler, Resyncer, Task, permanent};
use drover::store::{
    ErrorGroups, ItemDelete, ItemEnqueue, ItemFilter, ItemPark, ItemRetry, ItemState, ItemsDelete,
    ItemsPark, ItemsRetry, ProcessConfigure, ProcessPause, PruneCursor, RetentionPrune, Store,
    StoreEngine as _, StoreError,
};
use support::backend::TestBackend;
use support::process::eventually_within;
use support::store::P;
use tokio_util::sync::CancellationToken;

/// How long the operators hammer.
const HAMMER_FOR: Duration = Duration::from_secs(5);

/// The keys: few, so operators and runs meet on them often.
const KEYS: u32 = 24;

fn key(i: u32) -> String {
    format!("h/{:02}", i % KEYS)
}

/// One run as the work itself saw it.
#[derive(Debug, Clone)]
struct Seen {
    key: String,
    token: i64,
    start: Instant,
    end: Option<Instant>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn lock(log: &Log) -> std::sync::MutexGuard<'_, Vec<Seen>> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks a run's end when its reconcile ends or is dropped (cancelled).
struct Ended(Log, usize);

impl Drop for Ended {
    fn drop(&mut self) {
        lock(&self.0)[self.1].end = Some(Instant::now());
    }
}

/// A controller on `backend` whose runs log themselves in `log`, last a few
/// milliseconds, and end every way a run can: done, requeued, a transient
/// error (backoff), a permanent one (parked).
fn logging(backend: TestBackend, log: &Log) -> Controller<impl Reconciler, TestBackend> {
    let log = Arc::clone(log);
    Controller::builder(backend, P, move |task: Task| {
        let log = Arc::clone(&log);
        async move {
            let at = {
                let mut seen = lock(&log);
                seen.push(Seen {
                    key: task.key().to_owned(),
                    token: task.fencing_token().0,
                    start: Instant::now(),
                    end: None,
                });
                seen.len() - 1
            };
            let _ended = Ended(Arc::clone(&log), at);
            let r = rand::random::<u32>();
            tokio::time::sleep(Duration::from_millis(u64::from(r % 15))).await;
            match r % 7 {
                0 => Err::<Action, BoxError>(
                    permanent(format!("{}: broke after {}s", task.key(), r % 100)).into(),
                ),
                1 | 2 => Err(format!("{}: flaky {}", task.key(), r % 10).into()),
                3 => Ok(Action::RequeueAfter(Duration::from_millis(20))),
                _ => Ok(Action::Done),
            }
        }
    })
    .parallelism(4)
    .idle_poll(Duration::from_millis(50))
    .prune_every(Duration::from_millis(100))
    .build()
    .expect("controller")
}

/// One operator's act, chosen by `r`, on one of the two nodes' stores.
async fn act(store: &Store, r: u32) -> Result<(), StoreError> {
    let (one, other) = (key(r >> 8), key(r >> 12));
    let by = || "operator".to_owned();
    match (r >> 3) % 13 {
        0..=2 => store
            .item_enqueue(ItemEnqueue::new(P, [one, other]))
            .await
            .map(drop),
        3 => store
            .item_delete(ItemDelete {
                process: P.into(),
                key: one,
                actor: by(),
            })
            .await
            .map(drop),
        4 => store
            .item_retry(ItemRetry {
                process: P.into(),
                key: one,
                actor: by(),
            })
            .await
            .map(drop),
        5 => store
            .item_park(ItemPark {
                process: P.into(),
                key: one,
                reason: "parked by hand".into(),
                actor: by(),
            })
            .await
            .map(drop),
        6 => {
            let filter = ItemFilter::new(P).key_prefix("h/1");
            let retry = ItemsRetry::new(filter, by()).batch(3);
            store.items_retry_where(retry).await.map(drop)
        }
        7 => {
            let filter = ItemFilter::new(P).key_prefix("h/0");
            let park = ItemsPark::new(filter, by(), "bulk").batch(2);
            store.items_park_where(park).await.map(drop)
        }
        8 => {
            let filter = ItemFilter::new(P).state(ItemState::Parked);
            let delete = ItemsDelete::new(filter, by()).batch(4);
            store.items_delete_where(delete).await.map(drop)
        }
        9 => {
            let mut tx = store.begin().await?;
            tx.item_enqueue(ItemEnqueue::new(P, [one])).await?;
            let delete = ItemDelete {
                process: P.into(),
                key: other,
                actor: by(),
            };
            // A running key's delete is refused; the transaction goes on.
            match tx.item_delete(delete).await {
                Ok(_) | Err(StoreError::AlreadyLeased { .. }) => {}
                Err(e) => return Err(e),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            if r.is_multiple_of(2) {
                tx.commit().await
            } else {
                tx.rollback().await
            }
        }
        10 => {
            let pause = |paused| ProcessPause {
                process: P.into(),
                paused,
                actor: by(),
            };
            store.process_pause(pause(true)).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            store.process_pause(pause(false)).await.map(drop)
        }
        11 => store
            .retention_prune(RetentionPrune {
                process: P.into(),
                cursor: PruneCursor::default(),
                batch: 3,
            })
            .await
            .map(drop),
        _ => store
            .error_groups(ErrorGroups {
                process: P.into(),
                limit: 10,
            })
            .await
            .map(drop),
    }
}

/// Hammers for [`HAMMER_FOR`] with two nodes running `P` (under `limit`, if
/// given), then judges the runs' log.
async fn hammer(db: support::TestDb, limit: Option<u32>) {
    let backoff =
        Backoff::new(Duration::from_millis(10), 2.0, Duration::from_millis(40)).expect("a backoff");
    let settings = ProcessConfigure::new(P)
        .backoff(backoff)
        .keep_runs_per_key(1)
        .forget_idle_after(Some(Duration::from_millis(1)))
        .resync_every(Some(Duration::from_secs(1)))
        .resync_jitter(0.0)
        .concurrency(limit);
    db.store
        .process_configure(settings)
        .await
        .expect("configure");
    let log: Log = Arc::default();
    let other = db.reconnect().await;
    let mut nodes = Vec::new();
    for backend in [db.worker.clone(), TestBackend::Store(other.clone())] {
        let (stop, controller) = (CancellationToken::new(), logging(backend, &log));
        let running = stop.clone();
        let node = tokio::spawn(async move { controller.run(running).await.expect("runs") });
        nodes.push((stop, node));
    }
    let maintenance = CancellationToken::new();
    let resyncer = Resyncer::new(other.clone())
        .every(Duration::from_millis(100))
        .run(maintenance.clone());
    let resyncer = tokio::spawn(resyncer);
    let stores = [db.store.clone(), other.clone()];
    let (until, mut acts) = (Instant::now() + HAMMER_FOR, 0);
    while Instant::now() < until {
        let r = rand::random::<u32>();
        match act(&stores[(r % 2) as usize], r).await {
            Ok(()) | Err(StoreError::AlreadyLeased { .. }) => acts += 1,
            Err(e) => panic!("an operator's act failed: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(u64::from(r % 4))).await;
    }
    assert!(acts > 100, "the operators hardly acted: {acts}");
    // Every key once more, and each must run after it.
    let all: Vec<String> = (0..KEYS).map(key).collect();
    let resume = ProcessPause {
        process: P.into(),
        paused: false,
        actor: "operator".into(),
    };
    db.store.process_pause(resume).await.expect("resume");
    let enqueued = Instant::now();
    db.store
        .item_enqueue(ItemEnqueue::new(P, all.clone()))
        .await
        .expect("the last enqueue");
    let not_run = || -> Vec<String> {
        let seen = lock(&log);
        let ran = |k: &String| seen.iter().any(|s| &s.key == k && s.start >= enqueued);
        all.iter().filter(|k| !ran(k)).cloned().collect()
    };
    let wait = "every key to run after the last enqueue";
    eventually_within(wait, Duration::from_secs(30), || async {
        not_run().is_empty()
    })
    .await;
    maintenance.cancel();
    resyncer.await.expect("the resyncer");
    for (stop, node) in nodes {
        stop.cancel();
        node.await.expect("a node");
    }
    let seen = lock(&log).clone();
    judge(&seen, limit);
    other.close().await;
}

/// Judges the runs' own log: no key's runs overlap, at most `limit` runs at
/// once, and each key's tokens rise in the order its runs started.
fn judge(seen: &[Seen], limit: Option<u32>) {
    let end = |s: &Seen| s.end.expect("every run ended");
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            assert!(
                a.key != b.key || !(a.start < end(b) && b.start < end(a)),
                "two runs of {} at once: tokens {} and {}",
                a.key,
                a.token,
                b.token
            );
        }
    }
    if let Some(limit) = limit {
        let mut edges: Vec<(Instant, i64)> = seen
            .iter()
            .flat_map(|s| [(s.start, 1), (end(s), -1)])
            .collect();
        // An end and a start at the same instant: the end first.
        edges.sort();
        let (mut running, mut most) = (0, 0);
        for (_, step) in edges {
            running += step;
            most = most.max(running);
        }
        assert!(
            most <= i64::from(limit),
            "{most} runs at once under a limit of {limit}"
        );
    }
    let mut by_key: Vec<&Seen> = seen.iter().collect();
    by_key.sort_by(|a, b| a.key.cmp(&b.key).then(a.start.cmp(&b.start)));
    for pair in by_key.windows(2) {
        if pair[0].key == pair[1].key {
            assert!(
                pair[0].token < pair[1].token,
                "{}: a later run's token {} is not above {}",
                pair[0].key,
                pair[1].token,
                pair[0].token
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operators_and_maintenance_never_run_a_key_twice_at_once_nor_strand_one() {
    support::each_engine(|db| hammer(db, None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operators_and_maintenance_never_break_a_concurrency_limit() {
    support::each_engine(|db| hammer(db, Some(2))).await;
}
