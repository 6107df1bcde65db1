//! `drover errors PROCESS`: the error groups of a process — what its parked
//! and backing-off keys failed with, the key replaced by `<key>` and numbers
//! by `<n>`, most keys first.

use clap::Args as ClapArgs;
use drover::store::{ErrorGroup, ErrorGroups, StoreEngine as _, validate_process};

use super::db::DbArgs;
use super::listing::Listing;
use super::say::outln;
use super::shown::shown;

/// Arguments of `drover errors`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// The process.
    process: String,
    #[command(flatten)]
    listing: Listing,
    #[command(flatten)]
    db: DbArgs,
}

/// Prints the groups: one line each (keys, states, signature) and a sample
/// error under it. An unknown process is an error.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    validate_process(&args.process)?;
    let store = args.db.open().await?;
    let groups = store
        .error_groups(ErrorGroups {
            process: args.process.clone(),
            limit: args.listing.limit,
        })
        .await;
    store.close().await;
    let groups = groups?;
    if args.listing.json {
        outln!("{}", serde_json::to_string_pretty(&groups)?)?;
    } else if groups.is_empty() {
        outln!("{}: no parked or backing-off keys", shown(&args.process))?;
    } else {
        for group in &groups {
            outln!("{}", lines(group))?;
        }
    }
    Ok(())
}

/// One group as two lines: count, states and signature, then a sample.
fn lines(g: &ErrorGroup) -> String {
    let states: Vec<_> = g.states.iter().map(|s| s.as_str()).collect();
    format!(
        "{:>7}  {:<15} {}\n         e.g. {}",
        g.count,
        states.join(","),
        shown(&g.signature),
        shown(g.sample.lines().next().unwrap_or_default())
    )
}
