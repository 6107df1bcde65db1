//! Partition rounds shared by `tests/partition.rs` and
//! `tests/partition_server.rs`: how a link breaks, the `drover work` processes
//! on either side of it, the rounds to run (CI's short plan, or a measurement's
//! from the environment) and the tally of what the tick logs showed.
//!
//! A measurement runs the ignored tests with
//! `DROVER_PARTITION_ROUNDS` (default 20), `DROVER_PARTITION_TTL` (default 2s)
//! and `DROVER_PARTITION_CUTS` (`freeze`, `reset` or `freeze,reset`; default
//! `freeze`); see `scripts/partition-measure.sh`.

use std::time::Duration;

use drover::store::{ItemEnqueue, Store, StoreEngine as _};
use tokio::process::Child;
use tokio::task::JoinHandle;

use nix::sys::signal::kill;
use nix::unistd::Pid;

use super::TestDb;
use super::fault_proxy::FaultProxy;
use super::process::eventually;
use super::ticks::TickLog;

/// The process every round works on (one key, `k`).
pub(crate) const PROCESS: &str = "partitioned";

/// How the link breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// No byte goes through, sockets stay open.
    Freeze,
    /// Every connection is reset, and new ones too.
    Reset,
}

impl Cut {
    /// Breaks `proxy`'s link this way.
    pub(crate) fn apply(self, proxy: &FaultProxy) {
        match self {
            Self::Freeze => proxy.freeze(),
            Self::Reset => proxy.reset(),
        }
    }
}

/// One (TTL, cut) pair and how many rounds to run it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounds {
    pub(crate) ttl: Duration,
    pub(crate) cut: Cut,
    pub(crate) count: usize,
}

/// Every pair of `plan`'s (TTL, rounds) with both cuts.
pub(crate) fn both_cuts(plan: &[(Duration, usize)]) -> Vec<Rounds> {
    plan.iter()
        .flat_map(|&(ttl, count)| [Cut::Freeze, Cut::Reset].map(|cut| Rounds { ttl, cut, count }))
        .collect()
}

/// How late answers come in [`answers_come_late`]: more than the margin at a
/// 2 s TTL (250 ms), less than a heartbeat's timeout (TTL/3).
pub(crate) const LATE: Duration = Duration::from_millis(550);

/// A fault for a worker on a 2 s TTL behind `proxy`: its answers come
/// [`LATE`]; once a heartbeat sent since then has renewed the session, its
/// requests stop getting through (answers still come). A worker counting its
/// session from a heartbeat's answer instead of its send would give up `LATE`
/// after the database. (Through `drover serve` a heartbeat is one request;
/// on PostgreSQL it is a transaction of several statements, which the delay
/// makes time out.)
pub(crate) async fn answers_come_late(proxy: &FaultProxy, db: &TestDb) {
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    let last = || async {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT max(heartbeat_at)::text FROM drover_sessions",
        )
        .fetch_one(&pool)
        .await
        .expect("read the heartbeat")
    };
    proxy.delay_answers(LATE);
    let before = last().await;
    // Only the database shows when the worker's heartbeat arrived.
    eventually("a heartbeat since the answers slowed down", || async {
        last().await != before
    })
    .await;
    proxy.freeze_requests();
    pool.close().await;
}

/// A measurement's rounds, from the environment (see the module doc).
pub(crate) fn measured() -> Vec<Rounds> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let count = var("DROVER_PARTITION_ROUNDS").map_or(20, |v| {
        v.parse()
            .unwrap_or_else(|e| panic!("DROVER_PARTITION_ROUNDS={v}: {e}"))
    });
    let ttl = var("DROVER_PARTITION_TTL").map_or(Duration::from_secs(2), |v| {
        humantime::parse_duration(&v).unwrap_or_else(|e| panic!("DROVER_PARTITION_TTL={v}: {e}"))
    });
    let cuts = var("DROVER_PARTITION_CUTS").unwrap_or_else(|| "freeze".into());
    cuts.split(',')
        .map(|cut| match cut.trim() {
            "freeze" => Cut::Freeze,
            "reset" => Cut::Reset,
            other => panic!("DROVER_PARTITION_CUTS: unknown cut {other:?}"),
        })
        .map(|cut| Rounds { ttl, cut, count })
        .collect()
}

/// `drover work PROCESS --exec exec --ttl ttl` working on `target`
/// (`["--db", URL]` or `["--server", URL]`), with more `flags`
/// (`--parallelism 4`).
pub(crate) fn worker(target: [&str; 2], exec: &str, ttl: Duration, flags: &[&str]) -> Child {
    let ttl = format!("{}ms", ttl.as_millis());
    let args = [
        PROCESS,
        "--exec",
        exec,
        "--ttl",
        &ttl,
        "--shutdown-deadline",
        "1s",
    ];
    super::cli::work(args.into_iter().chain(target).chain(flags.iter().copied()))
}

/// After A (whose command logged `a_pid`) was cut off: starts B on the
/// database directly, with a node reclaiming eagerly, waits until B's command
/// ticks and A's is gone, and returns B and the gap in milliseconds between
/// A's last tick and B's first (negative: they overlapped).
pub(crate) async fn take_over(
    db: &TestDb,
    log: &TickLog,
    a_pid: i32,
    ttl: Duration,
    round: &str,
) -> (Child, f64) {
    let reclaim = EagerReclaim::start(db.store.clone());
    let b = worker(["--db", &db.url], &log.command("B"), ttl, &[]);
    // Other processes' progress shows only in the log and the process table.
    eventually("B's command ticking", || async {
        !log.ticks("B").is_empty()
    })
    .await;
    eventually("A's command gone", || async {
        kill(Pid::from_raw(a_pid), None).is_err()
    })
    .await;
    drop(reclaim);
    (b, log.gap_ms("A", "B", round))
}

/// Another database node reclaiming expired sessions every 5 ms, the worst
/// schedule for a cut-off worker: its key is requeued the moment the
/// database's deadline passes, and re-enqueued at once, whose notification
/// wakes a waiting worker (a reclaim alone wakes only its own node). Stops
/// when dropped.
#[derive(Debug)]
pub(crate) struct EagerReclaim(JoinHandle<()>);

impl EagerReclaim {
    /// Starts reclaiming on `store`.
    pub(crate) fn start(store: Store) -> Self {
        Self(tokio::spawn(async move {
            loop {
                if let Ok(report) = store.session_reclaim().await
                    && report.leases > 0
                {
                    store
                        .item_enqueue(ItemEnqueue::new(PROCESS, ["k"]))
                        .await
                        .ok();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }))
    }
}

impl Drop for EagerReclaim {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The gaps between the cut-off run's last tick and the other run's first,
/// per (TTL, cut), printed as a table.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    rows: Vec<(Duration, Cut, f64)>,
}

impl Tally {
    /// Records one round's gap (negative: the runs overlapped by that much).
    pub(crate) fn record(&mut self, rounds: Rounds, round: &str, gap_ms: f64) {
        eprintln!("{round}: gap {gap_ms:.1} ms");
        self.rows.push((rounds.ttl, rounds.cut, gap_ms));
    }

    /// Prints one line per (TTL, cut): rounds, overlaps, smallest and largest
    /// gap; then fails if any round overlapped.
    pub(crate) fn finish(&self, case: &str) {
        let mut keys: Vec<(Duration, Cut)> = self.rows.iter().map(|r| (r.0, r.1)).collect();
        keys.dedup();
        let mut overlaps = 0;
        for (ttl, cut) in keys {
            let gaps: Vec<f64> = self
                .rows
                .iter()
                .filter(|r| (r.0, r.1) == (ttl, cut))
                .map(|r| r.2)
                .collect();
            let over = gaps.iter().filter(|g| **g <= 0.0).count();
            overlaps += over;
            let min = gaps.iter().copied().fold(f64::INFINITY, f64::min);
            let max = gaps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            println!(
                "PARTITION {case} | ttl {ttl:?} | {cut:?} | rounds {} | overlaps {over} | gap min {min:.1} ms | gap max {max:.1} ms",
                gaps.len()
            );
        }
        assert_eq!(overlaps, 0, "{case}: rounds with an overlap (see above)");
    }
}
