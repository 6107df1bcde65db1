//! `drover history`: what happened to keys, newest first — one line per run
//! (written when it ended) or operator action; `drover history prune` applies
//! retention by hand.

use clap::{Args as ClapArgs, Subcommand};
use drover::runner::Pruner;
use drover::store::{Run, RunList, RunOutcome, StoreEngine as _, validate_process};

use super::db::DbArgs;
use super::listing::Listing;
use super::say::{Lines, outln};
use super::shown::shown;

/// Arguments of `drover history`: a listing, or a subcommand.
#[derive(Debug, ClapArgs)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    list: ListArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply retention now (what every `drover serve` and worker does on a
    /// timer): delete runs past each process's limits and forget its idle keys
    /// untouched for its period (`drover process configure`).
    Prune(PruneArgs),
}

/// Arguments of `drover history prune`.
#[derive(Debug, ClapArgs)]
struct PruneArgs {
    /// Only this process (default: every process).
    #[arg(long)]
    process: Option<String>,
    #[command(flatten)]
    db: DbArgs,
}

/// Arguments of the listing.
#[derive(Debug, ClapArgs)]
struct ListArgs {
    /// Only this process.
    #[arg(long)]
    process: Option<String>,
    /// Only this key.
    #[arg(long)]
    key: Option<String>,
    /// Only runs with this outcome (done, requeued, retry, parked, canceled,
    /// expired) or operator actions (retried, parked, deleted, paused,
    /// resumed); `parked` matches both a permanent failure and an operator's
    /// park.
    #[arg(long, value_parser = parse_outcome)]
    outcome: Option<RunOutcome>,
    /// Only rows older than this id (the last id of the previous page).
    #[arg(long)]
    before: Option<i64>,
    #[command(flatten)]
    listing: Listing,
    #[command(flatten)]
    db: DbArgs,
}

/// Parses an outcome's name, listing the valid ones on a typo.
fn parse_outcome(s: &str) -> Result<RunOutcome, String> {
    RunOutcome::parse(s).ok_or_else(|| {
        let names: Vec<_> = RunOutcome::ALL.iter().map(|o| o.as_str()).collect();
        format!("{s:?} is not an outcome; use one of {}", names.join(", "))
    })
}

/// Runs `drover history` or its subcommand.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(Command::Prune(prune_args)) => prune(prune_args).await,
        None => list(args.list).await,
    }
}

/// Prunes each process (or the one asked for) completely, printing what was
/// removed from each. An unknown process is an error.
async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    if let Some(process) = &args.process {
        validate_process(process)?;
    }
    let store = args.db.open().await?;
    let pruned = async {
        let processes = match args.process {
            Some(process) => vec![process],
            None => store
                .process_list()
                .await?
                .into_iter()
                .map(|s| s.process)
                .collect(),
        };
        if processes.is_empty() {
            outln!("nothing to prune: no processes yet")?;
        }
        let pruner = Pruner::new(store.clone());
        let mut lines = Lines::default();
        for process in processes {
            let pruned = pruner.prune_process(&process).await?;
            lines.line(format_args!(
                "{}: removed {} run(s) and {} idle key(s)",
                shown(&process),
                pruned.runs,
                pruned.idle_keys
            ));
        }
        lines.finish()
    }
    .await;
    store.close().await;
    pruned
}

/// Prints the newest runs, optionally for one process, key and outcome. An
/// unknown process is an error (a typo should not look like an empty history).
async fn list(args: ListArgs) -> anyhow::Result<()> {
    let store = args.db.open().await?;
    let runs = store
        .run_list(RunList {
            process: args.process,
            key: args.key,
            outcome: args.outcome,
            before: args.before,
            limit: args.listing.limit,
        })
        .await?;
    store.close().await;
    if args.listing.json {
        outln!("{}", serde_json::to_string_pretty(&runs)?)?;
    } else {
        for run in &runs {
            outln!("{}", line(run))?;
        }
    }
    Ok(())
}

/// One run as a line: id, end, process, key, outcome, then what is known
/// (`trace=` the trace id of its span, to look up in a tracing UI), the error
/// last.
fn line(r: &Run) -> String {
    let mut out = format!(
        "{}  {}  {}  {}  {}",
        r.id,
        r.ended_at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
        shown(&r.process),
        shown(&r.key),
        r.outcome
    );
    if let Some(attempt) = r.attempt {
        out.push_str(&format!("  attempt={attempt}"));
    }
    if let Some(wait) = r.queue_wait() {
        out.push_str(&format!("  wait={}ms", wait.as_millis()));
    }
    if let Some(took) = r.duration() {
        out.push_str(&format!("  took={}ms", took.as_millis()));
    }
    if let Some(token) = r.token {
        out.push_str(&format!("  token={token}"));
    }
    if let Some(actor) = &r.actor {
        out.push_str(&format!("  by={}", shown(actor)));
    }
    if let Some(trace) = &r.trace_id {
        out.push_str(&format!("  trace={trace}"));
    }
    if let Some(error) = &r.error {
        out.push_str(&format!("  error: {}", shown(error)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--outcome`'s help names every outcome it takes: it left out the
    /// operator's pause and resume, which it accepted.
    #[test]
    fn the_outcome_flags_help_names_every_outcome() {
        let command = <Args as clap::Args>::augment_args(clap::Command::new("history"));
        let help = command
            .get_arguments()
            .find(|a| a.get_id() == "outcome")
            .and_then(|a| a.get_help())
            .expect("--outcome has help")
            .to_string();
        for outcome in RunOutcome::ALL {
            assert!(
                help.contains(outcome.as_str()),
                "{}: {help}",
                outcome.as_str()
            );
        }
    }
}
