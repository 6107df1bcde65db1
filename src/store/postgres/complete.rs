//! Completing leases on PostgreSQL, set-based: one statement locks every lease's
//! running row, one deletes the finished items, one appends the history, so a
//! batch of hundreds of outcomes costs a handful of round trips and one commit.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::retry::retry;
use super::rows::{RunningRow, duration_ms};
use crate::store::StoreError;
use crate::store::holding::{Found, asked_sessions, expired_sessions, match_leases, settle_batch};
use crate::store::params::LeaseComplete;
use crate::store::parts::{Answers, CompleteOnce};
use crate::store::settle::{NextRow, Settled};
use crate::store::types::{Lease, SessionId};
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
const HELD: &str = "
WITH found AS (
  SELECT x.id FROM UNNEST($1::text[], $2::text[]) AS l(process, key)
  CROSS JOIN LATERAL (
    SELECT i.id FROM drover_items i WHERE i.process = l.process AND i.key = l.key LIMIT 1) x)
SELECT i.process, i.key, i.state, i.lease_token, i.lease_session, i.id, i.priority,
    i.failures, i.enqueued_at, i.dirty_since, i.dirty_ready_at, i.dirty_priority,
    p.backoff_initial_ms, p.backoff_factor, p.backoff_max_ms, p.backoff_jitter
FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
WHERE i.id = ANY(ARRAY(SELECT id FROM found))
ORDER BY i.process, i.key
FOR UPDATE OF i";

/// Appends one history row per array element, all at `$1`.
const LOG: &str = "
INSERT INTO drover_history (at, process, key, event, session, token, attempt, error, transient)
SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],
    $7::int[], $8::text[], $9::bool[])";

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
    let now = store.now(&mut *tx).await?;
    let mut writes = Writes::default();
    let settling = settle_batch(now, batch, rows, &expired, |id, lease, s| {
        writes.add(id, lease, s);
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
        .fetch_all(&mut **tx)
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
            .fetch_all(&mut **tx)
            .await
            .db()?;
    let expired = expired_sessions(asked, &live);
    Ok((live, expired))
}

/// What a batch writes: rows to delete, rows to update, history to append.
#[derive(Debug, Default)]
struct Writes {
    deleted: Vec<i64>,
    updated: Vec<(i64, NextRow)>,
    process: Vec<String>,
    key: Vec<String>,
    event: Vec<&'static str>,
    session: Vec<i64>,
    token: Vec<i64>,
    attempt: Vec<i32>,
    error: Vec<Option<String>>,
    transient: Vec<Option<bool>>,
}

impl Writes {
    fn add(&mut self, id: i64, lease: &Lease, settled: Settled) {
        for e in settled.events {
            self.process.push(lease.process.clone());
            self.key.push(lease.key.clone());
            self.event.push(e.kind.as_str());
            self.session.push(lease.session.0);
            self.token.push(lease.token.0);
            self.attempt
                .push(i32::try_from(lease.attempt).unwrap_or(i32::MAX));
            self.error.push(e.error);
            self.transient.push(e.transient);
        }
        match settled.next {
            None => self.deleted.push(id),
            Some(next) => self.updated.push((id, next)),
        }
    }

    async fn flush(self, tx: &mut Tx, now: DateTime<Utc>) -> Result<(), StoreError> {
        if !self.process.is_empty() {
            sqlx::query(LOG)
                .bind(now)
                .bind(&self.process)
                .bind(&self.key)
                .bind(&self.event)
                .bind(&self.session)
                .bind(&self.token)
                .bind(&self.attempt)
                .bind(&self.error)
                .bind(&self.transient)
                .execute(&mut **tx)
                .await
                .db()?;
        }
        if !self.deleted.is_empty() {
            sqlx::query("DELETE FROM drover_items WHERE id = ANY($1)")
                .bind(&self.deleted)
                .execute(&mut **tx)
                .await
                .db()?;
        }
        for (id, next) in &self.updated {
            update(tx, *id, next).await?;
        }
        Ok(())
    }
}

/// Writes an item's next row (pending again, or parked).
async fn update(tx: &mut Tx, id: i64, next: &NextRow) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE drover_items SET state = $2, priority = $3, ready_at = $4, enqueued_at = $5,
             failures = $6, backoff_until = $7, backoff_ms = $8, last_error = $9,
             dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
             lease_session = NULL, lease_token = NULL, started_at = NULL
         WHERE id = $1",
    )
    .bind(id)
    .bind(if next.parked { "parked" } else { "pending" })
    .bind(next.priority)
    .bind(next.ready_at)
    .bind(next.enqueued_at)
    .bind(i32::try_from(next.failures).unwrap_or(i32::MAX))
    .bind(next.backoff_until)
    .bind(next.backoff.map(duration_ms))
    .bind(&next.last_error)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

/// SQLSTATE classes of errors a value can cause: data exception (22: NUL in
/// text, a number out of range), integrity constraint violation (23), program
/// limit exceeded (54: a row too large) and PL/pgSQL's `RAISE` (P0, from a
/// user's trigger). Any other failure is about the database, not one outcome.
const DATA_ERROR_CLASSES: [&str; 4] = ["22", "23", "54", "P0"];

impl CompleteOnce for PostgresStore {
    async fn complete_once(&self, batch: &[LeaseComplete<'_>]) -> Result<Answers, StoreError> {
        retry(|| complete_batch(self, batch)).await
    }

    fn from_data(e: &StoreError) -> bool {
        e.database_code()
            .is_some_and(|code| DATA_ERROR_CLASSES.iter().any(|c| code.starts_with(c)))
    }
}
