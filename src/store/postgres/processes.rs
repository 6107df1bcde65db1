//! Processes on PostgreSQL: made known by their first enqueue, their stored
//! settings changed by `process configure` and read by every node.

use crate::store::exec::Exec as _;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use crate::store::rules::pages;
use crate::store::rules::processes::{
    ProcessSettingsRow, SETTINGS_ONE, SETTINGS_PAGE, bind_configure, checked, configure_update,
};
use crate::store::settings::{ProcessConfigure, ProcessSettings};
use crate::store::{Page, ProcessPage, StoreError};

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

/// A settings row as PostgreSQL keeps it.
type Row = ProcessSettingsRow<DateTime<Utc>>;

/// One page of processes with their settings, in name order.
pub(super) async fn page(
    store: &PostgresStore,
    page: ProcessPage,
) -> Result<Page<ProcessSettings>, StoreError> {
    let mut tx = store.read().await?;
    let rows: Vec<Row> = sqlx::query_as(SETTINGS_PAGE)
        .bind(page.after.unwrap_or_default())
        .bind(pages::read_limit(page.limit))
        .fetch_all(&mut tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    let settings = rows.into_iter().map(Row::into_settings).collect();
    Ok(pages::cut(settings, page.limit, |s: &ProcessSettings| {
        s.process.clone()
    }))
}

/// One process with its settings; `None` if it is unknown.
pub(super) async fn get(
    store: &PostgresStore,
    process: &str,
) -> Result<Option<ProcessSettings>, StoreError> {
    let mut tx = store.read().await?;
    let row: Option<Row> = sqlx::query_as(SETTINGS_ONE)
        .bind(process)
        .fetch_optional(&mut tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    Ok(row.map(Row::into_settings))
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
