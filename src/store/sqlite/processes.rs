//! Processes on SQLite: made known by their first enqueue, their stored
//! settings changed by `process configure` and read by every node.

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use crate::store::StoreError;
use crate::store::params::ProcessConfigure;
use crate::store::rules::processes::{
    ProcessSettingsRow, bind_configure, checked, settings_columns,
};
use crate::store::types::ProcessSettings;

/// Writes the settings given, leaving the others as stored.
pub(super) async fn configure(
    store: &SqliteStore,
    params: ProcessConfigure,
) -> Result<(), StoreError> {
    checked(&params)?;
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let update = sqlx::query(
        "UPDATE drover_processes SET
             backoff_initial_ms = COALESCE(?2, backoff_initial_ms),
             backoff_factor = COALESCE(?3, backoff_factor),
             backoff_max_ms = COALESCE(?4, backoff_max_ms),
             backoff_jitter = COALESCE(?5, backoff_jitter),
             keep_runs_ms = COALESCE(?6, keep_runs_ms),
             keep_runs_per_key = COALESCE(?7, keep_runs_per_key),
             forget_idle_ms = CASE WHEN ?8 THEN ?9 ELSE forget_idle_ms END,
             resync_every_ms = CASE WHEN ?10 THEN ?11 ELSE resync_every_ms END,
             resync_jitter = COALESCE(?12, resync_jitter),
             resync_priority = COALESCE(?13, resync_priority),
             concurrency = CASE WHEN ?14 THEN ?15 ELSE concurrency END,
             rate_per_s = CASE WHEN ?16 THEN ?17 ELSE rate_per_s END,
             rate_burst = COALESCE(?18, rate_burst),
             rate_tokens = CASE WHEN ?19 THEN NULL ELSE rate_tokens END
         WHERE process = ?1",
    );
    bind_configure(update, &params)
        .execute(&mut *tx)
        .await
        .db()?;
    tx.commit().await.db()?;
    Ok(())
}

/// Every known process with its settings.
pub(super) async fn list(store: &SqliteStore) -> Result<Vec<ProcessSettings>, StoreError> {
    let rows: Vec<ProcessSettingsRow<i64>> = sqlx::query_as(concat!(
        "SELECT ",
        settings_columns!(),
        " FROM drover_processes p LEFT JOIN drover_resync r ON r.process = p.process
         ORDER BY p.process"
    ))
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
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}
