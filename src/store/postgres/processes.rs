//! Processes on PostgreSQL: made known by their first enqueue, their stored
//! settings changed by `process configure` and read by every node.

use crate::store::exec::Exec as _;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use crate::store::StoreError;
use crate::store::rules::processes::{
    ProcessSettingsRow, SETTINGS_SELECT, bind_configure, checked, configure_update,
};
use crate::store::settings::{ProcessConfigure, ProcessSettings};

/// `configure`'s statement, written once from the shared column list.
static UPDATE: LazyLock<String> = LazyLock::new(|| configure_update('$'));

/// Writes the settings given, leaving the others as stored.
pub(super) async fn configure(
    store: &PostgresStore,
    params: &ProcessConfigure,
) -> Result<(), StoreError> {
    checked(params)?;
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    bind_configure(sqlx::query(UPDATE.as_str()), params)
        .exec(&mut tx)
        .await?;
    commit(tx).await
}

/// Every known process with its settings.
pub(super) async fn list(store: &PostgresStore) -> Result<Vec<ProcessSettings>, StoreError> {
    let mut tx = store.read().await?;
    let rows: Vec<ProcessSettingsRow<chrono::DateTime<chrono::Utc>>> =
        sqlx::query_as(SETTINGS_SELECT)
            .fetch_all(&mut tx)
            .await
            .db()?;
    tx.commit().await.db()?;
    Ok(rows
        .into_iter()
        .map(ProcessSettingsRow::into_settings)
        .collect())
}

/// Makes a process known (so queries about it are not refused as unknown).
pub(super) async fn ensure_process(
    tx: &mut Tx,
    now: DateTime<Utc>,
    process: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO drover_processes (process, created_at) VALUES ($1, $2)
         ON CONFLICT (process) DO NOTHING",
    )
    .bind(process)
    .bind(now)
    .exec(&mut *tx)
    .await?;
    Ok(())
}
