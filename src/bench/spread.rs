//! `burn-down --nodes N --processes M` (issue 39): the same burn-down spread
//! over M process names and N operating-system processes against one
//! database, as a fleet outgrowing one machine runs it. The N node processes
//! (the `drover` binary itself, `bench burn-down-node`) each run one
//! controller per process name with W / (N × M) runs at once (at least one);
//! with N = 1 they run in this process. Keys are split evenly over the names.
//!
//! A node says `ready` on its standard output once connected and its
//! controllers built, starts them at `go` on its standard input, reports how
//! many runs it has made (a line `ran N`, whenever the count moved, at most
//! every [`REPORT_EVERY`]), and stops them gracefully (every outcome written)
//! when its standard input closes. The clock runs, as with one node, from `go`
//! until the runs reported add up to the keys and every node has stopped;
//! the database is then read once to check that none of the keys is left
//! pending or running. (Reading the counts from the database while the nodes
//! drain, as this did first, cost the database a counts query every 10 ms
//! that one node's in-process drain never paid: 0.5 s of 4 s.)

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Figure;
use super::store::{
    BenchError, StoreBench, Tally, cleanup, counting_controller, drain_names, fill, fresh_process,
    per_s, tick_progress,
};
use super::wal::WalMark;
use crate::store::{Store, StoreEngine as _};

/// How long a spread burn-down may take before it counts as failed.
const LIMIT: Duration = Duration::from_secs(600);

/// How many connections a node opens before it says `ready` ([`warm_up`]).
const WARM_CONNECTIONS: u32 = 4;

/// How often a node at most reports its count of runs.
const REPORT_EVERY: Duration = Duration::from_millis(5);

/// How a burn-down is spread.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    /// Operating-system processes, each with its own connections.
    pub nodes: usize,
    /// Process names the keys are spread over.
    pub processes: usize,
}

/// Fills `b.keys` keys split evenly over `spread.processes` fresh names, then
/// drains them with `spread.nodes` node processes (`drover` is the binary);
/// keys per second, with WAL per key on PostgreSQL.
pub async fn burn_down_spread(
    b: &StoreBench,
    spread: Spread,
    drover: &Path,
) -> Result<Figure, BenchError> {
    let base = fresh_process("burn_down");
    let names: Vec<String> = (0..spread.processes.max(1))
        .map(|i| format!("{base}_{i}"))
        .collect();
    let per_name = b.keys.div_ceil(names.len() as u64);
    for (i, name) in names.iter().enumerate() {
        let first = i as u64 * per_name;
        let n = per_name.min(b.keys.saturating_sub(first));
        fill(b, name, n).await?;
    }
    let workers = (b.workers / (spread.nodes.max(1) * names.len())).max(1);
    let wal = WalMark::now(&b.store).await?;
    let drained = if spread.nodes <= 1 {
        drain_names(b, &names, workers, b.keys).await
    } else {
        drain_on_nodes(b, &names, workers, spread.nodes, drover).await
    };
    let figure = b
        .figure("burn_down", b.keys)
        .with("nodes", spread.nodes.max(1))
        .with("processes", names.len())
        .with("runs_per_controller", workers);
    let figure = wal.per_key(&b.store, b.keys, figure).await;
    for name in &names {
        cleanup(&b.store, name).await?;
    }
    Ok(figure?.with("keys_per_s", per_s(b.keys, drained?)))
}

/// `nodes` node processes, started together, until the database holds none
/// of the keys pending or running.
async fn drain_on_nodes(
    b: &StoreBench,
    names: &[String],
    workers: usize,
    nodes: usize,
    drover: &Path,
) -> Result<Duration, BenchError> {
    b.phase("starting nodes", nodes as u64);
    let mut children = Vec::with_capacity(nodes);
    let mut readers = Vec::with_capacity(nodes);
    for _ in 0..nodes {
        let mut child = Command::new(drover)
            .args(["bench", "burn-down-node", "--db", &b.url])
            .args(["--workers", &workers.to_string()])
            .env("DROVER_BENCH_PROCESSES", names.join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        match lines.next_line().await? {
            Some(line) if line == "ready" => {}
            other => {
                return Err(BenchError::Node(format!(
                    "a node did not start: it said {other:?}"
                )));
            }
        }
        children.push(child);
        readers.push(lines);
        b.progress.inc(1);
    }
    b.phase("draining", b.keys);
    let ran = Arc::new(Tally::default());
    let mut reports = JoinSet::new();
    let start = Instant::now();
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("piped");
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }
    for lines in readers {
        reports.spawn(add_reports(lines, Arc::clone(&ran), b.keys));
    }
    let ticker = tick_progress(b.progress.clone(), Arc::clone(&ran));
    let reached = if b.keys == 0 {
        Ok(())
    } else {
        tokio::time::timeout(LIMIT, ran.reached.notified()).await
    };
    stop_nodes(children).await?;
    let elapsed = start.elapsed();
    reports.abort_all();
    ticker.abort();
    while let Some(report) = reports.join_next().await {
        if let Ok(Err(e)) = report {
            return Err(e);
        }
    }
    reached
        .map_err(|_| BenchError::Timeout(format!("{} keys not drained in {LIMIT:?}", b.keys)))?;
    left_undrained(&b.store, names, b.keys).await?;
    Ok(elapsed)
}

/// Adds a node's `ran N` reports (its running total) into `ran`, which fires
/// once the nodes' totals add up to `keys`.
async fn add_reports(
    mut lines: Lines<BufReader<ChildStdout>>,
    ran: Arc<Tally>,
    keys: u64,
) -> Result<(), BenchError> {
    let mut last = 0;
    while let Some(line) = lines.next_line().await? {
        let Some(total) = line
            .strip_prefix("ran ")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return Err(BenchError::Node(format!("a node said {line:?}")));
        };
        for _ in last..total {
            ran.count(keys);
        }
        last = last.max(total);
    }
    Ok(())
}

/// After the nodes stopped: an error if any of `names`' keys is still pending
/// or running (a run reported twice would have stopped the clock early).
async fn left_undrained(store: &Store, names: &[String], keys: u64) -> Result<(), BenchError> {
    let left: u64 = store
        .process_counts_all()
        .await?
        .into_iter()
        .filter(|c| names.contains(&c.process))
        .map(|c| c.pending + c.backoff + c.running)
        .sum();
    if left == 0 {
        return Ok(());
    }
    Err(BenchError::Node(format!(
        "{left} keys of {keys} left pending or running after the nodes stopped"
    )))
}

/// Closes every node's standard input (a graceful stop) at once, as one
/// node's drain cancels all its controllers together, then waits for them;
/// a node that fails is an error.
async fn stop_nodes(mut children: Vec<Child>) -> Result<(), BenchError> {
    for child in &mut children {
        drop(child.stdin.take());
    }
    let mut failed = None;
    for child in &mut children {
        let status = child.wait().await?;
        if !status.success() {
            failed = Some(status);
        }
    }
    match failed {
        Some(status) => Err(BenchError::Node(format!("a node failed: {status}"))),
        None => Ok(()),
    }
}

/// What a node process runs (`drover bench burn-down-node`): one counting
/// controller per name in `names` with `workers` runs each, started at `go`
/// on standard input and stopped gracefully when standard input closes.
pub async fn burn_down_node(
    store: Store,
    names: &[String],
    workers: usize,
) -> Result<(), BenchError> {
    let tally = Arc::new(Tally::default());
    let mut controllers = Vec::with_capacity(names.len());
    for name in names {
        controllers.push(counting_controller(
            store.clone(),
            name,
            workers,
            &tally,
            u64::MAX,
            None,
        )?);
    }
    warm_up(&store).await?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    stdout.write_all(b"ready\n").await?;
    stdout.flush().await?;
    if lines.next_line().await?.as_deref() != Some("go") {
        return Ok(());
    }
    let stop = CancellationToken::new();
    let mut running = JoinSet::new();
    for controller in controllers {
        running.spawn(controller.run(stop.clone()));
    }
    report_until_closed(&mut lines, &mut stdout, &tally).await?;
    stop.cancel();
    while let Some(ended) = running.join_next().await {
        ended.map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// Opens [`WARM_CONNECTIONS`] of the node's pool before it says `ready`, as
/// a long-running node's would be and as the one-node drain's (whose pool
/// filled the keys) is: otherwise the nodes' first claims wait for new
/// connections (a backend forked, its lineage checked) inside the clock.
/// Not the whole pool: eight nodes of 16 connections each would pass
/// PostgreSQL's default limit of 100 clients, where a node that drains uses
/// about four at once (its claims, its completions, heartbeats, wake-ups).
async fn warm_up(store: &Store) -> Result<(), BenchError> {
    let size = store.pool_stats().max.min(WARM_CONNECTIONS);
    let mut reads = JoinSet::new();
    for _ in 0..size {
        let store = store.clone();
        reads.spawn(async move { store.clock_now().await });
    }
    while let Some(read) = reads.join_next().await {
        read.map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// Writes `ran N` (the node's runs so far) whenever the count moved, at most
/// every [`REPORT_EVERY`], until standard input closes.
async fn report_until_closed(
    lines: &mut Lines<BufReader<tokio::io::Stdin>>,
    stdout: &mut tokio::io::Stdout,
    tally: &Tally,
) -> Result<(), BenchError> {
    let mut reported = 0;
    loop {
        tokio::select! {
            line = lines.next_line() => if line?.is_none() { return Ok(()) },
            () = tokio::time::sleep(REPORT_EVERY) => {
                let ran = tally.done.load(Ordering::Relaxed);
                if ran != reported {
                    stdout.write_all(format!("ran {ran}\n").as_bytes()).await?;
                    stdout.flush().await?;
                    reported = ran;
                }
            }
        }
    }
}
