//! Fleet controls on PostgreSQL: the gate of `lease_lock`, and pause / resume.
//! (The claim of a paused or limited process is one SQL function call, see
//! [`gated`](super::gated), deciding by the same rules.)
//!
//! What serialises two claims or locks of a limited process is the process
//! row's lock, taken first by a statement of its own. Under READ COMMITTED a statement that
//! waited on a row lock re-checks only that row and keeps its old snapshot for
//! everything else, so counting the running keys in the locking statement could
//! miss a claim that committed during the wait and over-admit; here the count
//! is a later statement, whose snapshot is taken after the lock is held and so
//! sees every claim that committed before it.

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::processes::ensure_process;
use super::runs::log_action;
use crate::store::StoreError;
use crate::store::fleet::{ClaimGate, ProcessPause};
use crate::store::key::validate_process;
use crate::store::rules::gate::{Admission, GateRow};

/// The process row's fleet-control columns (`$2`: lock it).
type Columns = (
    bool,
    Option<i32>,
    Option<f64>,
    i32,
    Option<f64>,
    Option<DateTime<Utc>>,
);

/// Reads the process's fleet controls; with `lock`, under the row's lock
/// (held until the transaction ends). `None` for an unknown process.
pub(super) async fn read(
    tx: &mut Tx,
    process: &str,
    lock: bool,
) -> Result<Option<GateRow>, StoreError> {
    let sql = if lock {
        "SELECT paused, concurrency, rate_per_s, rate_burst, rate_tokens, rate_tokens_at
         FROM drover_processes WHERE process = $1 FOR UPDATE"
    } else {
        "SELECT paused, concurrency, rate_per_s, rate_burst, rate_tokens, rate_tokens_at
         FROM drover_processes WHERE process = $1"
    };
    let row: Option<Columns> = sqlx::query_as(sql)
        .bind(process)
        .fetch_optional(&mut *tx)
        .await
        .db()?;
    Ok(row.map(
        |(paused, concurrency, rate_per_s, rate_burst, tokens, tokens_at)| GateRow {
            paused,
            concurrency: concurrency.map(i64::from),
            rate_per_s,
            rate_burst: i64::from(rate_burst),
            tokens,
            tokens_at,
        },
    ))
}

/// Locks the process row and decides how many of `max` keys may start now,
/// `own` of them already running in this transaction (so counted by the
/// running count it reads). Returns the row, the admission, and the clock
/// read after the lock.
pub(super) async fn admit(
    store: &PostgresStore,
    tx: &mut Tx,
    process: &str,
    max: u32,
    own: i64,
) -> Result<(GateRow, Admission), StoreError> {
    let row = read(tx, process, true).await?.unwrap_or_default();
    // Read by one statement that starts after the lock is held, from the item
    // counts (migration 0016): the process's own figure, not a read of the
    // whole fleet's running rows.
    let (now, running): (DateTime<Utc>, i64) = sqlx::query_as(
        "SELECT clock_timestamp() + $2::float8 * interval '1 millisecond',
             CASE WHEN $3 THEN drover_running_count($1) ELSE 0 END",
    )
    .bind(process)
    .bind(store.clock.offset_ms())
    .bind(row.counts_running())
    .fetch_one(&mut *tx)
    .await
    .db()?;
    let admission = row.admit(now, (running - own).max(0), max);
    Ok((row, admission))
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
            "UPDATE drover_processes SET rate_tokens = $2, rate_tokens_at = $3 WHERE process = $1",
        )
        .bind(process)
        .bind(tokens)
        .bind(admission.at)
        .exec(&mut *tx)
        .await?;
    }
    Ok(gate)
}

/// Pauses or resumes the process, with a history row when it changed.
pub(super) async fn pause(
    store: &PostgresStore,
    params: &ProcessPause,
) -> Result<bool, StoreError> {
    validate_process(&params.process)?;
    let (mut tx, now) = store.write().await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let changed =
        sqlx::query("UPDATE drover_processes SET paused = $2 WHERE process = $1 AND paused <> $2")
            .bind(&params.process)
            .bind(params.paused)
            .exec(&mut tx)
            .await?
            > 0;
    if changed {
        let names = (params.process.as_str(), "");
        let action = (params.outcome(), params.actor.as_str());
        log_action(&mut tx, now, names, action, None).await?;
        if !params.paused {
            PostgresStore::notify_ready(&mut tx, &params.process).await?;
        }
    }
    commit(tx).await?;
    Ok(changed)
}

impl PostgresStore {
    /// Whether `process` is paused: one row read.
    pub(crate) async fn process_paused(&self, process: &str) -> Result<bool, StoreError> {
        let mut tx = self.read().await?;
        let paused: Option<bool> =
            sqlx::query_scalar("SELECT paused FROM drover_processes WHERE process = $1")
                .bind(process)
                .fetch_optional(&mut tx)
                .await
                .db()?;
        super::error::commit(tx).await?;
        Ok(paused.unwrap_or(false))
    }
}
