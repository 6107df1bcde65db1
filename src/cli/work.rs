//! `drover work PROCESS --exec CMD`: a control loop whose reconciler is a command.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::backoff::Backoff;
use drover::runner::{Controller, Task};
use tokio_util::sync::CancellationToken;

use super::db::{DbArgs, parse_duration};
use super::exec::{Exec, Job};
use super::remote;
use super::signal::shutdown_on_signals;

/// Arguments of `drover work`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// The process (control loop) whose keys to work on.
    process: String,
    /// The command to run per key, split into words like a shell would (no shell
    /// runs it); the key is appended as the last argument and set in DROVER_KEY.
    /// Exit 0 = done, 75 = retry with backoff, anything else = park the key.
    #[arg(long, value_name = "CMD")]
    exec: String,
    /// Keys run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    parallelism: u16,
    /// Keys claimed ahead beyond those running, so the next command starts
    /// without a database round trip (default 0: claim only for free slots).
    /// Prefetched keys wait leased on this worker.
    #[arg(long, conflicts_with = "server")]
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
    /// Work through a drover server's HTTP API instead of the database (for
    /// machines that should not hold database credentials).
    #[arg(long, value_name = "URL", conflicts_with = "url")]
    server: Option<String>,
    /// The bearer token for --server (a worker's or an admin's).
    #[arg(
        long,
        env = "DROVER_TOKEN",
        hide_env_values = true,
        requires = "server"
    )]
    token: Option<String>,
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

/// Runs the worker until SIGINT/SIGTERM, then shuts down gracefully (a second
/// signal exits at once).
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(server) = &args.server {
        return run_remote(&args, server).await;
    }
    let exec = Arc::new(Exec::parse(&args.exec)?);
    let backoff = args.backoff()?;
    let store = args.db.open().await?;
    let reconciler = move |task: Task| {
        let exec = Arc::clone(&exec);
        async move { exec.run_until(Job::from(&task), task.cancelled()).await }
    };
    let mut builder = Controller::builder(store, args.process.clone(), reconciler)
        .component("drover work")
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
    let controller = builder.build().context("invalid worker settings")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signals(shutdown.clone()));
    eprintln!(
        "drover work: process {} on {}, parallelism {}, exec {:?}",
        args.process,
        args.db.redacted(),
        args.parallelism,
        args.exec
    );
    controller.run(shutdown).await?;
    Ok(())
}

/// `--server`: the same loop over the HTTP API.
async fn run_remote(args: &Args, server: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.backoff_initial.is_none() && args.backoff_max.is_none(),
        "--backoff-initial and --backoff-max need --db: a process's backoff is set where its database is"
    );
    anyhow::ensure!(
        args.ttl >= Duration::from_millis(300),
        "--ttl must be at least 300ms"
    );
    let api = remote::Api::new(server, args.token.clone())?;
    let exec = Exec::parse(&args.exec)?;
    let settings = remote::Settings {
        process: args.process.clone(),
        parallelism: usize::from(args.parallelism),
        ttl: args.ttl,
        timeout: args.timeout,
        shutdown_deadline: args.shutdown_deadline,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signals(shutdown.clone()));
    eprintln!(
        "drover work: process {} via {server}, parallelism {}, exec {:?}",
        args.process, args.parallelism, args.exec
    );
    remote::run(api, exec, settings, shutdown).await
}
