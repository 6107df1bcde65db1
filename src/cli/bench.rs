//! `drover bench SCENARIO`: throughput, latency and recovery figures, one
//! machine-readable line (or JSON object) each on stdout; progress on stderr.

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args as ClapArgs, ValueEnum};
use drover::bench::{self, Figure, StoreBench};
use drover::client::Client;
use drover::store::{LimitChanges, Store, StoreOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::db::parse_duration;
use super::say::outln;
use super::server_args::ServerArgs;

/// Arguments of `drover bench`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// What to measure.
    scenario: Scenario,
    /// The database to measure (each scenario uses fresh process names and
    /// cleans up after itself, so any drover database will do).
    // `hide_env_values`: `--help` would print the URL, password and all.
    #[arg(
        long = "db",
        env = "DROVER_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://drover-bench.db"
    )]
    db: String,
    /// Keys per run. Defaults: enqueue and burn-down 100000, latency 1000,
    /// backlog 1000000 (the large backlog), recovery 100, queue 200000,
    /// dashboard 1000000, hostile 5000.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    keys: Option<u64>,
    /// Worker counts to measure, comma-separated (one figure each). Defaults:
    /// enqueue 1 (producers), burn-down and backlog 1024 (a no-op run is cheap,
    /// and the runs at once bound the batch a claim takes), latency and
    /// recovery 4, queue 1,4,16, hostile 2000 (its command's parallelism).
    #[arg(long, value_delimiter = ',')]
    workers: Vec<usize>,
    /// latency: keys enqueued per second.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// recovery: the session TTL of the killed worker and of the survivor.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    ttl: Duration,
    /// SQLite: sync the WAL at every commit (`full`, drover's default: an
    /// acknowledged write survives a power loss) or only at checkpoints
    /// (`normal`: faster, but the last commits may be lost on a power loss).
    /// Printed as `synchronous=` on SQLite figures; ignored on PostgreSQL.
    #[arg(long, value_enum, default_value_t = Synchronous::Full)]
    synchronous: Synchronous,
    /// backlog: this many idle (known, converged) keys beside the large
    /// backlog, to show that claims do not slow down for them.
    #[arg(long, default_value_t = 0)]
    idle: u64,
    /// enqueue: measure enqueues inside the caller's transactions (through the
    /// SQL function, or the view on SQLite) in batches of 1 and 1,000 next to
    /// the normal enqueue, then a table's update rate unwatched and watched.
    /// Default keys: 20000 per figure (a tenth of that for single keys and
    /// for the updates).
    #[arg(long)]
    transactional: bool,
    /// Print one JSON object per figure instead of `BENCH …` lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: ServerArgs,
    /// burn-down: after the unlimited figure, drain the same number of keys
    /// again under a cluster-wide concurrency limit of N (prefetched leases
    /// count as running, so N above 2 × workers does not bind), and print the
    /// ratio of the two.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    concurrency_limit: Option<u32>,
    /// burn-down: drain with N operating-system processes (each this binary,
    /// with its own connections) against the one database, W / N runs each.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    nodes: Option<u16>,
    /// burn-down: split the keys evenly over M process names, one
    /// controller per name (per node) with W / (N × M) runs each.
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u16).range(1..))]
    processes: Option<u16>,
    /// burn-down: as --concurrency-limit, under a rate limit of this many
    /// runs per second (burst: one second's worth); with both, both at once.
    #[arg(long, value_name = "PER_S")]
    rate_limit: Option<f64>,
}

impl Args {
    /// How a burn-down is spread over nodes and process names, if asked.
    fn spread(&self) -> anyhow::Result<Option<bench::Spread>> {
        if self.nodes.is_none() && self.processes.is_none() {
            return Ok(None);
        }
        anyhow::ensure!(
            self.scenario == Scenario::BurnDown,
            "--nodes and --processes apply to burn-down"
        );
        anyhow::ensure!(
            self.remote.server.is_none()
                && self.concurrency_limit.is_none()
                && self.rate_limit.is_none(),
            "--nodes and --processes drain on the database, without --server or fleet limits"
        );
        Ok(Some(bench::Spread {
            nodes: self.nodes.map_or(1, usize::from),
            processes: self.processes.map_or(1, usize::from),
        }))
    }

    /// The fleet limits of the limited burn-down, if any was asked for.
    fn limits(&self) -> anyhow::Result<Option<LimitChanges>> {
        if self.concurrency_limit.is_none() && self.rate_limit.is_none() {
            return Ok(None);
        }
        anyhow::ensure!(
            self.scenario == Scenario::BurnDown,
            "--concurrency-limit and --rate-limit apply to burn-down"
        );
        let limits = LimitChanges {
            concurrency: self.concurrency_limit.map(Some),
            rate: self.rate_limit.map(Some),
            // Truncation intended: a burst of one second's worth of runs.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            burst: self
                .rate_limit
                .map(|r| r.clamp(1.0, f64::from(u32::MAX)) as u32),
        };
        Ok(Some(limits))
    }
}

/// SQLite's `synchronous` setting for `drover bench` ([`StoreOptions::durable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Synchronous {
    /// Durable: the WAL is synced at every commit.
    Full,
    /// Faster: the WAL is synced at checkpoints only.
    Normal,
}

impl Synchronous {
    fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Normal => "normal",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Keys enqueued per second, in batches.
    Enqueue,
    /// N keys enqueued first, then drained by W in-process workers.
    BurnDown,
    /// Enqueue → reconcile-start latency of single keys at a steady rate.
    Latency,
    /// Draining the front of a large backlog against a small one.
    Backlog,
    /// A killed worker's leases running elsewhere, next to the TTL.
    Recovery,
    /// The in-memory queue's add/get/done cycles next to a tokio mpsc channel.
    Queue,
    /// Response times of every dashboard page, `/v1/processes` and `/metrics`
    /// on a process of N items (default 1,000,000) and 5 N runs.
    Dashboard,
    /// Callers pushing on a server's limits: `/metrics` after 2 N enqueues to
    /// new process names, idle long-polls (N / 5) against claims and
    /// transactions per second, and `drover work --exec true` at
    /// parallelism W over N keys (defaults: N 5000, W 2000).
    Hostile,
    /// One node of `burn-down --nodes`: its controllers on the process names
    /// in DROVER_BENCH_PROCESSES, started at `go` on stdin, stopped at EOF.
    #[value(hide = true)]
    BurnDownNode,
}

impl Scenario {
    fn default_keys(self) -> u64 {
        match self {
            Self::Enqueue | Self::BurnDown => 100_000,
            Self::Latency => 1_000,
            Self::Backlog => 1_000_000,
            Self::Recovery => 100,
            Self::Queue => 200_000,
            Self::Dashboard => 1_000_000,
            Self::Hostile => 5_000,
            Self::BurnDownNode => 0,
        }
    }

    fn default_workers(self) -> Vec<usize> {
        match self {
            Self::Enqueue => vec![1],
            Self::BurnDown | Self::Backlog => vec![1024],
            Self::Latency | Self::Recovery => vec![4],
            Self::Dashboard => vec![1],
            Self::Hostile => vec![2000],
            Self::BurnDownNode => vec![1],
            Self::Queue => vec![1, 4, 16],
        }
    }
}

/// Runs one benchmark scenario and prints a line (or JSON object) per figure.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let keys = args.keys.unwrap_or(args.scenario.default_keys());
    let workers = if args.workers.is_empty() {
        args.scenario.default_workers()
    } else {
        args.workers.clone()
    };
    anyhow::ensure!(
        workers.iter().all(|&w| w > 0),
        "--workers takes counts of at least 1"
    );
    let store = if args.scenario == Scenario::Queue {
        None
    } else {
        let options = StoreOptions::default()
            .max_connections(16)
            .durable(args.synchronous == Synchronous::Full);
        let store = Store::connect_with(&args.db, &options)
            .await
            .context("cannot open the store")?;
        Some(store)
    };
    if args.scenario == Scenario::BurnDownNode {
        let store = store.context("a node needs a store")?;
        let names = std::env::var("DROVER_BENCH_PROCESSES")
            .context("a burn-down node needs DROVER_BENCH_PROCESSES")?;
        let names: Vec<String> = names.split(',').map(str::to_owned).collect();
        bench::burn_down_node(store, &names, workers[0]).await?;
        return Ok(());
    }
    let server = match &args.remote.server {
        None => None,
        Some(url) => {
            anyhow::ensure!(
                matches!(args.scenario, Scenario::BurnDown | Scenario::Backlog),
                "--server applies to burn-down and backlog"
            );
            Some(args.remote.client(url)?)
        }
    };
    if args.transactional {
        anyhow::ensure!(
            args.scenario == Scenario::Enqueue,
            "--transactional applies to enqueue"
        );
        let store = store.context("enqueue has a store")?;
        let b = store_bench(&args, &store, None, args.keys.unwrap_or(20_000), 1);
        for figure in bench::enqueue_transactional(&b).await? {
            print(&args, &figure)?;
        }
        return Ok(());
    }
    if matches!(args.scenario, Scenario::Dashboard | Scenario::Hostile) {
        let store = store.as_ref().context("this scenario needs a store")?;
        let b = store_bench(&args, store, None, keys, workers[0]);
        let figures = if args.scenario == Scenario::Dashboard {
            bench::dashboard(&b).await
        } else {
            let drover = std::env::current_exe().context("cannot find the drover binary")?;
            bench::hostile(&b, &drover).await
        };
        b.progress.finish_and_clear();
        for figure in figures? {
            print(&args, &tagged(&args, store, figure))?;
        }
        return Ok(());
    }
    let limits = args.limits()?;
    if let Some(spread) = args.spread()? {
        let store = store.as_ref().context("burn-down has a store")?;
        let drover = std::env::current_exe().context("cannot find the drover binary")?;
        for workers in workers {
            let b = store_bench(&args, store, None, keys, workers);
            let figure = bench::burn_down_spread(&b, spread, &drover).await;
            b.progress.finish_and_clear();
            print(&args, &tagged(&args, store, figure?))?;
        }
        return Ok(());
    }
    for workers in workers {
        let figure = match &store {
            None => bench::queue_cycle(workers, keys, 5).await.figure(),
            Some(store) => store_figure(&args, store, None, keys, workers).await?,
        };
        print(&args, &figure)?;
        if let (Some(store), Some(limits)) = (&store, limits) {
            let limited = limited_figure(&args, store, keys, workers, limits).await?;
            let ratio = keys_per_s(&limited) / keys_per_s(&figure).max(1.0);
            print(&args, &limited.with("ratio", format!("{ratio:.2}")))?;
        }
        if let (Some(store), Some(client)) = (&store, &server) {
            let figure = store_figure(&args, store, Some(client), keys, workers).await?;
            print(&args, &figure)?;
        }
    }
    Ok(())
}

/// What a store scenario runs against.
fn store_bench(
    args: &Args,
    store: &Store,
    server: Option<&Client>,
    keys: u64,
    workers: usize,
) -> StoreBench {
    StoreBench {
        store: store.clone(),
        url: args.db.clone(),
        keys,
        workers,
        progress: progress_bar(),
        server: server.cloned(),
        idle: args.idle,
    }
}

fn print(args: &Args, figure: &Figure) -> anyhow::Result<()> {
    if args.json {
        outln!("{}", figure.to_json())
    } else {
        outln!("{figure}")
    }
}

async fn store_figure(
    args: &Args,
    store: &Store,
    server: Option<&Client>,
    keys: u64,
    workers: usize,
) -> anyhow::Result<Figure> {
    let b = store_bench(args, store, server, keys, workers);
    let figure = match args.scenario {
        Scenario::Enqueue => bench::enqueue(&b).await,
        Scenario::BurnDown => bench::burn_down(&b).await,
        Scenario::Latency => bench::latency(&b, args.rate).await,
        Scenario::Backlog => bench::backlog(&b).await,
        Scenario::Recovery => {
            let drover = std::env::current_exe().context("cannot find the drover binary")?;
            bench::recovery(&b, &drover, args.ttl).await
        }
        Scenario::Queue | Scenario::Dashboard | Scenario::Hostile | Scenario::BurnDownNode => {
            unreachable!("the queue, dashboard and hostile scenarios are run on their own")
        }
    };
    b.progress.finish_and_clear();
    Ok(tagged(args, store, figure?))
}

/// A figure with SQLite's `synchronous` setting, where it applies.
fn tagged(args: &Args, store: &Store, figure: Figure) -> Figure {
    if store.engine_name() == "sqlite" {
        figure.with("synchronous", args.synchronous.name())
    } else if store.transaction_pooled() {
        figure.with("pool_mode", "transaction")
    } else {
        figure
    }
}

/// The burn-down under fleet limits that should not bind.
async fn limited_figure(
    args: &Args,
    store: &Store,
    keys: u64,
    workers: usize,
    limits: LimitChanges,
) -> anyhow::Result<Figure> {
    let b = store_bench(args, store, None, keys, workers);
    let figure = bench::burn_down_limited(&b, limits).await;
    b.progress.finish_and_clear();
    Ok(tagged(args, store, figure?))
}

/// A figure's `keys_per_s` field (0 when it has none).
fn keys_per_s(figure: &Figure) -> f64 {
    figure
        .to_string()
        .split_whitespace()
        .find_map(|f| f.strip_prefix("keys_per_s="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A bar on stderr, drawn only when stderr is a terminal.
fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({per_sec}, {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
