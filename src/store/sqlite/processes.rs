//! Processes on SQLite: made known by their first enqueue, their stored
//! settings changed by `process configure` and read by every node.

use crate::store::exec::Exec as _;
use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex, PoisonError};

use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow as _, Row as _};

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use crate::store::StoreError;
use crate::store::rules::processes::{
    ProcessSettingsRow, SETTINGS_SELECT, bind_configure, checked, configure_update,
};
use crate::store::settings::{ProcessConfigure, ProcessSettings};

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

/// Every known process with its settings, but for those whose name is not
/// UTF-8 (see [`undecodable`]).
pub(super) async fn list(store: &SqliteStore) -> Result<Vec<ProcessSettings>, StoreError> {
    let rows = sqlx::query(SETTINGS_SELECT)
        .fetch_all(&store.pool)
        .await
        .db()?;
    let mut list = Vec::with_capacity(rows.len());
    for row in rows {
        if undecodable(&row) {
            continue;
        }
        let row = ProcessSettingsRow::<i64>::from_row(&row).db()?;
        list.push(row.into_settings());
    }
    Ok(list)
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
