//! Making a process known on PostgreSQL. (The enqueue itself is in
//! `enqueue.rs`, its settings in `processes.rs`.)

use chrono::{DateTime, Utc};

use super::engine::Tx;
use super::error::Db as _;
use crate::store::StoreError;

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
    .execute(&mut *tx)
    .await
    .db()?;
    Ok(())
}
