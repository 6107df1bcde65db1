//! Fleet controls on SQLite: the gate of a claim or `lease_lock` of a paused
//! or limited process, and pause / resume.
//!
//! Claims run in one `BEGIN IMMEDIATE` transaction on the one writer
//! connection (and other processes on the same file wait for the write lock),
//! so reading the process row, counting its running keys and claiming cannot
//! interleave with another claim: the count is always current.

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::processes::ensure_process;
use super::rows::to_time;
use super::runs::log_action;
use crate::store::StoreError;
use crate::store::exec::Exec as _;
use crate::store::fleet::{ClaimGate, ProcessPause};
use crate::store::key::validate_process;
use crate::store::rules::gate::{Admission, GateRow};

/// The process row's fleet-control columns, as [`gate_columns!`] lists them.
pub(super) type Columns = (
    bool,
    Option<i64>,
    Option<f64>,
    i64,
    Option<f64>,
    Option<i64>,
);

/// The fleet-control columns of `drover_processes`, in [`Columns`]' order
/// (no other table a claim reads has columns of these names).
macro_rules! gate_columns {
    () => {
        "paused, concurrency, rate_per_s, rate_burst, rate_tokens, rate_tokens_at"
    };
}
pub(super) use gate_columns;

/// How many keys of process `?1` are running: its counts row, kept exact in
/// every write transaction by the triggers and the batch statements
/// ([`counted`](super::counted)). One row read, where counting the running
/// rows cost a gated claim a step per running key.
pub(super) const RUNNING_COUNT: &str = "
SELECT COALESCE((SELECT n FROM drover_item_counts WHERE process = ?1 AND state = 'running'), 0)";

/// Decides how many of `max` keys may start now; `None` for a process that is
/// neither paused nor limited (or unknown), whose claims are not gated.
pub(super) async fn admit(
    tx: &mut Tx,
    now: i64,
    process: &str,
    max: u32,
) -> Result<Option<(GateRow, Admission)>, StoreError> {
    let row: Option<Columns> = sqlx::query_as(concat!(
        "SELECT ",
        gate_columns!(),
        " FROM drover_processes WHERE process = ?1"
    ))
    .bind(process)
    .fetch_optional(&mut **tx)
    .await
    .db()?;
    decide(tx, now, process, row, max).await
}

/// [`admit`] on the process's columns read already (`None`: no process row).
pub(super) async fn decide(
    tx: &mut Tx,
    now: i64,
    process: &str,
    row: Option<Columns>,
    max: u32,
) -> Result<Option<(GateRow, Admission)>, StoreError> {
    let Some((paused, concurrency, rate_per_s, rate_burst, tokens, tokens_at)) = row else {
        return Ok(None);
    };
    let row = GateRow {
        paused,
        concurrency,
        rate_per_s,
        rate_burst,
        tokens,
        tokens_at: tokens_at.map(to_time),
    };
    if !row.binds() {
        return Ok(None);
    }
    let running: i64 = if row.counts_running() {
        sqlx::query_scalar(RUNNING_COUNT)
            .bind(process)
            .fetch_one(&mut **tx)
            .await
            .db()?
    } else {
        0
    };
    Ok(Some((row, row.admit(to_time(now), running, max))))
}

/// Stores what a claim or lock took from the bucket and says what the
/// claimer hears.
pub(super) async fn take(
    tx: &mut Tx,
    process: &str,
    (row, admission): (GateRow, Admission),
    taken: u32,
) -> Result<ClaimGate, StoreError> {
    let (tokens, gate) = row.taken(admission, taken);
    if let Some(tokens) = tokens {
        sqlx::query(
            "UPDATE drover_processes SET rate_tokens = ?2, rate_tokens_at = ?3 WHERE process = ?1",
        )
        .bind(process)
        .bind(tokens)
        .bind(admission.at.timestamp_millis())
        .exec(&mut **tx)
        .await?;
    }
    Ok(gate)
}

/// Pauses or resumes the process, with a history row when it changed.
pub(super) async fn pause(store: &SqliteStore, params: ProcessPause) -> Result<bool, StoreError> {
    validate_process(&params.process)?;
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let changed =
        sqlx::query("UPDATE drover_processes SET paused = ?2 WHERE process = ?1 AND paused <> ?2")
            .bind(&params.process)
            .bind(params.paused)
            .exec(&mut *tx)
            .await?
            > 0;
    if changed {
        let names = (params.process.as_str(), "");
        let action = (params.outcome(), params.actor.as_str());
        log_action(&mut tx, now, names, action, None).await?;
    }
    tx.commit().await.db()?;
    Ok(changed)
}

impl SqliteStore {
    /// Whether `process` is paused: one row read on a reader connection.
    pub(crate) async fn process_paused(&self, process: &str) -> Result<bool, StoreError> {
        let paused: Option<bool> =
            sqlx::query_scalar("SELECT paused FROM drover_processes WHERE process = ?1")
                .bind(process)
                .fetch_optional(&self.pool)
                .await
                .db()?;
        Ok(paused.unwrap_or(false))
    }
}
