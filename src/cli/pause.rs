//! `drover pause|resume PROCESS`: stop and restart every worker's claims of a
//! process, on the database or through a drover server's API, recorded in
//! the history (key `""`) with the actor `cli` (or `admin` through a server).

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::client::Client;
use drover::store::{ProcessPause, StoreEngine as _, validate_process};

use super::db::DbArgs;

/// Arguments of `drover pause` and `drover resume`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// The process.
    process: String,
    /// Act through a drover server's API (with an admin's --token) instead of
    /// the database.
    #[arg(long, value_name = "URL", conflicts_with = "url")]
    server: Option<String>,
    /// The bearer token for --server (an admin's).
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

/// Pauses (`true`) or resumes the process and says what changed.
pub(crate) async fn run(args: Args, paused: bool) -> anyhow::Result<()> {
    validate_process(&args.process)?;
    let changed = if let Some(server) = &args.server {
        let mut client = Client::new(server).context("invalid --server")?;
        if let Some(token) = &args.token {
            client = client.token(token.clone());
        }
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
        println!("{now} {}", args.process);
    } else {
        println!("{} {was}", args.process);
    }
    Ok(())
}
