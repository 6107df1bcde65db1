//! drover across a PostgreSQL failover (DESIGN.md rule 12): a primary and a
//! streaming standby (see `support::ha`), reached through a multi-host URL or
//! through one address (a proxy moved to the new primary after the promotion,
//! like a virtual IP or a DNS name, its open connections left where they were);
//! two library `Controller`s (two nodes, each with its own store) run keys
//! whose work ticks into a log while a client enqueues, or (the `cli_`
//! rounds) three `drover work --exec` processes whose shell command ticks
//! while HTTP enqueues go to a `drover serve`; the primary is killed,
//! or left running read-only (a demoted writer whose pooled connections stay),
//! and the standby is promoted. Every key must converge, no two runs of a key
//! may overlap (judged from the ticks), and with synchronous replication every
//! acknowledged enqueue must be followed by a run. Each round prints how long
//! work took to resume after the promotion (a figure, not asserted). PostgreSQL only (skipped with the
//! reason printed when `DROVER_TEST_POSTGRES_URL` is not set).

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drover::runner::{Action, BoxError, Controller, Task};
use drover::store::{ItemEnqueue, Store, StoreEngine as _};
use support::fault_proxy::FaultProxy;
use support::ha::{self, Replication};
use support::process::eventually_within;
use support::ticks::TickLog;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "failover";
const KEYS: usize = 12;
const TTL: Duration = Duration::from_secs(2);

/// How the workers reach the database.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// A multi-host URL naming the primary, then the standby.
    MultiHost,
    /// One address, a proxy moved to the new primary after the promotion
    /// (connections already open stay on the old one).
    Proxy,
}

/// How the old primary goes away.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// Stopped at once (`pg_ctl stop -m immediate`).
    Killed,
    /// Left running, read-only for every session, its connections open.
    ReadOnly,
}

/// Who does the work and who enqueues.
#[derive(Debug, Clone, Copy)]
enum Fleet {
    /// Two library `Controller`s; a client `Store` enqueues.
    Library,
    /// Three `drover work --exec` processes whose shell command ticks; HTTP
    /// enqueues to a `drover serve`.
    Cli,
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// Work that ticks as `KEY#RUN-WORKER-TOKEN` every 20 ms for 100 ms, or
/// until cancelled.
fn ticking(
    log: TickLog,
    runs: Arc<AtomicU64>,
    worker: &'static str,
) -> impl drover::runner::Reconciler {
    ticks(log, runs, worker, 6)
}

/// Work that ticks as [`ticking`]'s for as long as its worker holds the key
/// (until cancelled, at most 20 s).
fn holding(
    log: TickLog,
    runs: Arc<AtomicU64>,
    worker: &'static str,
) -> impl drover::runner::Reconciler {
    ticks(log, runs, worker, 1000)
}

/// Work that ticks every 20 ms, `n` times and once more at the end, unless
/// cancelled first.
fn ticks(
    log: TickLog,
    runs: Arc<AtomicU64>,
    worker: &'static str,
    n: usize,
) -> impl drover::runner::Reconciler {
    move |task: Task| {
        let (log, runs) = (log.clone(), runs.clone());
        async move {
            let tag = format!(
                "{}#{}-{worker}-{}",
                task.key(),
                runs.fetch_add(1, Ordering::Relaxed),
                task.fencing_token()
            );
            for _ in 0..n {
                log.tick(&tag);
                tokio::select! {
                    () = task.cancelled() => return Err::<Action, BoxError>("cancelled".into()),
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            log.tick(&tag);
            Ok(Action::Done)
        }
    }
}

fn start<R: drover::runner::Reconciler>(
    store: Store,
    reconciler: R,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let controller = Controller::builder(store, PROCESS, reconciler)
        .ttl(TTL)
        .idle_poll(Duration::from_millis(100))
        .shutdown_deadline(Duration::from_secs(1))
        .build()
        .expect("valid settings");
    support::running::spawn(controller)
}

/// Each run of each key as (start, end) in nanoseconds, from the tick log.
fn runs_by_key(log: &TickLog) -> HashMap<String, Vec<(u128, u128, String)>> {
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    let mut spans: HashMap<String, (u128, u128, String)> = HashMap::new();
    for line in text.lines() {
        let Some((tag, at)) = line.split_once(' ') else {
            continue;
        };
        let Ok(at) = at.parse::<u128>() else { continue };
        let span = spans
            .entry(tag.to_owned())
            .or_insert((at, at, tag.to_owned()));
        span.0 = span.0.min(at);
        span.1 = span.1.max(at);
    }
    let mut keys: HashMap<String, Vec<(u128, u128, String)>> = HashMap::new();
    for (tag, span) in spans {
        let key = tag
            .split_once('#')
            .map_or(tag.as_str(), |(k, _)| k)
            .to_owned();
        keys.entry(key).or_default().push(span);
    }
    for runs in keys.values_mut() {
        runs.sort_unstable();
    }
    keys
}

/// Enqueues the keys round-robin every 20 ms until `stop` through `send`
/// (true when acknowledged), recording when each acknowledged enqueue was
/// sent; returns how many were refused.
async fn enqueue_until<F, Fut>(
    send: F,
    stop: CancellationToken,
    acked: Arc<Mutex<Vec<(String, u128)>>>,
) -> u64
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut refused = 0;
    for i in 0.. {
        if stop.is_cancelled() {
            break;
        }
        let key = format!("k{}", i % KEYS);
        let sent = now_nanos();
        if send(key.clone()).await {
            acked.lock().expect("lock").push((key, sent));
        } else {
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    refused
}

/// The shell command of the CLI fleet: ticks `KEY#PID` into `log` every
/// 20 ms, seven times, as the library fleet's work does.
fn ticking_exec(log: &TickLog) -> String {
    format!(
        r#"sh -c 'for i in 1 2 3 4 5 6 7; do echo "$1#$$ $(date +%s%N)" >> {0}; sleep 0.02; done' sh"#,
        log.path().display()
    )
}

/// What runs the keys during a round, to stop at its end.
enum Working {
    Library(Vec<(CancellationToken, tokio::task::JoinHandle<()>)>),
    Cli(Vec<tokio::process::Child>, Box<support::serve::Serve>),
}

async fn failover(replication: Replication, loss: Loss, route: Route, fleet: Fleet) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let Some(cluster) = ha::cluster(replication) else {
        return;
    };
    cluster.wait_streaming(replication).await;
    let proxy = FaultProxy::start(([127, 0, 0, 1], cluster.primary).into()).await;
    let url = match route {
        Route::MultiHost => cluster.multi_host_url(),
        Route::Proxy => format!("postgres://postgres@{}/postgres", proxy.addr),
    };
    let client = Store::connect(&url)
        .await
        .expect("connect through the multi-host URL");
    let log = TickLog::new();
    // The CLI workers' own logs, printed if the round fails.
    let logs = tempfile::tempdir().expect("a log directory");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop_enqueues = CancellationToken::new();
    let (working, enqueuer) = match fleet {
        Fleet::Library => {
            let runs = Arc::new(AtomicU64::new(0));
            let workers = [
                (Store::connect(&url).await.expect("worker a"), "a"),
                (Store::connect(&url).await.expect("worker b"), "b"),
            ]
            .into_iter()
            .map(|(store, name)| start(store, ticking(log.clone(), runs.clone(), name)))
            .collect();
            let store = client.clone();
            let send = move |key: String| {
                let store = store.clone();
                async move {
                    store
                        .item_enqueue(ItemEnqueue::new(PROCESS, [key.as_str()]))
                        .await
                        .is_ok()
                }
            };
            let enqueuer = tokio::spawn(enqueue_until(send, stop_enqueues.clone(), acked.clone()));
            (Working::Library(workers), enqueuer)
        }
        Fleet::Cli => {
            let exec = ticking_exec(&log);
            let workers = (0..3)
                .map(|i| {
                    support::cli::worker_logged(
                        &url,
                        PROCESS,
                        &exec,
                        &["--ttl", "2s", "--parallelism", "4"],
                        &logs.path().join(format!("worker-{i}.log")),
                    )
                })
                .collect();
            let serve = support::serve::Serve::start(&url).await;
            let http = reqwest::Client::new();
            let items = format!("{}/v1/processes/{PROCESS}/items", serve.url);
            let send = move |key: String| {
                let (http, items) = (http.clone(), items.clone());
                async move {
                    let sent = http
                        .post(&items)
                        .json(&serde_json::json!({ "keys": [key] }))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    sent.is_ok_and(|r| r.status().is_success())
                }
            };
            let enqueuer = tokio::spawn(enqueue_until(send, stop_enqueues.clone(), acked.clone()));
            (Working::Cli(workers, Box::new(serve)), enqueuer)
        }
    };
    eventually_within(
        "two runs of every key",
        Duration::from_secs(60),
        async || runs_by_key(&log).values().map(Vec::len).sum::<usize>() >= 2 * KEYS,
    )
    .await;

    match loss {
        Loss::Killed => cluster.kill_primary(),
        Loss::ReadOnly => cluster.make_primary_read_only().await,
    }
    cluster.promote();
    proxy.move_to(([127, 0, 0, 1], cluster.standby).into());
    let promoted = now_nanos();
    let promoted_at = Instant::now();
    tokio::time::sleep(TTL * 2).await;
    stop_enqueues.cancel();
    let refused = enqueuer.await.expect("enqueuer");

    // Every key converges: nothing pending, running or backing off.
    loop {
        let counts = client.process_counts_all().await;
        let busy = counts.as_ref().map_or(u64::MAX, |c| {
            c.iter()
                .filter(|c| c.process == PROCESS)
                .map(|c| c.pending + c.running + c.backoff)
                .sum()
        });
        if busy == 0 {
            break;
        }
        if promoted_at.elapsed() >= Duration::from_secs(40) {
            print_logs(logs.path(), &client).await;
        }
        assert!(
            promoted_at.elapsed() < Duration::from_secs(40),
            "{fleet:?}/{replication:?}/{loss:?}/{route:?}: not converged 40 s after the promotion ({counts:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match working {
        Working::Library(workers) => {
            for (stop, handle) in workers {
                stop.cancel();
                tokio::time::timeout(Duration::from_secs(20), handle)
                    .await
                    .expect("controller stops")
                    .expect("controller task");
            }
        }
        Working::Cli(workers, serve) => {
            for worker in workers {
                support::process::stop(worker).await;
            }
            drop(serve);
        }
    }

    let runs = runs_by_key(&log);
    let mut overlaps = Vec::new();
    for (key, spans) in &runs {
        for pair in spans.windows(2) {
            if pair[1].0 <= pair[0].1 {
                overlaps.push(format!("{key}: {:?} then {:?}", pair[0], pair[1]));
            }
        }
    }
    let resumed = runs
        .values()
        .flatten()
        .map(|(start, _, _)| *start)
        .filter(|start| *start > promoted)
        .min()
        .map(|start| Duration::from_nanos(u64::try_from(start - promoted).expect("fits")));
    let acked = acked.lock().expect("lock").clone();
    let mut last_ack: HashMap<&str, u128> = HashMap::new();
    for (key, sent) in &acked {
        let at = last_ack.entry(key.as_str()).or_default();
        *at = (*at).max(*sent);
    }
    let lost: Vec<&str> = last_ack
        .iter()
        .filter(|(key, sent)| {
            !runs
                .get(**key)
                .is_some_and(|s| s.iter().any(|(start, _, _)| start > *sent))
        })
        .map(|(key, _)| *key)
        .collect();
    eprintln!(
        "{fleet:?}/{replication:?}/{loss:?}/{route:?}: resumed {resumed:?} after the promotion; {} enqueues acknowledged, \
         {refused} refused; {} runs; overlaps {}; keys whose last acknowledged enqueue never ran: {}",
        acked.len(),
        runs.values().map(Vec::len).sum::<usize>(),
        overlaps.len(),
        lost.len()
    );
    assert!(
        overlaps.is_empty(),
        "{fleet:?}/{replication:?}/{loss:?}/{route:?}: runs overlapped: {overlaps:?}"
    );
    assert!(
        resumed.is_some(),
        "{fleet:?}/{replication:?}/{loss:?}/{route:?}: no run after the promotion"
    );
    if replication == Replication::Sync {
        assert!(
            lost.is_empty(),
            "{fleet:?}/{replication:?}/{loss:?}/{route:?}: acknowledged and never run: {lost:?}"
        );
    }
    client.close().await;
}

/// Prints the tail of every worker log in `dir` and the sessions that hold
/// keys, for a round that did not converge.
async fn print_logs(dir: &std::path::Path, client: &Store) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("--- {} (last 40 lines)", entry.path().display());
        for line in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("{line}");
        }
    }
    let list = drover::store::SessionList {
        after: None,
        limit: 1000,
        leases_per_session: 20,
    };
    eprintln!("--- sessions: {:?}", client.session_list(list).await);
}

/// One round per combination: `NAME: FLEET REPLICATION LOSS ROUTE`.
macro_rules! rounds {
    ($($name:ident: $fleet:ident $replication:ident $loss:ident $route:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            failover(
                Replication::$replication,
                Loss::$loss,
                Route::$route,
                Fleet::$fleet,
            )
            .await;
        }
    )*};
}

rounds! {
    killed_primary_sync_replication_through_a_multi_host_url_loses_nothing_and_never_overlaps: Library Sync Killed MultiHost;
    killed_primary_sync_replication_through_a_moving_proxy_loses_nothing_and_never_overlaps: Library Sync Killed Proxy;
    read_only_primary_sync_replication_through_a_multi_host_url_loses_nothing_and_never_overlaps: Library Sync ReadOnly MultiHost;
    read_only_primary_sync_replication_through_a_moving_proxy_loses_nothing_and_never_overlaps: Library Sync ReadOnly Proxy;
    killed_primary_async_replication_through_a_multi_host_url_converges_and_never_overlaps: Library Async Killed MultiHost;
    killed_primary_async_replication_through_a_moving_proxy_converges_and_never_overlaps: Library Async Killed Proxy;
    read_only_primary_async_replication_through_a_multi_host_url_converges_and_never_overlaps: Library Async ReadOnly MultiHost;
    read_only_primary_async_replication_through_a_moving_proxy_converges_and_never_overlaps: Library Async ReadOnly Proxy;
    cli_killed_primary_sync_replication_through_a_multi_host_url_loses_nothing_and_never_overlaps: Cli Sync Killed MultiHost;
    cli_killed_primary_sync_replication_through_a_moving_proxy_loses_nothing_and_never_overlaps: Cli Sync Killed Proxy;
    cli_read_only_primary_sync_replication_through_a_multi_host_url_loses_nothing_and_never_overlaps: Cli Sync ReadOnly MultiHost;
    cli_read_only_primary_sync_replication_through_a_moving_proxy_loses_nothing_and_never_overlaps: Cli Sync ReadOnly Proxy;
    cli_killed_primary_async_replication_through_a_multi_host_url_converges_and_never_overlaps: Cli Async Killed MultiHost;
    cli_killed_primary_async_replication_through_a_moving_proxy_converges_and_never_overlaps: Cli Async Killed Proxy;
    cli_read_only_primary_async_replication_through_a_multi_host_url_converges_and_never_overlaps: Cli Async ReadOnly MultiHost;
    cli_read_only_primary_async_replication_through_a_moving_proxy_converges_and_never_overlaps: Cli Async ReadOnly Proxy;
}

/// The asynchronous hand-out, forced (DESIGN.md rule 12): node a claims key
/// `k` on the primary after the standby was cut off, so the promoted standby
/// has `k` pending and knows nothing of the claim. Node a's link then
/// freezes (a node cut off while both sides live), so its work goes on until
/// its own clock says its session is gone, one TTL after its last heartbeat.
/// Node b, started on the new primary, must not run `k` before that: the new
/// primary noticed the fork and paused claims for the longest TTL. Without
/// the pause node b runs `k` at once, while node a's work still ticks.
/// Judged from the ticks the work itself wrote; prints what the pause cost
/// (from the promotion to node b's run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_lost_with_the_old_primary_is_not_handed_out_again_until_its_worker_gave_it_up() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let Some(cluster) = ha::cluster(Replication::Async) else {
        return;
    };
    cluster.wait_streaming(Replication::Async).await;
    let proxy = FaultProxy::start(([127, 0, 0, 1], cluster.primary).into()).await;
    let url = format!("postgres://postgres@{}/postgres", proxy.addr);
    let log = TickLog::new();
    let runs = Arc::new(AtomicU64::new(0));
    let a_store = Store::connect(&url).await.expect("node a");
    let (stop_a, a) = start(a_store.clone(), holding(log.clone(), runs.clone(), "a"));
    let list = drover::store::SessionList {
        after: None,
        limit: 1,
        leases_per_session: 0,
    };
    eventually_within("node a's session", Duration::from_secs(10), || async {
        a_store
            .session_list(list)
            .await
            .is_ok_and(|s| !s.items.is_empty())
    })
    .await;
    // `k` and node a's session reach the standby; then the standby is cut
    // off, before `k` is ready.
    a_store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]).after(Duration::from_secs(3)))
        .await
        .expect("enqueue");
    cluster.wait_replayed().await;
    cluster.disconnect_standby().await;
    let cut = now_nanos();
    eventually_within("node a runs k", Duration::from_secs(10), || async {
        runs_by_key(&log).contains_key("k")
    })
    .await;
    let first = runs_by_key(&log)["k"][0].0;
    assert!(
        first > cut,
        "k ran before the standby was cut off: the set-up was too slow"
    );

    proxy.freeze();
    cluster.kill_primary();
    cluster.promote();
    let promoted = now_nanos();
    let b_store = Store::connect(&cluster.url(cluster.standby))
        .await
        .expect("node b on the new primary");
    let (stop_b, b) = start(b_store.clone(), holding(log.clone(), runs.clone(), "b"));
    eventually_within("node b runs k", Duration::from_secs(30), || async {
        runs_by_key(&log)["k"].len() > 1
    })
    .await;
    for (stop, handle) in [(stop_a, a), (stop_b, b)] {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("controller stops")
            .expect("controller task");
    }
    let spans = runs_by_key(&log).remove("k").expect("k ran");
    let (a_run, b_run) = (&spans[0], &spans[1]);
    assert!(
        a_run.2.contains("-a-") && b_run.2.contains("-b-"),
        "{spans:?}"
    );
    let pause = Duration::from_nanos(u64::try_from(b_run.0 - promoted).expect("fits"));
    let gap = b_run.0.saturating_sub(a_run.1);
    eprintln!(
        "node a gave k up {:?} after the promotion; node b ran it {pause:?} after the promotion ({:?} later, {})",
        Duration::from_nanos(u64::try_from(a_run.1.saturating_sub(promoted)).unwrap_or(0)),
        Duration::from_nanos(u64::try_from(gap).unwrap_or(0)),
        b_run.2
    );
    assert!(
        b_run.0 > a_run.1,
        "k ran twice at once: node a until {}, node b from {} ({spans:?})",
        a_run.1,
        b_run.0
    );
    // Node a's store keeps its frozen connections: dropped, not closed
    // (closing waits for them).
    drop(a_store);
    b_store.close().await;
}

/// A primary that lost its synchronous standby never answers a commit (it
/// waits for a standby that is gone). A worker's completer waiting on one
/// such commit held every later outcome behind it, and its keys stayed
/// running under a live session until the round gave up. The store now
/// counts a commit unanswered for 10 s as unknown: the completion batch
/// fails with `CommitUnknown` (the run then writes it again, on a fresh
/// connection) instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_primary_never_answers_is_unknown_after_a_while_not_awaited_for_ever() {
    use drover::store::{LeaseClaim, LeaseComplete, Outcome, SessionStart};
    let Some(cluster) = ha::cluster(Replication::Sync) else {
        return;
    };
    cluster.wait_streaming(Replication::Sync).await;
    let store = Store::connect(&cluster.url(cluster.primary))
        .await
        .expect("primary");
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
    let session = store
        .session_start(SessionStart::new("w", Duration::from_secs(60)))
        .await
        .expect("session");
    let claim = LeaseClaim {
        session: session.id,
        process: PROCESS.into(),
        max: 1,
        trace_links: false,
    };
    let lease = store
        .lease_claim(claim)
        .await
        .expect("claim")
        .leases
        .remove(0);
    cluster.disconnect_standby().await;
    let outcome = Outcome::Done;
    let batch = [LeaseComplete {
        lease: &lease,
        outcome: &outcome,
        trace_id: None,
    }];
    let written = tokio::time::timeout(Duration::from_secs(60), store.lease_complete_batch(&batch))
        .await
        .expect("the completion answers instead of waiting for ever");
    let e = written.expect_err("the commit is not acknowledged");
    assert!(e.is_commit_unknown(), "{e}");
    drop(store);
}

/// A worker whose claim is in flight on the old primary when that server
/// freezes (SIGSTOP, as a frozen virtual machine: its kernel keeps the
/// sockets open, so nothing fails by itself), while the standby is promoted,
/// moves to the new primary and runs what is enqueued there. Before, only a
/// commit had a timeout: the claim loop waited on the frozen server for
/// ever, while the worker's keeper heartbeated on the new primary. A lock
/// held by the test on `drover_lineage` keeps the claim waiting inside the
/// old primary at the moment it freezes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_claim_waits_on_a_frozen_old_primary_moves_to_the_new_one() {
    use sqlx::{Connection as _, PgConnection};
    let Some(cluster) = ha::cluster(Replication::Async) else {
        return;
    };
    cluster.wait_streaming(Replication::Async).await;
    let log = TickLog::new();
    let runs = Arc::new(AtomicU64::new(0));
    let a_store = Store::connect(&cluster.multi_host_url())
        .await
        .expect("node a");
    let (stop_a, a) = start(a_store.clone(), ticking(log.clone(), runs.clone(), "a"));
    a_store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k1"]))
        .await
        .expect("enqueue");
    eventually_within("node a runs k1", Duration::from_secs(20), || async {
        runs_by_key(&log).contains_key("k1")
    })
    .await;
    let mut locker = PgConnection::connect(&cluster.url(cluster.primary))
        .await
        .expect("locker");
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE drover_lineage IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .expect("lock");
    let mut watcher = PgConnection::connect(&cluster.url(cluster.primary))
        .await
        .expect("watcher");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%drover_claim%'",
        )
        .fetch_one(&mut watcher)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no claim waits inside the primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let frozen = cluster.freeze_primary();
    cluster.promote();
    let promoted = Instant::now();
    let client = Store::connect(&cluster.url(cluster.standby))
        .await
        .expect("a client on the new primary");
    client
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k2"]))
        .await
        .expect("enqueue on the new primary");
    let ran = tokio::time::timeout(Duration::from_secs(60), async {
        while !runs_by_key(&log).contains_key("k2") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    eprintln!("node a ran k2 {:?} after the promotion", promoted.elapsed());
    stop_a.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(20), a).await;
    drop(frozen);
    drop((locker, watcher));
    client.close().await;
    assert!(
        ran.is_ok(),
        "node a never ran k2, enqueued on the new primary, within 60 s of the promotion"
    );
    assert!(stopped.is_ok(), "node a stops");
    drop(a_store);
}

/// With `target_session_attrs=primary`, an old primary left running
/// read-only (a demoted writer) is still a primary, but refuses every write:
/// the store reconnected after each refusal and chose it again for ever,
/// while the promoted standby took writes. A primary that writes is now
/// preferred; a read-only one is taken only when no host writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_primary_leaves_an_old_primary_made_read_only_for_one_that_writes() {
    let Some(cluster) = ha::cluster(Replication::Async) else {
        return;
    };
    cluster.wait_streaming(Replication::Async).await;
    let url = format!("{}?target_session_attrs=primary", cluster.multi_host_url());
    let store = Store::connect(&url).await.expect("connect");
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["a"]))
        .await
        .expect("enqueue before");
    cluster.make_primary_read_only().await;
    cluster.promote();
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < Duration::from_secs(30) {
        match store.item_enqueue(ItemEnqueue::new(PROCESS, ["b"])).await {
            Ok(_) => {
                eprintln!(
                    "writes reached the new primary {:?} after the promotion",
                    started.elapsed()
                );
                store.close().await;
                return;
            }
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("30 s after the promotion every write is still refused: {last:?}");
}
