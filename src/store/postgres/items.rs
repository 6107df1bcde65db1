//! Processes on PostgreSQL: making one known, configuring its backoff. (The
//! enqueue itself is in `enqueue.rs`.)

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::key::validate_process;
use crate::store::params::ProcessConfigure;

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
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

pub(super) async fn configure(
    store: &PostgresStore,
    params: &ProcessConfigure,
) -> Result<(), StoreError> {
    validate_process(&params.process)?;
    let b = params.backoff;
    let (mut tx, now) = store.write().await?;
    sqlx::query(
        "INSERT INTO drover_processes (process, backoff_initial_ms, backoff_factor,
             backoff_max_ms, backoff_jitter, created_at) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (process) DO UPDATE SET backoff_initial_ms = EXCLUDED.backoff_initial_ms,
             backoff_factor = EXCLUDED.backoff_factor, backoff_max_ms = EXCLUDED.backoff_max_ms,
             backoff_jitter = EXCLUDED.backoff_jitter",
    )
    .bind(&params.process)
    .bind(duration_ms(b.initial()))
    .bind(b.factor())
    .bind(duration_ms(b.max()))
    .bind(b.jitter())
    .bind(now)
    .execute(&mut *tx)
    .await
    .db()?;
    commit(tx).await?;
    Ok(())
}
