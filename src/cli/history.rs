//! `drover history`: what happened to keys, newest first.

use clap::Args as ClapArgs;
use drover::store::{HistoryEvent, HistoryList, StoreEngine as _};

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
    /// At most this many events.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// Print JSON (one array of events) instead of lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// Prints the newest events, optionally for one process and key. An unknown
/// process is an error (a typo should not look like an empty history).
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let store = args.db.open().await?;
    let events = store
        .history_list(HistoryList {
            process: args.process,
            key: args.key,
            before_id: None,
            limit: args.limit,
        })
        .await?;
    store.close().await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&events)?);
    } else {
        for event in &events {
            println!("{}", line(event));
        }
    }
    Ok(())
}

fn line(e: &HistoryEvent) -> String {
    let mut out = format!(
        "{}  {}  {}  {}",
        e.at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
        e.process,
        e.key,
        e.event
    );
    if let Some(attempt) = e.attempt {
        out.push_str(&format!("  attempt={attempt}"));
    }
    if let Some(session) = e.session {
        out.push_str(&format!("  session={session}"));
    }
    match (e.transient, &e.error) {
        (Some(true), Some(error)) => out.push_str(&format!("  transient error: {error}")),
        (_, Some(error)) => out.push_str(&format!("  error: {error}")),
        _ => {}
    }
    out
}
