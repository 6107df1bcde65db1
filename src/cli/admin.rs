//! `drover delete|retry|park PROCESS KEY…`: an operator's actions on keys,
//! recorded in the history with the actor `cli`; with `--error`, `--state` or
//! `--prefix` instead of keys, on every key that filter matches (in batches,
//! never a running key).

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::store::{
    ItemDelete, ItemFilter, ItemPark, ItemRetry, ItemState, ItemsDelete, ItemsPark, ItemsRetry,
    Store, StoreEngine as _, StoreError, validate_key, validate_process,
};

use super::Reported;
use super::db::DbArgs;
use super::say::{Lines, errln, outln};
use super::shown::shown;

/// Who the history says took the action.
const ACTOR: &str = "cli";

/// The keys an action applies to: named, or every key a filter matches.
#[derive(Debug, ClapArgs)]
pub(crate) struct KeysArgs {
    /// The process the keys belong to.
    process: String,
    /// The keys (or, instead, a filter: --error, --state, --prefix).
    #[arg(
        required_unless_present_any = ["error", "state", "prefix"],
        conflicts_with_all = ["error", "state", "prefix"]
    )]
    keys: Vec<String>,
    #[command(flatten)]
    filter: FilterArgs,
    #[command(flatten)]
    db: DbArgs,
}

/// A filter instead of keys: every key matching all the options given that
/// is not running.
#[derive(Debug, ClapArgs)]
struct FilterArgs {
    /// Every failing (parked or backing-off) key whose last error has this
    /// signature, as `drover errors PROCESS` lists them.
    #[arg(long, value_name = "SIGNATURE")]
    error: Option<String>,
    /// Every key in this state: pending, backoff, parked or idle.
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    state: Option<ItemState>,
    /// Every key starting with this.
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
}

/// Parses a state a filter may name (never `running`).
fn parse_state(s: &str) -> Result<ItemState, String> {
    ItemState::parse(s)
        .filter(|s| *s != ItemState::Running)
        .ok_or_else(|| {
            format!("{s:?} is not a state to act on; use pending, backoff, parked or idle")
        })
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
    if args.keys.is_empty() {
        return act_where(args, action).await;
    }
    for key in &args.keys {
        validate_key(key)?;
    }
    let store = args.db.open().await?;
    let mut failed = 0_usize;
    let mut result = Ok(());
    let mut lines = Lines::default();
    for key in &args.keys {
        let name = shown(&format!("{}/{key}", args.process));
        match action.apply(&store, &args.process, key).await {
            Ok(Some(done)) => lines.line(format_args!("{name}: {done}")),
            Ok(None) => {
                errln!("error: {name} is not a known key");
                failed += 1;
            }
            Err(e @ StoreError::AlreadyLeased { .. }) => {
                errln!("error: cannot {} {name}: {e}", action.verb());
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
    lines.finish()
}

/// Applies `action` to every key the filter matches, printing how many
/// changed.
async fn act_where(args: KeysArgs, action: Action) -> anyhow::Result<()> {
    let filter = ItemFilter {
        process: args.process.clone(),
        state: args.filter.state,
        error_signature: args.filter.error,
        key_prefix: args.filter.prefix,
    };
    let store = args.db.open().await?;
    let actor = ACTOR.to_owned();
    let changed = match &action {
        Action::Delete => {
            store
                .items_delete_where(ItemsDelete::new(filter, actor))
                .await
        }
        Action::Retry => {
            store
                .items_retry_where(ItemsRetry::new(filter, actor))
                .await
        }
        Action::Park { reason } => {
            let params = ItemsPark::new(filter, actor, reason.clone());
            store.items_park_where(params).await
        }
    };
    store.close().await;
    let changed =
        changed.with_context(|| format!("cannot {} in {}", action.verb(), args.process))?;
    outln!(
        "{}: {} {changed} key(s)",
        shown(&args.process),
        action.done()
    )?;
    Ok(())
}

impl Action {
    fn done(&self) -> &'static str {
        match self {
            Self::Delete => "deleted",
            Self::Retry => "retried",
            Self::Park { .. } => "parked",
        }
    }

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
