//! `drover watch TABLE --process P --key COLUMN` and `drover unwatch TABLE`:
//! make a table's inserts, updates and deletes enqueue their rows' keys in the
//! transaction that made them (the informer of the SQL world), or stop it.
//! `drover watch --list` shows the watched tables.

use anyhow::Context as _;
use clap::Args as ClapArgs;
use drover::store::{StoreError, TableWatch, validate_process};

use super::db::DbArgs;
use super::say::outln;
use super::shown::shown;

/// Arguments of `drover watch`.
#[derive(Debug, ClapArgs)]
pub(crate) struct WatchArgs {
    /// The table, as SQL names it (PostgreSQL: `machines`, `public.machines`,
    /// `"Odd ""name"""`; SQLite: its name).
    #[arg(required_unless_present = "list", conflicts_with = "list")]
    table: Option<String>,
    /// The process its keys are enqueued to.
    #[arg(long, required_unless_present = "list")]
    process: Option<String>,
    /// The column holding each row's key (text or integer), named exactly.
    #[arg(long = "key", value_name = "COLUMN", required_unless_present = "list")]
    key_column: Option<String>,
    /// Only updates that change one of these columns enqueue (default: every
    /// update; inserts and deletes always do).
    #[arg(long, value_delimiter = ',', value_name = "COLUMN,…")]
    columns: Vec<String>,
    /// List the watched tables instead.
    #[arg(long)]
    list: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// Arguments of `drover unwatch`.
#[derive(Debug, ClapArgs)]
pub(crate) struct UnwatchArgs {
    /// The watched table, named as for `drover watch`.
    table: String,
    #[command(flatten)]
    db: DbArgs,
}

/// Installs the watch (or lists them), saying what it did.
pub(crate) async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    if args.list {
        return list(&args.db).await;
    }
    let (Some(table), Some(process), Some(key_column)) =
        (args.table, args.process, args.key_column)
    else {
        anyhow::bail!("name the table, --process and --key (or use --list)");
    };
    validate_process(&process)?;
    let watch = TableWatch::new(table, &process, key_column).columns(args.columns);
    let store = args.db.open().await?;
    let result = store.table_watch(&watch).await;
    store.close().await;
    let table = match result {
        // Already one line that names the table and says what to do.
        Err(e @ StoreError::Watch(_)) => return Err(e.into()),
        other => other.with_context(|| format!("cannot watch {}", watch.table))?,
    };
    outln!(
        "watching {}: its changes enqueue {} to {}",
        shown(&table),
        shown(&watch.key_column),
        shown(&process)
    )?;
    Ok(())
}

/// Prints one line per watched table, under its current name; a watch whose
/// columns the table no longer has says which and how to mend it, rather
/// than showing a stale column as if it were watched.
async fn list(db: &DbArgs) -> anyhow::Result<()> {
    let store = db.open().await?;
    let result = store.table_watches().await;
    store.close().await;
    for watch in result.context("cannot list the watched tables")? {
        let filter = if watch.columns.is_empty() {
            String::new()
        } else {
            format!(" (updates of {})", shown(&watch.columns.join(", ")))
        };
        let gone = if watch.gone.is_empty() {
            String::new()
        } else {
            format!(
                "; gone from the table: {} (run drover unwatch {}, then watch it again)",
                shown(&watch.gone.join(", ")),
                shown(&watch.table)
            )
        };
        outln!(
            "{}: {} -> {}{filter}{gone}",
            shown(&watch.table),
            shown(&watch.key_column),
            shown(&watch.process)
        )?;
    }
    Ok(())
}

/// Drops the watch's triggers; unwatching a table that is not watched is an
/// error, so a typo does not pass for success.
pub(crate) async fn unwatch(args: UnwatchArgs) -> anyhow::Result<()> {
    let store = args.db.open().await?;
    let result = store.table_unwatch(&args.table).await;
    store.close().await;
    match result.with_context(|| format!("cannot unwatch {}", args.table))? {
        Some(table) => outln!("{} is no longer watched", shown(&table))?,
        None => anyhow::bail!(
            "{} is not watched (drover watch --list shows the watched tables)",
            args.table
        ),
    }
    Ok(())
}
