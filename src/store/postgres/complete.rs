//! Completing leases on PostgreSQL, set-based: one statement locks every lease's
//! running row, one appends the runs' history, one leaves the converged items
//! idle, so a batch of hundreds of outcomes costs a handful of round trips and
//! one commit.

use crate::store::exec::Exec as _;
use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit, lock_timed_out};
use super::retry::retry;
use super::rows::{LockedRow, duration_ms, running_columns};
use super::runs::{Ending, log_runs};
use super::tid::Tid;
use crate::store::params::LeaseComplete;
use crate::store::rules::holding::{
    Found, Settling, asked_sessions, expired_sessions, match_leases, settle_batch,
};
use crate::store::rules::parts::{Answers, CompleteOnce};
use crate::store::rules::settle::{NextRow, NextState, Settled};
use crate::store::types::{Lease, Outcome, RunOutcome, SessionId};
use crate::store::wakeup;
use crate::store::{DriverError, StoreError};

/// [`HELD`]'s and [`HELD_SKIPPING`]'s statement, locking each row with
/// `$lock`.
macro_rules! held_rows {
    ($lock:literal) => {
        concat!(
            "
SELECT i.ctid::text AS ctid, i.process, i.key, i.state, i.lease_token, i.lease_session, ",
            running_columns!(),
            "
FROM (
  SELECT DISTINCT l.process COLLATE \"C\" AS process, l.key COLLATE \"C\" AS key
  FROM UNNEST($1::text[], $2::text[]) AS l(process, key)
  ORDER BY 1, 2) l
CROSS JOIN LATERAL (
  SELECT j.ctid AS ctid, j.* FROM drover_items j
  WHERE j.process = l.process AND j.key = l.key
  ",
            $lock,
            ") i
LEFT JOIN drover_processes p ON p.process = i.process"
        )
    };
}

/// Locks the current row of every lease's key, in key order as every writer
/// that waits on item rows does (enqueues sort their batch, reclaims and
/// closes order alike), so none of them can deadlock another; whether the lease
/// still holds it (running, same token and session) is checked on the locked
/// rows by [`held`]. Each row comes with its `ctid`, by which the batch's
/// writes find it again ([`Tid`]).
///
/// The shape is chosen so that no statistics can mislead the planner: the
/// distinct keys, sorted (bytewise, as the columns and the enqueues sort
/// them), drive a `LATERAL` subquery that finds and locks one key's row by one
/// primary-key probe. The lateral reference makes it a nested loop over the
/// sorted keys, so the rows are locked in key order whatever is joined after
/// it (the process's policy, one probe per process). Written as a join on
/// `state = 'running'` and the token, PostgreSQL's estimates — taken when no
/// row was running — made it scan every running row once per lease
/// (O(batch × runs): 25–70 ms for 400 outcomes of 1,024 runs).
pub(super) const HELD: &str = held_rows!("FOR UPDATE OF j");

/// [`HELD`], skipping the rows other transactions hold: a batch's first try,
/// and its last after a wait for a held row passed
/// [`STALL`](crate::store::grouped::STALL) (see [`Locks`]).
pub(super) const HELD_SKIPPING: &str = held_rows!("FOR UPDATE OF j SKIP LOCKED");

/// The columns of an item left idle by a clean `done` ended at `$1`: no
/// lease, no failures, no error, its last outcome `done`. What
/// [`settle`](crate::store::rules::settle::settle) returns for one, written
/// by both [`idle`] and [`DONE_AT_ONCE`].
macro_rules! idle_columns {
    () => {
        "state = 'idle', ready_at = $1, failures = 0, backoff_until = NULL, \
         backoff_ms = NULL, last_error = NULL, error_signature = NULL, \
         lease_session = NULL, lease_token = NULL, started_at = NULL, \
         last_outcome = 'done', last_ended_at = $1"
    };
}

/// How a batch locks its rows.
///
/// A batch first skips the rows other transactions hold ([`Locks::Try`]);
/// when it meets none, as nearly always, it settles as it did when it
/// waited. When it meets one, it is rolled back and settled again waiting
/// for such rows, but for [`STALL`](crate::store::grouped::STALL) (100 ms)
/// at most ([`Locks::Wait`]): most are held for a moment (a producer's
/// enqueue of a running key, a claim of another node that met the row just
/// after it was claimed and keeps its lock to the end of its transaction).
/// A row held longer is a caller's transaction that enqueued the running
/// key and has not committed: waiting for it held back every other outcome
/// of the batch (and of every controller writing through the store) for as
/// long as that transaction lasted. Then the batch is settled skipping the
/// rows others hold ([`Locks::Skip`]): those outcomes alone are answered
/// [`StoreError::KeyBusy`], nothing written for them, and their runs send
/// them again; the rest commit. (Waiting first in every batch, a
/// `lock_timeout` set in each transaction, cost a node about 4 % of its
/// drain.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Locks {
    /// Skipping ([`DONE_AT_ONCE_SKIPPING`] for a clean batch, then
    /// [`HELD_SKIPPING`]); when a row is skipped, nothing is written.
    Try,
    /// Waiting ([`DONE_AT_ONCE`], [`HELD`]), in a transaction whose lock
    /// waits end after [`STALL`](crate::store::grouped::STALL).
    Wait,
    /// Skipping ([`HELD_SKIPPING`]), a skipped row's lease answered
    /// [`StoreError::KeyBusy`].
    Skip,
}

/// Settles every lease in one transaction. A lease that was lost or whose
/// session expired gets its own error and changes nothing; one whose row
/// another transaction holds (skipped, with [`Locks::Skip`]) gets
/// [`StoreError::KeyBusy`] and changes nothing; the others commit. Any
/// other failure rolls the whole batch back. `None`: with [`Locks::Try`], a
/// row was skipped, and nothing was written.
///
/// A try that gives up (a row skipped, a lock wait past its bound, a value
/// the database refused) is rolled back before this returns, not as its
/// transaction drops: sqlx sends a dropped transaction's `ROLLBACK` from a
/// task of its own, and until then the try's row locks stand, so the next
/// try could wait on them, or skip them and answer `KeyBusy` for a key
/// nobody else holds.
pub(super) async fn complete_batch(
    store: &PostgresStore,
    batch: &[LeaseComplete<'_>],
    locks: Locks,
) -> Result<Option<Vec<Result<(), StoreError>>>, StoreError> {
    let (mut tx, now) = store.write().await?;
    match write_batch(store, &mut tx, now, batch, locks).await {
        Ok(Some(settling)) => {
            commit(tx).await?;
            for process in settling.ready {
                wakeup::notify(process);
            }
            Ok(Some(settling.results))
        }
        Ok(None) => {
            tx.rollback().await;
            Ok(None)
        }
        Err(e) => {
            // The database answered (a lock wait past its bound, a value
            // it refused, whose batch is written again in halves): the
            // connection is live, and the rollback is one quick round trip.
            if answered(&e) {
                tx.rollback().await;
            }
            Err(e)
        }
    }
}

/// Whether the database itself answered `e` (its connection is live). A
/// lock wait past its bound is [`StoreError::Busy`], not
/// [`StoreError::Database`], and such a try was left to sqlx's rollback of a
/// dropped transaction, which the batch's next try overtook: about one run
/// in fifty of `tests/store_transactions.rs`'s
/// `a_callers_open_transaction_holds_back_the_outcome_of_its_own_key_only`
/// answered `KeyBusy` for a key nobody else held (none in 300 since).
fn answered(e: &StoreError) -> bool {
    matches!(e, StoreError::Busy(DriverError(sqlx::Error::Database(_))))
        || e.database_code().is_some()
}

/// [`complete_batch`]'s writes in `tx`, left for the caller to commit or
/// roll back; `None` as there.
async fn write_batch<'a>(
    store: &PostgresStore,
    tx: &mut Tx,
    now: DateTime<Utc>,
    batch: &[LeaseComplete<'a>],
    locks: Locks,
) -> Result<Option<Settling<'a>>, StoreError> {
    let at_once = match locks {
        Locks::Try => Some(DONE_AT_ONCE_SKIPPING),
        Locks::Wait => Some(DONE_AT_ONCE),
        Locks::Skip => None,
    };
    if let Some(statement) = at_once
        && all_at_once(tx, now, batch, statement).await?
    {
        return Ok(Some(Settling {
            results: batch.iter().map(|_| Ok(())).collect(),
            ready: HashSet::new(),
        }));
    }
    let (live, expired) = sessions(tx, now, batch).await?;
    let Some((rows, busy)) = held(tx, &live, batch, locks).await? else {
        return Ok(None);
    };
    // Read after the row locks' wait: the next ready time and any backoff are
    // measured from when they are written.
    let now = store.now(&mut *tx).await?;
    let mut writes = Writes::default();
    let mut settling = settle_batch(now, batch, rows, &expired, |params, row, s| {
        writes.add(row.ctid, s, params.trace_id.map(|id| id.to_string()));
    });
    busy.answer(batch, &mut settling.results);
    writes.flush(tx, now).await?;
    // A key left pending and ready (a dirty re-run, a requeue without
    // delay) can be claimed now: other nodes' waiters hear it at the commit,
    // as they hear an enqueue (whose own notification came while the key
    // still ran, and woke them for nothing).
    PostgresStore::notify_ready_all(tx, settling.ready.iter().copied()).await?;
    Ok(Some(settling))
}

/// A batch of clean `done`s settled by one statement ([`DONE_AT_ONCE`]),
/// when every outcome is `done` under one session and process and every row
/// turns out clean (running under its lease, no enqueue during the run, the
/// session alive): the common batch, which then takes one statement where
/// the general path takes five (the sessions, the locking read, the clock,
/// the runs, the idle rows). The statement runs inside a savepoint: when it
/// cannot settle every lease, it is rolled back (with the row locks it took)
/// and the caller settles the whole batch the general way, which locks the
/// rows again in the same key order. `true`: all settled; `false`: nothing
/// written.
async fn all_at_once(
    tx: &mut Tx,
    now: DateTime<Utc>,
    batch: &[LeaseComplete<'_>],
    statement: &'static str,
) -> Result<bool, StoreError> {
    let Some(first) = batch.first() else {
        return Ok(false);
    };
    let (session, process) = (first.lease.session, &first.lease.process);
    let clean = batch.iter().all(|p| {
        matches!(p.outcome, Outcome::Done)
            && p.lease.session == session
            && p.lease.process == *process
    });
    if !clean {
        return Ok(false);
    }
    sqlx::query("SAVEPOINT drover_done_at_once")
        .exec(&mut *tx)
        .await?;
    let leases = || batch.iter().map(|p| p.lease);
    let settled: Vec<i64> = sqlx::query_scalar(statement)
        .bind(now)
        .bind(session.0)
        .bind(process)
        .bind(leases().map(|l| l.key.as_str()).collect::<Vec<_>>())
        .bind(leases().map(|l| l.token.0).collect::<Vec<_>>())
        .bind(
            batch
                .iter()
                .map(|p| p.trace_id.map(|id| id.to_string()))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await
        .db()?;
    if settled.len() == batch.len() {
        return Ok(true);
    }
    sqlx::query("ROLLBACK TO SAVEPOINT drover_done_at_once")
        .exec(&mut *tx)
        .await?;
    Ok(false)
}

/// [`DONE_AT_ONCE`]'s and [`DONE_AT_ONCE_SKIPPING`]'s statement, locking each
/// row with `$lock`.
macro_rules! done_at_once {
    ($lock:literal) => {
        concat!(
            "
WITH locked AS MATERIALIZED (
  SELECT x.tid, l.key, l.token, l.trace_id, x.failures, x.enqueued_at, x.started_at
  FROM (
    SELECT DISTINCT ON (1) l.key COLLATE \"C\" AS key, l.token, l.trace_id
    FROM UNNEST($4::text[], $5::bigint[], $6::text[]) AS l(key, token, trace_id)
    ORDER BY 1) l
  CROSS JOIN LATERAL (
    SELECT j.ctid AS tid, j.failures, j.enqueued_at, j.started_at
    FROM drover_items j
    WHERE j.process = $3 AND j.key = l.key AND j.state = 'running'
      AND j.lease_session = $2 AND j.lease_token = l.token AND j.dirty_since IS NULL
    ",
            $lock,
            ") x),
idled AS (
  UPDATE drover_items AS i SET ",
            idle_columns!(),
            "
  WHERE i.ctid = ANY(ARRAY(SELECT tid FROM locked))
    AND EXISTS (SELECT 1 FROM drover_sessions s WHERE s.id = $2 AND s.deadline > $1)
  RETURNING i.process, i.key)
INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
    started_at, ended_at, trace_id)
SELECT d.process, d.key, 'done', k.failures + 1, $2, k.token, k.enqueued_at, k.started_at,
    $1, k.trace_id
FROM idled d JOIN locked k ON k.key = d.key
ORDER BY k.token
RETURNING token"
        )
    };
}

/// [`all_at_once`]'s statement: `$1` the end time, `$2` the session, `$3`
/// the process, `$4`–`$6` each lease's key, token and trace id.
///
/// `locked` takes the row locks, in key order as [`HELD`] takes them: the
/// sorted keys (each once: a key repeated in the batch leaves fewer rows
/// than leases, and the general path answers the repeat) drive a `LATERAL`
/// subquery that finds one key's row by one index probe and locks it if it
/// is still running under the lease and not dirty (PostgreSQL rechecks that
/// on the newest version of a row updated since the statement's snapshot).
/// A locking subquery is never flattened into a join, so it stays one probe
/// per key, in the keys' order, whatever the statistics say; and the `ARRAY`
/// over `locked` is computed before the update reads a row, so every lock is
/// taken before the first write. The update finds its rows by that array
/// alone (a TID scan, which sorts it once), and the runs take each row's
/// lease from `locked` by key. A row whose locked version is newer than the
/// snapshot is not found by its `ctid`, and the caller then settles the
/// batch the general way. The rows left idle are what [`idle`] writes, and
/// their runs are what [`log_runs`] writes. Returns the tokens settled.
///
/// Two earlier shapes were spoiled by plans, both caught by `plans.rs`:
/// the update joined to the sorted keys by lease walked, in the generic plan
/// PostgreSQL switches a prepared statement to after five runs and with
/// statistics taken when no row was running, the session's leases as the
/// outer loop in token order against every key (2,600–2,800 keys/s); joined
/// to `locked` by `ctid` too, it checked each row against the whole array
/// once more (`ExecEvalScalarArrayOp` and `tideq`: 8 % of a drain's CPU).
pub(super) const DONE_AT_ONCE: &str = done_at_once!("FOR UPDATE OF j");

/// [`DONE_AT_ONCE`], skipping the rows other transactions hold (see
/// [`Locks::Try`]).
pub(super) const DONE_AT_ONCE_SKIPPING: &str = done_at_once!("FOR UPDATE OF j SKIP LOCKED");

/// Each lease's locked running row, by position (`None`: not held, see
/// [`match_leases`]), and the keys whose rows [`HELD_SKIPPING`] skipped
/// because another transaction holds them (with [`Locks::Skip`]). `None`
/// when, with [`Locks::Try`], a lease's key had no row locked.
async fn held(
    tx: &mut Tx,
    live: &[i64],
    batch: &[LeaseComplete<'_>],
    locks: Locks,
) -> Result<Option<(Vec<Option<LockedRow>>, Busy)>, StoreError> {
    let leases = || batch.iter().map(|p| p.lease);
    let statement = match locks {
        Locks::Wait => HELD,
        Locks::Try | Locks::Skip => HELD_SKIPPING,
    };
    let found: Vec<Found<LockedRow>> = sqlx::query_as(statement)
        .bind(leases().map(|l| l.process.as_str()).collect::<Vec<_>>())
        .bind(leases().map(|l| l.key.as_str()).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .db()?;
    let busy = match locks {
        // Waiting, a row not found is gone (its lease is lost).
        Locks::Wait => Busy::default(),
        // One row per distinct key: fewer rows than leases is a key skipped
        // or gone (or a lease repeated, which the set tells apart).
        Locks::Try if found.len() < batch.len() && found.len() < distinct_keys(batch) => {
            return Ok(None);
        }
        Locks::Try => Busy::default(),
        Locks::Skip => {
            let locked: HashSet<(&str, &str)> = found
                .iter()
                .map(|f| (f.process.as_str(), f.key.as_str()))
                .collect();
            let unlocked: Vec<&Lease> = leases()
                .filter(|l| !locked.contains(&(l.process.as_str(), l.key.as_str())))
                .collect();
            Busy::among(tx, &unlocked).await?
        }
    };
    Ok(Some((match_leases(batch, live, found), busy)))
}

/// How many distinct keys (process and key) `batch` names.
fn distinct_keys(batch: &[LeaseComplete<'_>]) -> usize {
    batch
        .iter()
        .map(|p| (p.lease.process.as_str(), p.lease.key.as_str()))
        .collect::<HashSet<_>>()
        .len()
}

/// One try of `batch` on `store` with `locks`, retried as `owner`'s
/// operations are (not at all in a group, which steps aside: what failed
/// before its commit runs again on its own). A lock wait given up after
/// [`STALL`](crate::store::grouped::STALL) is `None`, as a skip is.
async fn attempt(
    owner: &PostgresStore,
    store: &PostgresStore,
    batch: &[LeaseComplete<'_>],
    locks: Locks,
) -> Result<Option<Answers>, StoreError> {
    let once = || async move {
        match complete_batch(store, batch, locks).await {
            Err(e) if locks == Locks::Wait && lock_timed_out(&e) => Ok(None),
            other => other,
        }
    };
    if owner.steps_aside {
        once().await
    } else {
        retry(owner, once).await
    }
}

/// The keys of a batch whose rows exist but were held by another
/// transaction when [`HELD_SKIPPING`] skipped them.
#[derive(Debug, Default)]
struct Busy(HashSet<(String, String)>);

impl Busy {
    /// Which of `unlocked` (the leases whose key [`HELD_SKIPPING`] returned
    /// no row for) have a row all the same: skipped as held, where a key with no
    /// row was deleted and its lease is lost. Read without a lock, after
    /// the skip: a holder that committed meanwhile leaves the row (the
    /// outcome is sent again and judged then) or deletes it (lost, as it
    /// would be after the wait). Costs a statement only when a row was
    /// skipped or gone.
    async fn among(tx: &mut Tx, unlocked: &[&Lease]) -> Result<Self, StoreError> {
        if unlocked.is_empty() {
            return Ok(Self::default());
        }
        let present: Vec<(String, String)> = sqlx::query_as(
            "SELECT l.process, l.key FROM UNNEST($1::text[], $2::text[]) AS l(process, key)
             WHERE EXISTS (SELECT 1 FROM drover_items j
                           WHERE j.process = l.process AND j.key = l.key)",
        )
        .bind(
            unlocked
                .iter()
                .map(|l| l.process.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(unlocked.iter().map(|l| l.key.as_str()).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .db()?;
        Ok(Self(present.into_iter().collect()))
    }

    /// Answers [`StoreError::KeyBusy`] in place of "lost" for each lease of
    /// `batch` whose row was skipped: nothing is known of it until the
    /// holder lets go. An expired session's refusal stands, as it does
    /// whatever the row holds.
    fn answer(&self, batch: &[LeaseComplete<'_>], results: &mut [Result<(), StoreError>]) {
        if self.0.is_empty() {
            return;
        }
        for (params, result) in batch.iter().zip(results) {
            let lease = params.lease;
            if matches!(result, Err(StoreError::LeaseLost { .. }))
                && self.0.contains(&(lease.process.clone(), lease.key.clone()))
            {
                *result = Err(StoreError::KeyBusy {
                    process: lease.process.clone(),
                    key: lease.key.clone(),
                });
            }
        }
    }
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
    idle: Vec<Tid>,
    /// Every other item's next row.
    updated: NextRows,
}

impl Writes {
    fn add(&mut self, ctid: Tid, settled: Settled, trace_id: Option<String>) {
        self.runs
            .push_traced(ctid, settled.outcome, settled.error, trace_id);
        if settled.next.state == NextState::Idle {
            self.idle.push(ctid);
        } else {
            self.updated.push(ctid, settled.outcome, &settled.next);
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

/// Leaves converged items idle ([`idle_columns`]), a whole batch at once;
/// the rows `ctids` are locked by [`HELD`], so one TID scan finds them.
async fn idle(tx: &mut Tx, now: DateTime<Utc>, ctids: &[Tid]) -> Result<(), StoreError> {
    sqlx::query(concat!(
        "UPDATE drover_items SET ",
        idle_columns!(),
        " WHERE ctid = ANY(ARRAY(SELECT unnest($2::text[]::tid[])))"
    ))
    .bind(now)
    .bind(ctids)
    .exec(&mut *tx)
    .await?;
    Ok(())
}

/// Writes the next rows of the items that stay pending or parked, one
/// statement for the whole batch (the rows are already locked by [`HELD`], and
/// found by their `ctid`s, see [`Tid`]); `$1` is the time their runs ended, the
/// arrays are [`NextRows`]' columns. Sent unprepared, so each is planned with
/// its batch's size: the rows are hashed and joined to the TID scan; a generic
/// plan, which takes every array for ten elements, joined them by a nested
/// loop that compared each row with every `ctid` of the batch.
const NEXT: &str = "
UPDATE drover_items AS i SET state = n.state, priority = n.priority, ready_at = n.ready_at,
    enqueued_at = n.enqueued_at, failures = n.failures, backoff_until = n.backoff_until,
    backoff_ms = n.backoff_ms, last_error = n.last_error, error_signature = n.error_signature,
    dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
    lease_session = NULL, lease_token = NULL, started_at = NULL,
    last_outcome = n.outcome, last_ended_at = $1
FROM UNNEST($2::text[]::tid[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::timestamptz[], $8::int[], $9::timestamptz[], $10::bigint[], $11::text[],
            $12::text[])
    AS n(ctid, outcome, state, priority, ready_at, enqueued_at, failures, backoff_until,
         backoff_ms, last_error, error_signature)
WHERE i.ctid = ANY(ARRAY(SELECT unnest($2::text[]::tid[]))) AND i.ctid = n.ctid";

/// The next rows of a batch's items that stay pending or parked, by column.
#[derive(Debug, Default)]
struct NextRows {
    ctid: Vec<Tid>,
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
    fn push(&mut self, ctid: Tid, outcome: RunOutcome, next: &NextRow) {
        self.ctid.push(ctid);
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
        if self.ctid.is_empty() {
            return Ok(());
        }
        sqlx::query(NEXT)
            .persistent(false)
            .bind(now)
            .bind(&self.ctid)
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
    /// Skipping held rows; when one was, waiting for them up to `STALL`
    /// (a store stepping aside, made only then); past it, skipping them
    /// with their leases answered `KeyBusy` (see [`Locks`]).
    async fn complete_once(&self, batch: &[LeaseComplete<'_>]) -> Result<Answers, StoreError> {
        if let Some(answers) = attempt(self, self, batch, Locks::Try).await? {
            return Ok(answers);
        }
        let waiting = self.stepping_aside();
        if let Some(answers) = attempt(self, &waiting, batch, Locks::Wait).await? {
            return Ok(answers);
        }
        let answers = attempt(self, self, batch, Locks::Skip).await?;
        Ok(answers.unwrap_or_else(|| unreachable!("skipping, a batch is always settled")))
    }

    fn from_data(e: &StoreError) -> bool {
        e.database_code()
            .is_some_and(|code| DATA_ERROR_CLASSES.iter().any(|c| code.starts_with(c)))
    }

    /// One read of the runs by key (`drover_runs_key`), filtered by token,
    /// session and outcome.
    async fn recorded(
        &self,
        leases: &[(&Lease, RunOutcome)],
    ) -> Result<HashSet<(i64, i64, String)>, StoreError> {
        let mut tx = self.read().await?;
        let each = |f: fn(&(&Lease, RunOutcome)) -> i64| leases.iter().map(f).collect::<Vec<_>>();
        let tokens: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT r.token, r.session, r.outcome
             FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])
                 AS l(process, key, token, session, outcome)
             JOIN drover_runs r ON r.process = l.process AND r.key = l.key
                 AND r.token = l.token AND r.session = l.session AND r.outcome = l.outcome",
        )
        .bind(
            leases
                .iter()
                .map(|(l, _)| l.process.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            leases
                .iter()
                .map(|(l, _)| l.key.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(each(|(l, _)| l.token.0))
        .bind(each(|(l, _)| l.session.0))
        .bind(leases.iter().map(|(_, o)| o.as_str()).collect::<Vec<_>>())
        .fetch_all(&mut tx)
        .await
        .db()?;
        tx.commit().await.db()?;
        Ok(tokens.into_iter().collect())
    }
}
