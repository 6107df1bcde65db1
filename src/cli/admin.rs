//! `drover delete|retry|park PROCESS KEY…`: an operator's actions on keys,
//! recorded in the history with the actor `cli`.

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::store::{
    ItemDelete, ItemPark, ItemRetry, Store, StoreEngine as _, StoreError, validate_key,
    validate_process,
};

use super::Reported;
use super::db::DbArgs;

/// Who the history says took the action.
const ACTOR: &str = "cli";

/// The keys an action applies to.
#[derive(Debug, ClapArgs)]
pub(crate) struct KeysArgs {
    /// The process the keys belong to.
    process: String,
    /// The keys.
    #[arg(required = true)]
    keys: Vec<String>,
    #[command(flatten)]
    db: DbArgs,
}

/// Arguments of `drover park`.
#[derive(Debug, ClapArgs)]
pub(crate) struct ParkArgs {
    #[command(flatten)]
    keys: KeysArgs,
    /// Why: shown as the keys' last error.
    #[arg(long, value_name = "TEXT", default_value = "parked by hand")]
    reason: String,
}

/// What to do to each key.
#[derive(Debug)]
enum Action {
    Delete,
    Retry,
    Park { reason: String },
}

/// Forgets the keys (their runs stay until retention removes them).
pub(crate) async fn delete(args: KeysArgs) -> anyhow::Result<()> {
    act(args, Action::Delete).await
}

/// Makes the keys pending now, cutting a backoff or a park short.
pub(crate) async fn retry(args: KeysArgs) -> anyhow::Result<()> {
    act(args, Action::Retry).await
}

/// Parks the keys until the next enqueue or retry.
pub(crate) async fn park(args: ParkArgs) -> anyhow::Result<()> {
    let reason = args.reason;
    act(args.keys, Action::Park { reason }).await
}

/// Applies `action` to each key in turn, printing what happened to it. A
/// running or unknown key is reported on stderr and the others go on; the
/// exit code is non-zero if any key failed. Names are checked before
/// connecting, so bad input writes nothing.
async fn act(args: KeysArgs, action: Action) -> anyhow::Result<()> {
    validate_process(&args.process)?;
    for key in &args.keys {
        validate_key(key)?;
    }
    let store = args.db.open().await?;
    let mut failed = 0_usize;
    let mut result = Ok(());
    for key in &args.keys {
        let name = format!("{}/{key}", args.process);
        match action.apply(&store, &args.process, key).await {
            Ok(Some(done)) => println!("{name}: {done}"),
            Ok(None) => {
                eprintln!("error: {name} is not a known key");
                failed += 1;
            }
            Err(e @ StoreError::AlreadyLeased { .. }) => {
                eprintln!("error: cannot {} {name}: {e}", action.verb());
                failed += 1;
            }
            Err(e) => {
                result = Err(e).with_context(|| format!("cannot {} {name}", action.verb()));
                break;
            }
        }
    }
    store.close().await;
    result?;
    if failed > 0 {
        return Err(Reported.into());
    }
    Ok(())
}

impl Action {
    fn verb(&self) -> &'static str {
        match self {
            Self::Delete => "delete",
            Self::Retry => "retry",
            Self::Park { .. } => "park",
        }
    }

    /// Applies the action to one key: what happened, or `None` if the key
    /// is not known.
    async fn apply(
        &self,
        store: &Store,
        process: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let (process, key, actor) = (process.to_owned(), key.to_owned(), ACTOR.to_owned());
        match self {
            Self::Delete => {
                let deleted = store.item_delete(ItemDelete {
                    process,
                    key,
                    actor,
                });
                Ok(deleted.await?.then(|| "deleted".to_owned()))
            }
            Self::Retry => {
                let item = store
                    .item_retry(ItemRetry {
                        process,
                        key,
                        actor,
                    })
                    .await?;
                Ok(item.map(|i| format!("retried, now {}", i.state)))
            }
            Self::Park { reason } => {
                let reason = reason.clone();
                let params = ItemPark {
                    process,
                    key,
                    reason,
                    actor,
                };
                let item = store.item_park(params).await?;
                Ok(item.map(|i| i.state.to_string()))
            }
        }
    }
}
