//! The `drover` command line: one subcommand per job, each in its own file.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use say::errln;

mod admin;
mod bench;
mod db;
mod enqueue;
mod errors;
mod exec;
mod history;
mod keeper;
mod listing;
mod metrics_listen;
mod migrate;
mod open_files;
mod otel;
#[cfg(feature = "otlp-grpc")]
mod otlp_grpc;
mod otlp_protocol;
mod pause;
mod process;
mod program;
mod say;
mod serve;
mod server_args;
mod shown;
mod signal;
mod span_export;
mod spawner;
mod status;
mod streams;
mod watch;
mod work;

/// drover runs control loops reliably: keyed work with coalescing, durable
/// per-key backoff and fenced leases, on SQLite or PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "drover", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure drover's throughput and print one `BENCH …` line per figure.
    Bench(bench::Args),
    /// Apply the database migrations this binary carries (idempotent).
    Migrate(migrate::Args),
    /// Enqueue keys for a process (coalesced with pending and running ones).
    Enqueue(enqueue::Args),
    /// Show items per process and state, and the oldest pending item's age.
    Status(status::Args),
    /// Show what happened to keys, newest first (`history prune`: apply
    /// retention now).
    History(history::Args),
    /// Show what the failing keys of a process failed with, grouped by error
    /// (`--error SIGNATURE` of retry, park and delete acts on a group).
    Errors(errors::Args),
    /// Retry keys now: cut their backoff or park short.
    Retry(admin::KeysArgs),
    /// Park keys: they do not run until their next enqueue or retry.
    Park(admin::ParkArgs),
    /// Forget keys (their runs stay until retention removes them).
    Delete(admin::KeysArgs),
    /// Configure processes (retention, backoff, concurrency and rate limits)
    /// and list their settings.
    Process(process::Args),
    /// Pause a process: no worker claims its keys until it is resumed (runs
    /// going on finish; enqueues are kept).
    Pause(pause::Args),
    /// Resume a paused process.
    Resume(pause::Args),
    /// Run a command for each key of a process: a control loop from the shell.
    Work(work::Args),
    /// Serve the HTTP API, /metrics and the dashboard (default http://127.0.0.1:7420/).
    Serve(serve::Args),
    /// Watch a table: every insert, update and delete of a row enqueues its
    /// key, in the transaction that made it (`--list`: the watched tables).
    Watch(watch::WatchArgs),
    /// Stop watching a table (drop the triggers `drover watch` installed).
    Unwatch(watch::UnwatchArgs),
    /// Internal: the process `drover work` starts to kill its commands'
    /// process groups if it dies (see `keeper.rs`).
    #[command(hide = true)]
    Keeper,
}

/// A failure already reported on stderr, one line per cause: `main` exits
/// non-zero without another line.
#[derive(Debug)]
pub(crate) struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed (see above)")
    }
}

impl std::error::Error for Reported {}

/// The command line, parsed. `--server` (`pause`, `resume`, `work`) acts
/// instead of the database, so a `--db` given beside it is refused; but not
/// `DROVER_DATABASE_URL`, which names the database of every other command
/// run in the same shell. clap counts a value from the environment as given,
/// so a conflict declared to it refused `--server` wherever the variable was
/// set, naming a `--db` nobody gave.
fn parse() -> Cli {
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    if let Some((_, sub)) = matches.subcommand()
        && sub.try_contains_id("server").unwrap_or(false)
        && sub.try_contains_id("url").unwrap_or(false)
        && sub.value_source("url") == Some(ValueSource::CommandLine)
    {
        command
            .error(
                ErrorKind::ArgumentConflict,
                "the argument '--server <URL>' cannot be used with '--db <URL>': --server acts \
                 instead of the database, give one of them",
            )
            .exit();
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Parses the command line, runs the subcommand and turns any error into one
/// line on stderr and a non-zero exit code.
pub(crate) fn main() -> ExitCode {
    let cli = parse();
    if matches!(cli.command, Command::Keeper) {
        return keeper::run();
    }
    // Dropped last, however `main` ends (a return, a panic): what drover's
    // streams hold is written before the process exits.
    let _flush = streams::FlushOnDrop;
    // Dropped after the runtime: the last spans are flushed on exit (and a
    // warning about them still reaches the streams before their flush).
    let _telemetry = otel::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Bench(args) => bench::run(args).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Enqueue(args) => enqueue::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::History(args) => history::run(args).await,
            Command::Errors(args) => errors::run(args).await,
            Command::Retry(args) => admin::retry(args).await,
            Command::Park(args) => admin::park(args).await,
            Command::Delete(args) => admin::delete(args).await,
            Command::Process(args) => process::run(args).await,
            Command::Pause(args) => pause::run(args, true).await,
            Command::Resume(args) => pause::run(args, false).await,
            Command::Work(args) => work::run(args).await,
            Command::Serve(args) => serve::run(args).await,
            Command::Watch(args) => watch::watch(args).await,
            Command::Unwatch(args) => watch::unwatch(args).await,
            Command::Keeper => unreachable!("the keeper runs without a runtime, above"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of the output has gone (`drover history | head`): it
        // read what it wanted.
        Err(e) if e.is::<say::Gone>() => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        // Shown: an error may quote a name a caller chose (a table, a key),
        // and must stay one line that sends the terminal nothing.
        Err(e) => {
            errln!("error: {}", shown::shown(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
