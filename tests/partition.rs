//! A worker cut off from PostgreSQL while it stays alive gives its run up
//! before the database can give the key to another worker (DESIGN.md rule 6).
//!
//! Each round: worker A, whose store connects through a [`FaultProxy`], runs a
//! key whose work ticks into a log every 20 ms; the link is frozen (or reset);
//! worker B, connected directly, reclaims the key once A's session expires and
//! starts it. The round fails if any tick of A's run is later than B's first.
//! Rounds run on the library `Controller` and on `drover work --exec`
//! processes, with 1 s and 2 s TTLs. PostgreSQL only (skipped without
//! `DROVER_TEST_POSTGRES_URL`).

mod support;

use std::process::Stdio;
use std::time::Duration;

use drover::runner::{Action, BoxError, Controller, Reconciler, Task};
use drover::store::{ItemEnqueue, Store, StoreEngine as _};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use support::fault_proxy::FaultProxy;
use support::process::{eventually, stop};
use support::ticks::TickLog;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PROCESS: &str = "partitioned";

/// How the link between worker A and the database breaks.
#[derive(Debug, Clone, Copy)]
enum Cut {
    Freeze,
    Reset,
}

/// Every (TTL, cut) pair, this many rounds each.
const PLAN: [(Duration, usize); 2] = [(Duration::from_secs(1), 3), (Duration::from_secs(2), 2)];

async fn enqueue(store: &Store) {
    store
        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
        .await
        .expect("enqueue");
}

/// Waits for `what` from a run (a bounded wait: a hung round fails).
async fn expect(rx: &mut mpsc::UnboundedReceiver<String>, what: &str, limit: Duration) {
    let got = tokio::time::timeout(limit, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what:?} within {limit:?}"))
        .expect("a sender is alive");
    assert_eq!(got, what);
}

/// Calls `f` when dropped: tells when a run's future is gone.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A reconciler whose work ticks as `tag` every 20 ms until its run is
/// cancelled; it reports `TAG started` after its first tick and `TAG stopped`
/// when its future is gone.
fn ticking(
    log: TickLog,
    tag: &'static str,
    events: mpsc::UnboundedSender<String>,
) -> impl Reconciler {
    move |task: Task| {
        let (log, events) = (log.clone(), events.clone());
        async move {
            let stopped = events.clone();
            let _stopped = OnDrop(move || {
                stopped.send(format!("{tag} stopped")).ok();
            });
            log.tick(tag);
            events.send(format!("{tag} started")).ok();
            loop {
                tokio::select! {
                    () = task.cancelled() => return Err::<Action, BoxError>("cancelled".into()),
                    () = tokio::time::sleep(Duration::from_millis(20)) => log.tick(tag),
                }
            }
        }
    }
}

fn start_controller(
    store: Store,
    ttl: Duration,
    reconciler: impl Reconciler,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let controller = Controller::builder(store, PROCESS, reconciler)
        .poll_rate(Duration::from_millis(1), 1000)
        .idle_poll(Duration::from_millis(50))
        .ttl(ttl)
        .shutdown_deadline(Duration::from_secs(1))
        .build()
        .expect("valid settings");
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move { controller.run(stop).await.expect("controller runs") }
    });
    (stop, handle)
}

async fn stop_controller((stop, handle): (CancellationToken, tokio::task::JoinHandle<()>)) {
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .expect("shutdown within 20 s")
        .expect("controller task");
}

fn cut(proxy: &FaultProxy, how: Cut) {
    match how {
        Cut::Freeze => proxy.freeze(),
        Cut::Reset => proxy.reset(),
    }
}

async fn controller_round(base: &str, ttl: Duration, how: Cut, round: &str) {
    let (db, schema) = support::postgres(base).await;
    let (proxy, store_a) = FaultProxy::in_front_of(base, &db.url).await;
    let log = TickLog::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = start_controller(store_a.clone(), ttl, ticking(log.clone(), "A", tx.clone()));
    enqueue(&db.store).await;
    expect(&mut rx, "A started", Duration::from_secs(20)).await;
    cut(&proxy, how);
    let b = start_controller(db.store.clone(), ttl, ticking(log.clone(), "B", tx));
    let limit = ttl * 5;
    let mut seen = vec![];
    for _ in 0..2 {
        let got = tokio::time::timeout(limit, rx.recv()).await;
        seen.push(got.unwrap_or_else(|_| panic!("{round}: only {seen:?} within {limit:?}")));
    }
    let mut seen: Vec<String> = seen.into_iter().map(|s| s.expect("sender alive")).collect();
    seen.sort();
    assert_eq!(seen, ["A stopped", "B started"], "{round}");
    log.assert_no_overlap("A", "B", round);
    proxy.heal();
    stop_controller(b).await;
    stop_controller(a).await;
    store_a.close().await;
    db.store.close().await;
    support::drop_schema(base, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_cut_off_from_the_database_stops_its_run_before_another_starts_the_key() {
    let Some(base) = support::postgres_url() else {
        return;
    };
    for (ttl, rounds) in PLAN {
        for how in [Cut::Freeze, Cut::Reset] {
            for n in 0..rounds {
                let round = format!("controller, {how:?}, ttl {ttl:?}, round {n}");
                controller_round(&base, ttl, how, &round).await;
            }
        }
    }
}

/// Starts `drover work` on `url` running `exec`.
fn worker(url: &str, exec: &str, ttl: Duration) -> Child {
    let ttl = format!("{}ms", ttl.as_millis());
    Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["work", PROCESS, "--db", url, "--exec", exec, "--ttl", &ttl])
        .args(["--shutdown-deadline", "1s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn drover work")
}

async fn exec_round(base: &str, ttl: Duration, how: Cut, round: &str) {
    let (db, schema) = support::postgres(base).await;
    let proxy = FaultProxy::start(support::server_addr(base).await).await;
    let log = TickLog::new();
    let a = worker(&proxy.url_for(&db.url), &log.command("A"), ttl);
    enqueue(&db.store).await;
    eventually("A's command ticking", || async {
        !log.ticks("A").is_empty()
    })
    .await;
    let a_pid = log.pid("A").expect("A's command logged its pid");
    cut(&proxy, how);
    let b = worker(&db.url, &log.command("B"), ttl);
    // Other processes' progress shows only in the log and the process table.
    eventually("B's command ticking", || async {
        !log.ticks("B").is_empty()
    })
    .await;
    eventually("A's command gone", || async {
        kill(Pid::from_raw(a_pid), None).is_err()
    })
    .await;
    log.assert_no_overlap("A", "B", round);
    proxy.heal();
    stop(b).await;
    stop(a).await;
    db.store.close().await;
    support::drop_schema(base, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drover_work_process_cut_off_from_the_database_kills_its_command_before_another_starts_the_key()
 {
    let Some(base) = support::postgres_url() else {
        return;
    };
    for (ttl, rounds) in PLAN {
        for how in [Cut::Freeze, Cut::Reset] {
            for n in 0..rounds {
                let round = format!("drover work, {how:?}, ttl {ttl:?}, round {n}");
                exec_round(&base, ttl, how, &round).await;
            }
        }
    }
}
