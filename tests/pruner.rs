//! Retention that runs: a [`Pruner`] on a short interval applies each
//! process's retention on both engines, with the database clock moved instead
//! of waiting, and counts what it removed in `drover_history_pruned_total`.

mod support;

use std::time::Duration;

use drover::metrics::PruneMetrics;
use drover::runner::{Action, Controller, Task};
use drover::runner::{Pruner, Resyncer};
use drover::store::{
    Item, ItemEnqueue, ItemGet, ItemState, Lease, LeaseClaim, LeaseComplete, Outcome,
    ProcessConfigure, PruneTurn, RunList, SessionStart, Store, StoreEngine as _,
};
use prometheus_client::registry::Registry;
use support::each_engine;
use support::serve::Serve;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const P: &str = "provision";
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Claims up to `max` ready keys of [`P`] under a fresh session.
async fn claim(store: &Store, max: u32) -> Vec<Lease> {
    let session = store
        .session_start(SessionStart::new("test", Duration::from_secs(30)))
        .await
        .expect("session_start");
    let claim = LeaseClaim {
        session: session.id,
        process: P.into(),
        max,
        trace_links: false,
    };
    store.lease_claim(claim).await.expect("claim").leases
}

/// Ends each lease with `outcome`.
async fn complete(store: &Store, leases: &[Lease], outcome: &Outcome) {
    for lease in leases {
        let params = LeaseComplete {
            lease,
            outcome,
            trace_id: None,
        };
        store.lease_complete(params).await.expect("complete");
    }
}

/// Runs `keys` to `done` once each (enqueue, claim, complete).
async fn run_once(store: &Store, keys: &[&str]) {
    let enqueue = ItemEnqueue::new(P, keys.iter().copied()).priority(10);
    store.item_enqueue(enqueue).await.expect("enqueue");
    let max = u32::try_from(keys.len()).expect("few keys");
    let ran = support::store::run_ready(store, P, max, &Outcome::Done).await;
    assert_eq!(ran.len(), keys.len(), "every key was claimed");
}

async fn item(store: &Store, key: &str) -> Option<Item> {
    let get = ItemGet {
        process: P.into(),
        key: key.into(),
        runs_limit: 0,
    };
    store.item_get(get).await.expect("item_get").map(|d| d.item)
}

/// The ids of `key`'s runs, newest first.
async fn run_ids(store: &Store, key: &str) -> Vec<i64> {
    let list = RunList {
        process: Some(P.into()),
        key: Some(key.into()),
        limit: 1000,
        ..RunList::default()
    };
    let runs = store.run_list(list).await.expect("run_list");
    runs.iter().map(|r| r.id).collect()
}

/// `drover_history_pruned_total{what}` as `registry` exposes it.
fn pruned(registry: &Registry, what: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    let series = format!("drover_history_pruned_total{{what=\"{what}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Starts a pruner on a 20 ms interval counting into a registry of its own;
/// returns the registry, the stop token and the task.
fn start(store: &Store, configure: impl FnOnce(Pruner) -> Pruner) -> (Registry, CancellationToken) {
    let (registry, stop, _task) = start_task(store, configure);
    (registry, stop)
}

/// [`start`], with the pruner's task, to wait for it after a stop.
fn start_task(
    store: &Store,
    configure: impl FnOnce(Pruner) -> Pruner,
) -> (Registry, CancellationToken, JoinHandle<()>) {
    let mut registry = Registry::default();
    let metrics = PruneMetrics::new(&mut registry);
    let pruner = Pruner::new(store.clone())
        .every(Duration::from_millis(20))
        .metrics(metrics);
    let stop = CancellationToken::new();
    let task = tokio::spawn(configure(pruner).run(stop.clone()));
    (registry, stop, task)
}

/// Polls the store (every 10 ms, for at most 30 s) until `key` of [`P`] has
/// `runs` runs.
async fn wait_for_runs(store: &Store, key: &str, runs: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while run_ids(store, key).await.len() != runs {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} still has {} runs after 30 s",
            run_ids(store, key).await.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls the counters (every 10 ms, for at most 30 s) until they reach
/// `runs` and `idle_keys`.
async fn wait_for(registry: &Registry, runs: u64, idle_keys: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = (pruned(registry, "runs"), pruned(registry, "idle_keys"));
        if got == (runs, idle_keys) {
            return;
        }
        assert!(
            got.0 <= runs && got.1 <= idle_keys,
            "pruned too much: {got:?}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "pruned {got:?} after 30 s, expected ({runs}, {idle_keys})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_pruner_applies_each_rule_and_counts_what_it_removed() {
    each_engine(|db| async move {
        let store = &db.store;
        let rules = ProcessConfigure::new(P)
            .keep_runs_for(HOUR)
            .keep_runs_per_key(2)
            .forget_idle_after(Some(DAY));
        store.process_configure(rules).await.expect("configure");
        // Two days ago: two keys converged (idle), one parked, one left running
        // and one enqueued for later.
        let old = ["old-a", "old-b", "parked", "running"];
        store
            .item_enqueue(ItemEnqueue::new(P, old))
            .await
            .expect("enqueue");
        let mut leases = claim(store, 4).await;
        let running = leases.pop().expect("four leases");
        assert_eq!(running.key, "running");
        let parked = leases.pop().expect("three leases");
        complete(store, &leases, &Outcome::Done).await;
        complete(store, &[parked], &Outcome::Permanent("broken".into())).await;
        let later = ItemEnqueue::new(P, ["waiting"]).after(30 * DAY);
        store.item_enqueue(later).await.expect("enqueue");
        store.clock().advance(2 * DAY);
        // Now: a key with four runs, and one converged just now.
        for _ in 0..4 {
            run_once(store, &["capped"]).await;
        }
        run_once(store, &["fresh"]).await;
        let newest = run_ids(store, "capped").await[..2].to_vec();

        let (registry, stop) = start(store, |p| p);
        // The 2-day-old runs of old-a, old-b and parked, and 2 of capped's 4;
        // the idle keys old-a and old-b.
        wait_for(&registry, 5, 2).await;
        stop.cancel();

        assert_eq!(run_ids(store, "capped").await, newest, "the newest 2 stay");
        assert_eq!(run_ids(store, "fresh").await.len(), 1);
        for key in ["old-a", "old-b", "parked"] {
            assert!(
                run_ids(store, key).await.is_empty(),
                "{key}'s run is too old"
            );
        }
        for key in ["old-a", "old-b"] {
            assert_eq!(item(store, key).await, None, "{key} was forgotten");
        }
        for (key, state) in [
            ("parked", ItemState::Parked),
            ("running", ItemState::Running),
            ("waiting", ItemState::Pending),
            ("fresh", ItemState::Idle),
            ("capped", ItemState::Idle),
        ] {
            let got = item(store, key).await.map(|i| i.state);
            assert_eq!(got, Some(state), "{key} stays");
        }
    })
    .await;
}

/// Six keys of [`P`] with three runs each under a cap of one run per key:
/// twelve runs for retention to remove. Returns the keys.
async fn twelve_runs_over_the_cap(store: &Store) -> [&'static str; 6] {
    let rules = ProcessConfigure::new(P).keep_runs_per_key(1);
    store.process_configure(rules).await.expect("configure");
    let keys = ["a", "b", "c", "d", "e", "f"];
    for _ in 0..3 {
        run_once(store, &keys).await;
    }
    keys
}

#[tokio::test]
async fn a_walk_longer_than_the_budget_goes_on_at_the_next_tick() {
    each_engine(|db| async move {
        let store = &db.store;
        let keys = twelve_runs_over_the_cap(store).await;
        // One batch of 2 runs covers one key: six ticks at least, each going
        // on from where the last one stopped.
        let (registry, stop) = start(store, |p| p.batch(2).budget(1));
        wait_for(&registry, 12, 0).await;
        stop.cancel();
        for key in keys {
            assert_eq!(run_ids(store, key).await.len(), 1, "{key} keeps 1 run");
        }
    })
    .await;
}

/// SQLite keeps any bytes SQL writes as text, and `drover_enqueue` took a
/// process name that is not UTF-8 before migration 0014. One such name failed
/// the whole process list (a `ColumnDecode` of `process`), and with it every
/// tick of retention (and resync) for every process: the pruner removed
/// nothing, anywhere. Now the list leaves that one name out and the pruner
/// prunes the others.
#[tokio::test]
async fn a_process_name_that_is_not_utf8_stops_no_other_process_retention() {
    let (db, _dir) = support::sqlite().await;
    let store = &db.store;
    let keys = twelve_runs_over_the_cap(store).await;
    db.execute(
        "INSERT INTO drover_processes (process, created_at) VALUES (CAST(X'70FF' AS TEXT), 0)",
    )
    .await;
    let listed: Vec<String> = store
        .process_list()
        .await
        .expect("the list reads past the name")
        .into_iter()
        .map(|s| s.process)
        .collect();
    assert_eq!(listed, [P]);
    let (registry, stop) = start(store, |p| p);
    wait_for(&registry, 12, 0).await;
    stop.cancel();
    for key in keys {
        assert_eq!(run_ids(store, key).await.len(), 1, "{key} keeps 1 run");
    }
}

/// Asks for [`P`]'s (or `process`'s) turn to prune as `holder`, held for a
/// minute.
async fn turn(store: &Store, process: &str, holder: i64) -> bool {
    let params = PruneTurn {
        process: process.into(),
        holder,
        hold: Duration::from_secs(60),
    };
    store.prune_turn(params).await.expect("prune_turn")
}

#[tokio::test]
async fn one_pruner_at_a_time_holds_a_process_turn_until_it_runs_out() {
    each_engine(|db| async move {
        let store = &db.store;
        store
            .process_configure(ProcessConfigure::new(P))
            .await
            .expect("configure");
        assert!(turn(store, P, 1).await, "a free turn is taken");
        assert!(!turn(store, P, 2).await, "a held turn is refused");
        assert!(turn(store, P, 1).await, "the holder renews it");
        store.clock().advance(Duration::from_secs(59));
        assert!(!turn(store, P, 2).await, "renewed: still held a minute on");
        store.clock().advance(Duration::from_secs(2));
        assert!(turn(store, P, 2).await, "run out: the next pruner takes it");
        assert!(!turn(store, P, 1).await, "and the old holder is refused");
        assert!(
            !turn(store, "nobody", 1).await,
            "an unknown process has none"
        );
    })
    .await;
}

/// Polls two pruners' counters (every 10 ms, for at most 30 s) until their
/// runs removed add up to `runs`; returns each one's.
async fn wait_for_both(a: &Registry, b: &Registry, runs: u64) -> (u64, u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = (pruned(a, "runs"), pruned(b, "runs"));
        if got.0 + got.1 >= runs {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pruned {got:?} after 30 s, expected {runs} in all"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn pruners_sharing_a_database_walk_each_process_once() {
    each_engine(|db| async move {
        let store = &db.store;
        let keys = twelve_runs_over_the_cap(store).await;
        // Six ticks at least (one batch of 2 runs each): without turns both
        // pruners would walk, each taking some of the batches.
        let first = start_task(store, |p| p.batch(2).budget(1));
        let second = start_task(store, |p| p.batch(2).budget(1));
        let (a, b) = wait_for_both(&first.0, &second.0, 12).await;
        assert_eq!(a + b, 12, "nothing removed twice");
        assert!(a == 0 || b == 0, "one pruner held the turn: {a} and {b}");
        // The holder stops; the other takes the turn once it runs out.
        let (holder, other) = if a > 0 {
            (first, second)
        } else {
            (second, first)
        };
        holder.1.cancel();
        holder.2.await.expect("the stopped pruner's task ends");
        run_once(store, &keys).await;
        // Past the turn's hold (two intervals, at least 10 s), on the
        // database clock: the other pruner takes the turn at its next tick.
        store.clock().advance(Duration::from_secs(11));
        wait_for(&other.0, 6, 0).await;
        assert_eq!(
            pruned(&holder.0, "runs"),
            12,
            "the stopped pruner removed no more"
        );
        other.1.cancel();
        for key in keys {
            assert_eq!(run_ids(store, key).await.len(), 1, "{key} keeps 1 run");
        }
    })
    .await;
}

#[tokio::test]
async fn a_controller_on_the_database_prunes_every_process() {
    each_engine(|db| async move {
        let store = &db.store;
        let rules = ProcessConfigure::new(P).keep_runs_per_key(1);
        store.process_configure(rules).await.expect("configure");
        for _ in 0..3 {
            run_once(store, &["a"]).await;
        }
        let reconciler = |_: Task| async { Ok::<_, std::io::Error>(Action::Done) };
        let controller = Controller::builder(store.clone(), "elsewhere", reconciler)
            .prune_every(Duration::from_millis(20))
            .build()
            .expect("valid settings");
        let stop = CancellationToken::new();
        let running = tokio::spawn(controller.run(stop.clone()));
        wait_for_runs(store, "a", 1).await;
        stop.cancel();
        running.await.expect("joins").expect("runs");
    })
    .await;
}

#[tokio::test]
async fn drover_serve_prunes_and_counts_it_at_metrics() {
    each_engine(|db| async move {
        let store = &db.store;
        let rules = ProcessConfigure::new(P).keep_runs_per_key(1);
        store.process_configure(rules).await.expect("configure");
        for _ in 0..3 {
            run_once(store, &["a"]).await;
        }
        let flags = ["--listen", "127.0.0.1:0", "--prune-every", "20ms"];
        let serve = Serve::start_with(&db.url, &flags).await;
        let pruned = "drover_history_pruned_total{what=\"runs\"} 2\n";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let metrics = reqwest::get(format!("{}/metrics", serve.url))
                .await
                .expect("GET /metrics")
                .text()
                .await
                .expect("a body");
            if metrics.contains(pruned) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{metrics}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(run_ids(store, "a").await.len(), 1, "the newest run stays");
        support::process::stop(serve.child).await;
    })
    .await;
}

/// The longest interval the maintenance loops accept (`Duration::MAX`, as a
/// library user may write for "hardly ever", or `drover serve
/// --prune-every 550000000000y`) makes them wait instead of panicking: the
/// next tick's jittered wait (up to 10 % more than the interval) overflowed a
/// `Duration` and the task panicked, about every other start.
#[tokio::test]
async fn the_longest_interval_waits_instead_of_panicking() {
    let (db, _dir) = support::sqlite().await;
    for _ in 0..32 {
        let stop = CancellationToken::new();
        stop.cancel();
        let pruner = Pruner::new(db.store.clone()).every(Duration::MAX);
        let resyncer = Resyncer::new(db.store.clone()).every(Duration::MAX);
        let pruner = tokio::spawn(pruner.run(stop.clone())).await;
        let resyncer = tokio::spawn(resyncer.run(stop)).await;
        assert!(pruner.is_ok(), "the pruner: {pruner:?}");
        assert!(resyncer.is_ok(), "the resyncer: {resyncer:?}");
    }
}
