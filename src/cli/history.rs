//! `drover history`: what happened to keys, newest first — one line per run
//! (written when it ended) or operator action.

use clap::Args as ClapArgs;
use drover::store::{Run, RunList, RunOutcome, StoreEngine as _};

use super::db::DbArgs;

/// Arguments of `drover history`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Only this process.
    #[arg(long)]
    process: Option<String>,
    /// Only this key.
    #[arg(long)]
    key: Option<String>,
    /// Only runs with this outcome (done, requeued, retry, parked, canceled,
    /// expired) or operator actions (retried, parked, deleted).
    #[arg(long, value_parser = parse_outcome)]
    outcome: Option<RunOutcome>,
    /// Only rows older than this id (the last id of the previous page).
    #[arg(long)]
    before: Option<i64>,
    /// At most this many rows.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// Print JSON (one array of runs) instead of lines.
    #[arg(long)]
    json: bool,
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

/// Prints the newest runs, optionally for one process, key and outcome. An
/// unknown process is an error (a typo should not look like an empty history).
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let store = args.db.open().await?;
    let runs = store
        .run_list(RunList {
            process: args.process,
            key: args.key,
            outcome: args.outcome,
            before: args.before,
            limit: args.limit,
        })
        .await?;
    store.close().await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    } else {
        for run in &runs {
            println!("{}", line(run));
        }
    }
    Ok(())
}

/// One run as a line: id, end, process, key, outcome, then what is known.
fn line(r: &Run) -> String {
    let mut out = format!(
        "{}  {}  {}  {}  {}",
        r.id,
        r.ended_at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
        r.process,
        r.key,
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
        out.push_str(&format!("  by={actor}"));
    }
    if let Some(error) = &r.error {
        out.push_str(&format!("  error: {error}"));
    }
    out
}
