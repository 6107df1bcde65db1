//! `drover pause|resume PROCESS`: stop and restart every worker's claims of a
//! process, on the database or through a drover server's API, recorded in
//! the history (key `""`) with the actor `cli` (or `admin` through a server).

use clap::Args as ClapArgs;
use drover::store::{ProcessPause, StoreEngine as _, validate_process};

use super::db::DbArgs;
use super::say::outln;
use super::server_args::ServerArgs;
use super::shown::shown;

/// Arguments of `drover pause` and `drover resume`.
#[derive(Debug, ClapArgs)]
// --server acts instead of the database: a --db given beside it is refused
// by `cli::parse`.
pub(crate) struct Args {
    /// The process.
    process: String,
    #[command(flatten)]
    remote: ServerArgs,
    #[command(flatten)]
    db: DbArgs,
}

/// Pauses (`true`) or resumes the process and says what changed.
pub(crate) async fn run(args: Args, paused: bool) -> anyhow::Result<()> {
    validate_process(&args.process)?;
    let changed = if let Some(server) = &args.remote.server {
        let client = args.remote.client(server)?;
        client.process_pause(&args.process, paused).await?
    } else {
        let store = args.db.open().await?;
        let params = ProcessPause {
            process: args.process.clone(),
            paused,
            actor: "cli".into(),
        };
        let changed = store.process_pause(params).await;
        store.close().await;
        changed?
    };
    let (now, was) = if paused {
        ("paused", "was already paused")
    } else {
        ("resumed", "was not paused")
    };
    if changed {
        outln!("{now} {}", shown(&args.process))?;
    } else {
        outln!("{} {was}", shown(&args.process))?;
    }
    Ok(())
}
