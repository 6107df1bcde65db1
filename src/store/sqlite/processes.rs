//! Processes on SQLite: made known by their first enqueue, their stored
//! settings changed by `process configure` and read by every node.

use crate::store::exec::Exec as _;
use std::sync::LazyLock;

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

/// Every known process with its settings.
pub(super) async fn list(store: &SqliteStore) -> Result<Vec<ProcessSettings>, StoreError> {
    let rows: Vec<ProcessSettingsRow<i64>> = sqlx::query_as(SETTINGS_SELECT)
        .fetch_all(&store.pool)
        .await
        .db()?;
    Ok(rows
        .into_iter()
        .map(ProcessSettingsRow::into_settings)
        .collect())
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
