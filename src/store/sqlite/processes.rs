//! Processes on SQLite: made known by their first enqueue, their stored
//! settings changed by `process configure` and read by every node.

use crate::store::exec::Exec as _;
use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex, PoisonError};

use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow as _, Row as _};

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use crate::store::rules::pages;
use crate::store::rules::processes::{
    ProcessSettingsRow, SETTINGS_ONE, SETTINGS_PAGE, bind_configure, checked, configure_update,
};
use crate::store::settings::{ProcessConfigure, ProcessSettings};
use crate::store::{Page, ProcessPage, StoreError};

/// `configure`'s statement, written once from the shared column list.
static UPDATE: LazyLock<String> = LazyLock::new(|| configure_update('?'));

/// Writes the settings given, leaving the others as stored.
pub(super) async fn configure(
    store: &SqliteStore,
    params: ProcessConfigure,
) -> Result<(), StoreError> {
    checked(&params)?;
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    bind_configure(sqlx::query(UPDATE.as_str()), &params)
        .exec(&mut *tx)
        .await?;
    tx.commit().await.db()?;
    Ok(())
}

/// One page of processes with their settings, in name order, but for those
/// whose name is not UTF-8 (see [`undecodable`]): the page is cut on the
/// rows read, so such a name takes a place on it and a page may show fewer.
pub(super) async fn page(
    store: &SqliteStore,
    page: ProcessPage,
) -> Result<Page<ProcessSettings>, StoreError> {
    let rows = sqlx::query(SETTINGS_PAGE)
        .bind(page.after.unwrap_or_default())
        .bind(pages::read_limit(page.limit))
        .fetch_all(&store.pool)
        .await
        .db()?;
    let rows = pages::cut(rows, page.limit, |row: &SqliteRow| {
        let bytes: Vec<u8> = row.try_get("process").unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let mut items = Vec::with_capacity(rows.items.len());
    for row in rows.items {
        if let Some(settings) = decoded(&row)? {
            items.push(settings);
        }
    }
    Ok(Page {
        items,
        next: rows.next,
    })
}

/// One process with its settings; `None` if it is unknown.
pub(super) async fn get(
    store: &SqliteStore,
    process: &str,
) -> Result<Option<ProcessSettings>, StoreError> {
    let row = sqlx::query(SETTINGS_ONE)
        .bind(process)
        .fetch_optional(&store.pool)
        .await
        .db()?;
    match row {
        Some(row) => decoded(&row),
        None => Ok(None),
    }
}

/// A row's settings, or `None` for a name that is not UTF-8.
fn decoded(row: &SqliteRow) -> Result<Option<ProcessSettings>, StoreError> {
    if undecodable(row) {
        return Ok(None);
    }
    let row = ProcessSettingsRow::<i64>::from_row(row).db()?;
    Ok(Some(row.into_settings()))
}

/// Whether `row`'s process name is not UTF-8, logged the first time this
/// program meets that name.
///
/// SQLite keeps whatever bytes SQL hands it as text, and `drover_enqueue`
/// took such a name before migration 0014 refused it. Read as a `String`, one
/// such name failed the whole list, and with it every tick of retention and
/// resync for every process. No worker, operator or API call can name the
/// process, so it is left out (shown with U+FFFD in the log); the list is
/// read at every maintenance tick, hence the log only once per name.
fn undecodable(row: &SqliteRow) -> bool {
    static LOGGED: Mutex<BTreeSet<Vec<u8>>> = Mutex::new(BTreeSet::new());
    if row.try_get::<&str, _>("process").is_ok() {
        return false;
    }
    let bytes: Vec<u8> = row.try_get("process").unwrap_or_default();
    let name = String::from_utf8_lossy(&bytes).into_owned();
    if LOGGED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(bytes)
    {
        tracing::warn!(
            process = %name,
            "a process name is not UTF-8 text (written by SQL); it is left out of the process list, \
             so retention and resync skip it"
        );
    }
    true
}

/// Makes a process known (so queries about it are not refused as unknown).
pub(super) async fn ensure_process(tx: &mut Tx, now: i64, process: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO drover_processes (process, created_at) VALUES (?1, ?2)
         ON CONFLICT (process) DO NOTHING",
    )
    .bind(process)
    .bind(now)
    .exec(&mut **tx)
    .await?;
    Ok(())
}
