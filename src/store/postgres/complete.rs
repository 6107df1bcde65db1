//! Completing leases on PostgreSQL, set-based: one statement locks every lease's
//! running row, one appends the runs' history, one leaves the converged items
//! idle, so a batch of hundreds of outcomes costs a handful of round trips and
//! one commit.

use crate::store::exec::Exec as _;
use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::retry::retry;
use super::rows::{RunningRow, duration_ms, running_columns};
use super::runs::{Ending, log_runs};
use crate::store::StoreError;
use crate::store::params::LeaseComplete;
use crate::store::rules::holding::{
    Found, asked_sessions, expired_sessions, match_leases, settle_batch,
};
use crate::store::rules::parts::{Answers, CompleteOnce};
use crate::store::rules::settle::{NextRow, NextState, Settled};
use crate::store::types::{RunOutcome, SessionId};
use crate::store::wakeup;

/// Locks the current row of every lease's key, in key order as every writer
/// that waits on item rows does (enqueues sort their batch, reclaims and
/// closes order alike), so none of them can deadlock another; whether the lease still holds it (running, same token and
/// session) is checked on the locked rows by [`held`].
///
/// The shape is chosen so that no statistics can mislead the planner: the keys
/// are found one unique-index probe each (the `LATERAL … LIMIT 1` cannot be
/// flattened into a join), and the rows are locked by primary key. Written as a
/// join on `state = 'running'` and the token, PostgreSQL's estimates — taken
/// when no row was running — made it scan every running row once per lease
/// (O(batch × runs): 25–70 ms for 400 outcomes of 1,024 runs).
const HELD: &str = concat!(
    "
WITH found AS (
  SELECT x.id FROM UNNEST($1::text[], $2::text[]) AS l(process, key)
  CROSS JOIN LATERAL (
    SELECT i.id FROM drover_items i WHERE i.process = l.process AND i.key = l.key LIMIT 1) x)
SELECT i.process, i.key, i.state, i.lease_token, i.lease_session, ",
    running_columns!(),
    "
FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
WHERE i.id = ANY(ARRAY(SELECT id FROM found))
ORDER BY i.process, i.key
FOR UPDATE OF i"
);

/// Settles every lease in one transaction. A lease that was lost or whose
/// session expired gets its own error and changes nothing; the others commit.
/// Any other failure rolls the whole batch back.
pub(super) async fn complete_batch(
    store: &PostgresStore,
    batch: &[LeaseComplete<'_>],
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let (mut tx, now) = store.write().await?;
    let (live, expired) = sessions(&mut tx, now, batch).await?;
    let rows = held(&mut tx, &live, batch).await?;
    // Read after the row locks' wait: the next ready time and any backoff are
    // measured from when they are written.
    let now = store.now(&mut tx).await?;
    let mut writes = Writes::default();
    let settling = settle_batch(now, batch, rows, &expired, |params, row, s| {
        writes.add(row.id, s, params.trace_id.map(|id| id.to_string()));
    });
    writes.flush(&mut tx, now).await?;
    commit(tx).await?;
    for process in settling.ready {
        wakeup::notify(process);
    }
    Ok(settling.results)
}

/// Each lease's locked running row, by position (`None`: not held, see
/// [`match_leases`]).
async fn held(
    tx: &mut Tx,
    live: &[i64],
    batch: &[LeaseComplete<'_>],
) -> Result<Vec<Option<RunningRow>>, StoreError> {
    let leases = || batch.iter().map(|p| p.lease);
    let found: Vec<Found<RunningRow>> = sqlx::query_as(HELD)
        .bind(leases().map(|l| l.process.as_str()).collect::<Vec<_>>())
        .bind(leases().map(|l| l.key.as_str()).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .db()?;
    Ok(match_leases(batch, live, found))
}

/// The batch's sessions split into those alive at `now` and those gone or past
/// their deadline.
async fn sessions(
    tx: &mut Tx,
    now: DateTime<Utc>,
    batch: &[LeaseComplete<'_>],
) -> Result<(Vec<i64>, HashSet<SessionId>), StoreError> {
    let asked = asked_sessions(batch);
    let live: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM drover_sessions WHERE id = ANY($1) AND deadline > $2")
            .bind(&asked)
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .db()?;
    let expired = expired_sessions(asked, &live);
    Ok((live, expired))
}

/// What a batch writes: each run's history row, each item's next row.
#[derive(Debug, Default)]
struct Writes {
    runs: Ending,
    /// Items left idle (a clean `done`, the common run): one statement for all.
    idle: Vec<i64>,
    /// Every other item's next row.
    updated: NextRows,
}

impl Writes {
    fn add(&mut self, id: i64, settled: Settled, trace_id: Option<String>) {
        self.runs
            .push_traced(id, settled.outcome, settled.error, trace_id);
        if settled.next.state == NextState::Idle {
            self.idle.push(id);
        } else {
            self.updated.push(id, settled.outcome, &settled.next);
        }
    }

    async fn flush(self, tx: &mut Tx, now: DateTime<Utc>) -> Result<(), StoreError> {
        log_runs(tx, now, &self.runs).await?;
        if !self.idle.is_empty() {
            idle(tx, now, &self.idle).await?;
        }
        self.updated.write(tx, now).await
    }
}

/// Leaves converged items idle: no lease, no failures, no error; their last
/// outcome `done`. What [`settle`](crate::store::rules::settle::settle) returns for a
/// clean `done`, written for a whole batch at once.
async fn idle(tx: &mut Tx, now: DateTime<Utc>, ids: &[i64]) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE drover_items SET state = 'idle', ready_at = $1, failures = 0,
             backoff_until = NULL, backoff_ms = NULL, last_error = NULL,
             error_signature = NULL,
             lease_session = NULL, lease_token = NULL, started_at = NULL,
             last_outcome = 'done', last_ended_at = $1
         WHERE id = ANY($2)",
    )
    .bind(now)
    .bind(ids)
    .exec(&mut *tx)
    .await?;
    Ok(())
}

/// Writes the next rows of the items that stay pending or parked, one
/// statement for the whole batch (the rows are already locked by [`HELD`]);
/// `$1` is the time their runs ended, the arrays are [`NextRows`]' columns.
const NEXT: &str = "
UPDATE drover_items AS i SET state = n.state, priority = n.priority, ready_at = n.ready_at,
    enqueued_at = n.enqueued_at, failures = n.failures, backoff_until = n.backoff_until,
    backoff_ms = n.backoff_ms, last_error = n.last_error, error_signature = n.error_signature,
    dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
    lease_session = NULL, lease_token = NULL, started_at = NULL,
    last_outcome = n.outcome, last_ended_at = $1
FROM UNNEST($2::bigint[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::timestamptz[], $8::int[], $9::timestamptz[], $10::bigint[], $11::text[],
            $12::text[])
    AS n(id, outcome, state, priority, ready_at, enqueued_at, failures, backoff_until,
         backoff_ms, last_error, error_signature)
WHERE i.id = n.id";

/// The next rows of a batch's items that stay pending or parked, by column.
#[derive(Debug, Default)]
struct NextRows {
    id: Vec<i64>,
    outcome: Vec<&'static str>,
    state: Vec<&'static str>,
    priority: Vec<i32>,
    ready_at: Vec<DateTime<Utc>>,
    enqueued_at: Vec<DateTime<Utc>>,
    failures: Vec<i32>,
    backoff_until: Vec<Option<DateTime<Utc>>>,
    backoff_ms: Vec<Option<i64>>,
    last_error: Vec<Option<String>>,
    error_signature: Vec<Option<String>>,
}

impl NextRows {
    fn push(&mut self, id: i64, outcome: RunOutcome, next: &NextRow) {
        self.id.push(id);
        self.outcome.push(outcome.as_str());
        self.state.push(next.state.as_str());
        self.priority.push(next.priority);
        self.ready_at.push(next.ready_at);
        self.enqueued_at.push(next.enqueued_at);
        self.failures
            .push(i32::try_from(next.failures).unwrap_or(i32::MAX));
        self.backoff_until.push(next.backoff_until);
        self.backoff_ms.push(next.backoff.map(duration_ms));
        self.last_error.push(next.last_error.clone());
        self.error_signature.push(next.error_signature.clone());
    }

    async fn write(self, tx: &mut Tx, now: DateTime<Utc>) -> Result<(), StoreError> {
        if self.id.is_empty() {
            return Ok(());
        }
        sqlx::query(NEXT)
            .bind(now)
            .bind(&self.id)
            .bind(&self.outcome)
            .bind(&self.state)
            .bind(&self.priority)
            .bind(&self.ready_at)
            .bind(&self.enqueued_at)
            .bind(&self.failures)
            .bind(&self.backoff_until)
            .bind(&self.backoff_ms)
            .bind(&self.last_error)
            .bind(&self.error_signature)
            .exec(&mut *tx)
            .await?;
        Ok(())
    }
}

/// SQLSTATE classes of errors a value can cause: data exception (22: NUL in
/// text, a number out of range), integrity constraint violation (23), program
/// limit exceeded (54: a row too large) and PL/pgSQL's `RAISE` (P0, from a
/// user's trigger). Any other failure is about the database, not one outcome.
const DATA_ERROR_CLASSES: [&str; 4] = ["22", "23", "54", "P0"];

impl CompleteOnce for PostgresStore {
    async fn complete_once(&self, batch: &[LeaseComplete<'_>]) -> Result<Answers, StoreError> {
        retry(self, || complete_batch(self, batch)).await
    }

    fn from_data(e: &StoreError) -> bool {
        e.database_code()
            .is_some_and(|code| DATA_ERROR_CLASSES.iter().any(|c| code.starts_with(c)))
    }
}
