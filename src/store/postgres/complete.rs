//! Completing leases on PostgreSQL, set-based. The common run, a clean `done`
//! of a key nobody enqueued meanwhile, is settled by one statement that checks
//! the lease, leaves the item idle and appends the run's history ([`QUICK`]);
//! every other lease goes the general way: one statement locks its running
//! row, [`settle_batch`] decides, one appends the runs' history, one writes the
//! next rows. A batch of hundreds of clean outcomes costs one statement and one
//! commit; any other batch a handful more.

use std::collections::{HashMap, HashSet};

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
use crate::store::rules::parts::{Answers, CompleteOnce, Rest, complete_in_parts};
use crate::store::rules::settle::{NextRow, NextState, Settled};
use crate::store::types::{Outcome, RunOutcome, SessionId};
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

/// The clean `done`s of a batch settled in one statement, each lease given as
/// (`$2` session, `$3` process, `$4` key, `$5` token), at the database clock
/// shifted by the test offset `$1`. A lease qualifies when its session is alive
/// and its key's row is running under that session and token with no enqueue
/// during the run (`dirty_since`), which is all
/// [`settle`](crate::store::rules::settle::settle) looks at for `done`: the row
/// is left idle as [`idle`] leaves it, and the run's history row is written from
/// the running row, in token order. Returns the tokens it settled; the caller
/// settles the other leases the general way, in a transaction of their own.
///
/// The rows are locked in key order (`held`), the order every writer that
/// waits on item rows takes, so this cannot deadlock an enqueue; a lock that
/// had to wait returns the row's newest version, checked again, so a lease
/// reclaimed or a key enqueued meanwhile is not settled here. One statement
/// instead of the general way's five (clock, sessions, locking read, history,
/// update): no row decoded in Rust, no second read of the rows for their
/// history.
const QUICK: &str = "
WITH clock AS (SELECT clock_timestamp() + $1::float8 * interval '1 millisecond' AS now),
held AS MATERIALIZED (
  SELECT i.id, i.process, i.key, i.failures, i.lease_session, i.lease_token,
      i.enqueued_at, i.started_at
  FROM UNNEST($2::bigint[], $3::text[], $4::text[], $5::bigint[]) AS l(session, process, key, token)
  JOIN drover_items i ON i.process = l.process AND i.key = l.key
  WHERE i.state = 'running' AND i.lease_session = l.session AND i.lease_token = l.token
    AND i.dirty_since IS NULL
    AND EXISTS (SELECT 1 FROM drover_sessions s
                WHERE s.id = l.session AND s.deadline > (SELECT now FROM clock))
  ORDER BY i.process, i.key
  FOR UPDATE OF i),
idle AS (
  UPDATE drover_items i SET state = 'idle', ready_at = c.now, failures = 0,
      backoff_until = NULL, backoff_ms = NULL, last_error = NULL, error_signature = NULL,
      lease_session = NULL, lease_token = NULL, started_at = NULL,
      last_outcome = 'done', last_ended_at = c.now
  FROM held h CROSS JOIN clock c
  WHERE i.id = h.id AND i.state = 'running' AND i.lease_session = h.lease_session
    AND i.lease_token = h.lease_token AND i.dirty_since IS NULL
  RETURNING h.process, h.key, h.failures, h.lease_session, h.lease_token, h.enqueued_at,
      h.started_at, c.now),
logged AS (
  INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
      started_at, ended_at)
  SELECT process, key, 'done', failures + 1, lease_session, lease_token, enqueued_at,
      started_at, now
  FROM idle ORDER BY lease_token)
SELECT lease_token FROM idle";

/// The leases of a batch that [`QUICK`] may settle: each clean `done`, at the
/// first position its token has in the batch (a repeat is refused by the
/// general way, which finds the row already idle), sorted by (process, key)
/// as the rows are locked.
#[derive(Debug, Default)]
struct Quick<'a> {
    /// Position in the batch of each token asked.
    first: HashMap<i64, usize>,
    /// (process, key, session, token) of each lease asked.
    leases: Vec<(&'a str, &'a str, i64, i64)>,
}

impl<'a> Quick<'a> {
    fn of(batch: &'a [LeaseComplete<'a>]) -> Self {
        let mut quick = Self::default();
        for (n, params) in batch.iter().enumerate() {
            let lease = params.lease;
            if matches!(params.outcome, Outcome::Done) && !quick.first.contains_key(&lease.token.0)
            {
                quick.first.insert(lease.token.0, n);
                quick
                    .leases
                    .push((&lease.process, &lease.key, lease.session.0, lease.token.0));
            }
        }
        quick.leases.sort_unstable();
        quick
    }

    /// Runs [`QUICK`] in a transaction of its own; the positions in the batch
    /// it settled.
    async fn settle(&self, store: &PostgresStore) -> Result<HashSet<usize>, StoreError> {
        let mut tx = store.begin().await?;
        let leases = &self.leases;
        let tokens: Vec<i64> = sqlx::query_scalar(QUICK)
            .bind(store.clock.offset_ms())
            .bind(leases.iter().map(|l| l.2).collect::<Vec<_>>())
            .bind(leases.iter().map(|l| l.0).collect::<Vec<_>>())
            .bind(leases.iter().map(|l| l.1).collect::<Vec<_>>())
            .bind(leases.iter().map(|l| l.3).collect::<Vec<_>>())
            .fetch_all(&mut tx)
            .await
            .db()?;
        commit(tx).await?;
        Ok(tokens
            .iter()
            .filter_map(|t| self.first.get(t).copied())
            .collect())
    }
}

/// Settles every lease of `batch`: the clean `done`s by [`QUICK`] in one
/// transaction, the rest the general way ([`complete_in_parts`]: split where
/// an outcome's data is refused) in others, as SQLite does. Each transaction
/// locks its rows in key order, which one transaction locking two groups in
/// turn would not. A lease that was lost or whose session expired gets its own
/// error and changes nothing. A failure before anything committed is the
/// batch's; once the clean part has committed, the rest is answered with it.
pub(super) async fn complete_batch(
    store: &PostgresStore,
    batch: &[LeaseComplete<'_>],
) -> Result<Answers, StoreError> {
    let quick = Quick::of(batch);
    let settled = if quick.leases.is_empty() {
        HashSet::new()
    } else {
        retry(store, || quick.settle(store)).await?
    };
    let rest = Rest::of(batch, |n| settled.contains(&n));
    let general = if rest.leases.is_empty() {
        Ok(Vec::new())
    } else {
        complete_in_parts(store, &rest.leases).await
    };
    rest.answer(general)
}

/// Settles `batch` the general way, in one transaction: every lease's row
/// locked and read, [`settle_batch`] deciding.
async fn complete_general(
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
    let settling = settle_batch(now, batch, rows, &expired, |_, row, s| {
        writes.add(row.id, s);
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
    fn add(&mut self, id: i64, settled: Settled) {
        self.runs.push(id, settled.outcome, settled.error);
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
    .execute(&mut *tx)
    .await
    .db()?;
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
            .execute(&mut *tx)
            .await
            .db()?;
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
        retry(self, || complete_general(self, batch)).await
    }

    fn from_data(e: &StoreError) -> bool {
        e.database_code()
            .is_some_and(|code| DATA_ERROR_CLASSES.iter().any(|c| code.starts_with(c)))
    }
}
