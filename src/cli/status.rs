//! `drover status`: items per process and state, and how far workers lag.

use clap::Args as ClapArgs;
use drover::store::{ProcessCounts, StoreEngine as _};
use serde_json::json;

use super::db::DbArgs;
use super::say::outln;
use super::shown::shown;

/// Arguments of `drover status`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Print JSON (one array of objects) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// Prints pending, backoff, running and parked counts per known process, with the
/// age of the oldest ready item.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let store = args.db.open().await?;
    // Every process, read a page at a time.
    let counts = store.process_counts_all().await?;
    store.close().await;
    if args.json {
        let rows: Vec<_> = counts.iter().map(to_json).collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    if counts.is_empty() {
        outln!("no processes yet: enqueue some keys with `drover enqueue PROCESS KEY…`")?;
        return Ok(());
    }
    outln!(
        "{:<24} {:>9} {:>9} {:>9} {:>9}  OLDEST PENDING",
        "PROCESS",
        "PENDING",
        "BACKOFF",
        "RUNNING",
        "PARKED"
    )?;
    for c in &counts {
        let oldest = c.oldest_pending_age.map_or_else(
            || "-".to_owned(),
            |age| {
                humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))
                    .to_string()
            },
        );
        outln!(
            "{:<24} {:>9} {:>9} {:>9} {:>9}  {oldest}",
            shown(&c.process),
            c.pending,
            c.backoff,
            c.running,
            c.parked
        )?;
    }
    Ok(())
}

fn to_json(c: &ProcessCounts) -> serde_json::Value {
    json!({
        "process": c.process,
        "pending": c.pending,
        "backoff": c.backoff,
        "running": c.running,
        "parked": c.parked,
        "idle": c.idle,
        "oldest_pending_age_seconds": c.oldest_pending_age.map(|d| d.as_secs_f64()),
    })
}
