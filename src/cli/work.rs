//! `drover work PROCESS --exec CMD`: a control loop whose reconciler is a command.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::backoff::Backoff;
use drover::runner::{Controller, Reconciler, Task};
use drover::store::WorkerBackend;
use tokio_util::sync::CancellationToken;

use super::db::{DbArgs, parse_duration};
use super::exec::{Exec, Job};
use super::metrics_listen;
use super::open_files;
use super::say::errln;
use super::server_args::ServerArgs;
use super::shown::shown;
use super::signal::shutdown_on_signals;

/// Arguments of `drover work`.
#[derive(Debug, ClapArgs)]
// --server acts instead of the database: a --db given beside it is refused
// by `cli::parse`.
pub(crate) struct Args {
    /// The process (control loop) whose keys to work on.
    process: String,
    /// The command to run per key, split into words like a shell would (no shell
    /// runs it); the key is appended as the last argument and set in DROVER_KEY.
    /// Exit 0 = done, 75 = retry with backoff, anything else = park the key.
    /// A key may start with `-`: end CMD with `--` if the program honours it,
    /// or use --key-in-env-only.
    #[arg(long, value_name = "CMD")]
    exec: String,
    /// Pass the key only in DROVER_KEY, not as the command's last argument, so
    /// no key can reach the program's option parser.
    #[arg(long)]
    key_in_env_only: bool,
    /// Keys run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    parallelism: u16,
    /// Keys claimed ahead beyond those running, so the next command starts
    /// without a database round trip (default 0: claim only for free slots).
    /// Prefetched keys wait leased on this worker.
    #[arg(long)]
    prefetch: Option<u16>,
    /// Session TTL (at least 750ms): a dead worker's keys run elsewhere this long
    /// after it died. A worker cut off from the database kills its commands
    /// TTL − margin after its last good heartbeat was sent, margin =
    /// max(250ms, TTL/10), before the database can give their keys to another
    /// worker.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,
    /// Kill a command that runs longer than this (counts as a transient failure).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// First retry delay after a failure (stored for the process; default 1s).
    #[arg(long, value_parser = parse_duration)]
    backoff_initial: Option<Duration>,
    /// Longest retry delay (stored for the process; default 360s).
    #[arg(long, value_parser = parse_duration)]
    backoff_max: Option<Duration>,
    /// On SIGINT/SIGTERM, how long running commands may finish before they are
    /// killed and their keys released.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shutdown_deadline: Duration,
    /// Serve this worker's `/metrics` (its outcomes, work durations, sessions)
    /// and `/healthz` on this address, e.g. 127.0.0.1:9464 (port 0: a free
    /// one, named on stderr).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    remote: ServerArgs,
    #[command(flatten)]
    db: DbArgs,
}

impl Args {
    fn backoff(&self) -> anyhow::Result<Option<Backoff>> {
        if self.backoff_initial.is_none() && self.backoff_max.is_none() {
            return Ok(None);
        }
        let defaults = Backoff::default();
        let initial = self.backoff_initial.unwrap_or(defaults.initial());
        let max = self.backoff_max.unwrap_or(defaults.max().max(initial));
        let backoff = Backoff::new(initial, defaults.factor(), max)
            .context("invalid --backoff-initial / --backoff-max")?;
        Ok(Some(backoff))
    }
}

/// `wanted` runs at once, or fewer if the open-file limit (raised first, see
/// [`open_files::raise`]) cannot hold what their commands take (three
/// each: the command's stdout and stderr pipes and the descriptor tokio
/// waits on it with) beside what else the worker holds
/// ([`open_files::reserve`]). Past it a command cannot be started, a
/// transient failure that would back its key off for nothing.
fn fit_runs(wanted: u16) -> u16 {
    let Some(limit) = open_files::raise() else {
        return wanted;
    };
    let room = (limit.saturating_sub(open_files::reserve(limit)) / 3).max(1);
    let room = u16::try_from(room).unwrap_or(u16::MAX);
    if room < wanted {
        errln!(
            "drover work: --parallelism {wanted} lowered to {room}: the open-file limit is \
             {limit} and each run holds three (raise it with `ulimit -n` to run more)"
        );
    }
    wanted.min(room)
}

/// Runs the worker until SIGINT/SIGTERM, then shuts down gracefully (a second
/// signal exits at once). With `--server` the same controller works through a
/// drover server's HTTP API instead of the database.
pub(crate) async fn run(mut args: Args) -> anyhow::Result<()> {
    args.parallelism = fit_runs(args.parallelism);
    let mut exec = Exec::parse(&args.exec)?;
    super::program::find(exec.program())?;
    if args.key_in_env_only {
        exec = exec.key_in_env_only();
    }
    let exec = Arc::new(exec);
    super::keeper::start();
    let backoff = args.backoff()?;
    if let Some(server) = &args.remote.server {
        anyhow::ensure!(
            backoff.is_none(),
            "--backoff-initial and --backoff-max need --db: a process's backoff is set where its database is"
        );
        let client = args.remote.client(server)?;
        let controller = controller(&args, client, exec, None)?;
        // The URL without its password: it may carry credentials (sent as
        // Basic auth, which a server reads as a token).
        errln!(
            "drover work: process {} via {}, parallelism {}, exec {:?}",
            shown(&args.process),
            drover::store::redact_url(server),
            args.parallelism,
            args.exec
        );
        return serve_until_signal(&args, controller).await;
    }
    let store = args.db.open_lasting().await?;
    let controller = controller(&args, store, exec, backoff)?;
    errln!(
        "drover work: process {} on {}, parallelism {}, exec {:?}",
        shown(&args.process),
        args.db.redacted(),
        args.parallelism,
        args.exec
    );
    serve_until_signal(&args, controller).await
}

/// The controller `drover work` runs, on either backend.
fn controller<B: WorkerBackend>(
    args: &Args,
    backend: B,
    exec: Arc<Exec>,
    backoff: Option<Backoff>,
) -> anyhow::Result<Controller<impl Reconciler + use<B>, B>> {
    let reconciler = move |task: Task| {
        let exec = Arc::clone(&exec);
        async move { exec.run_until(Job::from(&task), task.cancelled()).await }
    };
    let component = if args.remote.server.is_some() {
        "drover work --server"
    } else {
        "drover work"
    };
    let mut builder = Controller::builder(backend, args.process.clone(), reconciler)
        .component(component)
        .parallelism(usize::from(args.parallelism))
        .ttl(args.ttl)
        .shutdown_deadline(args.shutdown_deadline);
    if let Some(timeout) = args.timeout {
        builder = builder.timeout(timeout);
    }
    if let Some(prefetch) = args.prefetch {
        builder = builder.prefetch(usize::from(prefetch));
    }
    if let Some(backoff) = backoff {
        builder = builder.backoff(backoff);
    }
    builder.build().context("invalid worker settings")
}

/// Runs `controller` until SIGINT/SIGTERM, with its metrics listener if asked.
async fn serve_until_signal<R: Reconciler, B: WorkerBackend>(
    args: &Args,
    controller: Controller<R, B>,
) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let metrics_stop = CancellationToken::new();
    if let Some(addr) = args.metrics_listen {
        let bound = metrics_listen::start(addr, metrics_stop.clone()).await?;
        errln!("drover work: metrics on http://{bound}/metrics");
    }
    tokio::spawn(shutdown_on_signals(shutdown.clone()));
    let ran = controller.run(shutdown).await;
    metrics_stop.cancel();
    ran?;
    Ok(())
}
