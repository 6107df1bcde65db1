//! "Never twice at once across database restarts": two controllers work a
//! PostgreSQL database through a fault proxy that, five times while runs are
//! in flight, resets every connection and refuses new ones for 300 ms (what
//! the clients of a restarting server meet: in-flight claims, completions and
//! heartbeats cut, then no server for a while). Judged from a tick log the
//! work writes itself: no two runs of a key overlap, and every key ran after
//! its last enqueue.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{ItemEnqueue, ItemList, ItemState, Store, StoreEngine as _};
use support::fault_proxy::FaultProxy;
use support::process::eventually_within;
use support::ticks::TickLog;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "restarted";
/// Fewer keys than the two controllers have slots (2 × 4): every key runs at
/// once, and an enqueue during its run finds a free slot to start another in.
const KEYS: usize = 6;

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("k{i:02}")).collect()
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_nanos()
}

/// Enqueues every key, retrying while the connections are being ended; the
/// wall-clock time just before the enqueue that went through.
async fn enqueue_all(store: &Store) -> u128 {
    for _ in 0..100 {
        let at = now_nanos();
        match store.item_enqueue(ItemEnqueue::new(PROCESS, keys())).await {
            Ok(_) => return at,
            Err(e) => {
                eprintln!("enqueue during the restart: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    panic!("the enqueue never went through");
}

/// A controller whose runs tick as `KEY/TOKEN` four times, 20 ms apart, and
/// stop ticking as soon as they are cancelled.
fn controller(store: Store, log: &TickLog) -> Controller<impl drover::runner::Reconciler, Store> {
    let log = log.clone();
    Controller::builder(store, PROCESS, move |task: Task| {
        let log = log.clone();
        async move {
            let tag = format!("{}/{}", task.key(), task.fencing_token().0);
            for _ in 0..3 {
                if task.is_cancelled() {
                    return Err::<Action, BoxError>("cancelled".into());
                }
                log.tick(&tag);
                tokio::select! {
                    () = task.cancelled() => return Err("cancelled".into()),
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            log.tick(&tag);
            Ok(Action::Done)
        }
    })
    .parallelism(4)
    .idle_poll(Duration::from_millis(100))
    .ttl(Duration::from_secs(3))
    .build()
    .expect("valid settings")
}

/// Each key's runs (by tag), as (first tick, last tick), in start order.
fn runs_by_key(log: &TickLog) -> BTreeMap<String, Vec<(u128, u128)>> {
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    let mut runs: BTreeMap<String, (u128, u128)> = BTreeMap::new();
    for (tag, at) in text.lines().filter_map(|l| l.split_once(' ')) {
        let at: u128 = at.parse().expect("a tick's time");
        let span = runs.entry(tag.to_owned()).or_insert((at, at));
        span.0 = span.0.min(at);
        span.1 = span.1.max(at);
    }
    let mut by_key: BTreeMap<String, Vec<(u128, u128)>> = BTreeMap::new();
    for (tag, span) in runs {
        let (key, _) = tag.split_once('/').expect("KEY/TOKEN");
        by_key.entry(key.to_owned()).or_default().push(span);
    }
    for spans in by_key.values_mut() {
        spans.sort_unstable();
    }
    by_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_runs_twice_at_once_and_none_is_lost_across_database_restarts() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    let (db, schema) = support::postgres(&base).await;
    let producer = db.store.clone();
    let proxy = FaultProxy::start(support::server_addr(&base).await).await;
    let url = proxy.url_for(&db.url);
    let log = TickLog::new();
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let store = Store::connect(&url).await.expect("connect");
        let controller = controller(store.clone(), &log);
        let stop = stop.clone();
        workers.push((
            store,
            tokio::spawn(async move { controller.run(stop).await.expect("controller runs") }),
        ));
    }
    let mut last_enqueue = enqueue_all(&producer).await;
    for round in 0..5 {
        eventually_within("runs in flight", Duration::from_secs(30), || async {
            log.path().exists()
        })
        .await;
        proxy.reset();
        tokio::time::sleep(Duration::from_millis(300)).await; // the outage
        proxy.heal();
        eprintln!("round {round}: the database came back");
        enqueue_all(&producer).await;
        // Again while the runs that enqueue started are ticking: each must
        // make its key run once more afterwards, never alongside.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            last_enqueue = enqueue_all(&producer).await;
        }
    }
    eventually_within("every key converged", Duration::from_secs(60), || async {
        let Ok(items) = producer
            .item_list(ItemList {
                process: PROCESS.into(),
                state: None,
                after_key: None,
                limit: 100,
            })
            .await
        else {
            return false;
        };
        items.len() == KEYS && items.iter().all(|i| i.state == ItemState::Idle)
    })
    .await;
    stop.cancel();
    for (store, worker) in workers {
        worker.await.expect("a worker");
        store.close().await;
    }
    let runs = runs_by_key(&log);
    assert_eq!(runs.len(), KEYS, "every key ran");
    for (key, spans) in &runs {
        for pair in spans.windows(2) {
            let ((_, last), (first, _)) = (pair[0], pair[1]);
            assert!(
                last < first,
                "{key}: a run was still ticking {:.1} ms after the next one started",
                (last - first) as f64 / 1e6
            );
        }
        let latest = spans.last().expect("a run").0;
        assert!(
            latest > last_enqueue,
            "{key}: no run started after its last enqueue"
        );
    }
    producer.close().await;
    support::drop_schema(&base, &schema).await;
}
