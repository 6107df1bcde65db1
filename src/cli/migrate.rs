//! `drover migrate`: bring a database's schema up to this binary's version.

use clap::Args as ClapArgs;
use drover::store::Store;

use super::db::DbArgs;
use super::say::outln;

/// Arguments of `drover migrate`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    #[command(flatten)]
    db: DbArgs,
}

/// Applies the embedded migrations (idempotent; safe to run from several nodes at
/// once) and says so.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let store: Store = args.db.open().await?;
    store.migrate().await?;
    store.close().await;
    outln!("the {} database is up to date", store.engine_name())
}
