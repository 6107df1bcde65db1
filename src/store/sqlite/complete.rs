//! Completing leases on SQLite, set-based: one statement finds the leases whose
//! clean `done` needs nothing from their rows ([`QUICK`]), one reads the running
//! rows of the others, one appends the runs' history, one leaves the converged
//! items idle, all in one `BEGIN IMMEDIATE` transaction, so a batch costs a
//! handful of statements and one commit however many outcomes it carries.

use crate::store::exec::Exec as _;
use std::collections::{HashMap, HashSet};
use std::io::Write as _;

use serde_json::{Value, json};
use sqlx::Row as _;

use super::completions;
use super::counted;
use super::engine::{SqliteStore, Tx, begin_immediate, clock_ms};
use super::error::Db as _;
use super::rows::{RunningRow, duration_ms, json_rows, running_columns, to_ms, to_time};
use super::runs::{log_from_rows, log_from_rows_sql, log_with_errors};
use super::savepoints::{on_its_own, release, savepoint};
use super::trace;
use super::writer::{SqliteQuery, padded};
use crate::store::StoreError;
use crate::store::params::LeaseComplete;
use crate::store::rules::decode::corrupt;
use crate::store::rules::holding::{
    Found, asked_sessions, expired_sessions, match_leases, settle_batch,
};
use crate::store::rules::parts::{Answers, CompleteOnce};
use crate::store::rules::settle::{NextRow, NextState, Settled};
use crate::store::types::{Lease, Outcome, RunOutcome, SessionId};
use crate::store::wakeup;

/// The running rows leased to the live sessions in `?1` under the tokens in
/// `?2` (both JSON arrays of integers): one probe of the `(lease_session,
/// lease_token)` index per lease, with no JSON to pick apart per row. Whether
/// each row is its lease's is decided by [`match_leases`].
pub(super) const HELD: &str = concat!(
    "SELECT i.process, i.key, i.state, i.lease_token, i.lease_session, ",
    running_columns!(),
    " FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
WHERE i.state = 'running' AND i.lease_session IN (SELECT value FROM json_each(?1))
    AND i.lease_token IN (SELECT value FROM json_each(?2))"
);

/// Settles every lease in one transaction. A lease that was lost or whose
/// session expired gets its own error and changes nothing; the others commit.
/// Any other failure rolls the whole batch back.
///
/// The common run, a clean `done` of a key nobody enqueued meanwhile, is
/// settled without reading its row ([`QUICK`]); every other lease goes the
/// general way: its running row is read and [`settle_batch`] decides.
pub(super) async fn complete_batch(
    store: &SqliteStore,
    batch: &[LeaseComplete<'_>],
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let Some(clean) = Clean::of(batch) else {
        return complete_general(store, batch, QuickRead::Try).await;
    };
    let settled = settled_tokens(&completions::clean(store, clean).await?)?;
    let rest: Vec<usize> = (0..batch.len())
        .filter(|&n| !settled.contains(&batch[n].lease.token.0))
        .collect();
    let mut answers: Vec<Result<(), StoreError>> = batch.iter().map(|_| Ok(())).collect();
    if rest.is_empty() {
        return Ok(answers);
    }
    let general: Vec<LeaseComplete<'_>> = rest.iter().map(|&n| batch[n]).collect();
    // What the one trip did not settle would not qualify for QUICK either.
    match complete_general(store, &general, QuickRead::Skip).await {
        Ok(got) => {
            for (n, answer) in rest.into_iter().zip(got) {
                answers[n] = answer;
            }
        }
        // Nothing was written: the caller may split the batch or retry it.
        Err(e) if settled.is_empty() => return Err(e),
        // The clean part has committed: the rest is answered with the error.
        Err(e) => {
            for n in rest {
                answers[n] = Err(e.duplicate());
            }
        }
    }
    Ok(answers)
}

/// The common batch, settled in one trip to the connection's thread
/// ([`ONE_TRIP`]): clean `done`s, all of one session and one process, no
/// lease twice.
#[derive(Debug, Clone)]
pub(super) struct Clean {
    /// How many leases.
    count: usize,
    session: i64,
    process: String,
    /// `{"token": "key", …}`: one JSON object, whose labels and values
    /// `json_each` hands over as they are, where an array of `[token, key]`
    /// pairs would be parsed again for each field.
    leases: String,
}

impl Clean {
    /// The batch as [`ONE_TRIP`] takes it, if it is the common one.
    fn of(batch: &[LeaseComplete<'_>]) -> Option<Self> {
        let first = batch.first()?.lease;
        let mut tokens = HashSet::with_capacity(batch.len());
        let mut leases = Vec::with_capacity(batch.len() * 24);
        leases.push(b'{');
        for params in batch {
            let lease = params.lease;
            // A traced run's trace id is written with its row, the general way.
            let common = matches!(params.outcome, Outcome::Done)
                && params.trace_id.is_none()
                && lease.session == first.session
                && lease.process == first.process
                && tokens.insert(lease.token.0);
            if !common {
                return None;
            }
            if leases.len() > 1 {
                leases.push(b',');
            }
            write!(leases, "\"{}\":", lease.token.0).ok()?;
            serde_json::to_writer(&mut leases, &lease.key).ok()?;
        }
        leases.push(b'}');
        Some(Self {
            count: batch.len(),
            session: first.session.0,
            process: first.process.clone(),
            leases: String::from_utf8(leases).ok()?,
        })
    }

    /// How many leases the batch holds.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Runs [`ONE_TRIP`] in a transaction of its own; returns the tokens it
    /// settled, as JSON.
    pub(super) async fn write(&self, store: &SqliteStore) -> Result<String, StoreError> {
        let (settled,): (String,) = on_its_own(store, self, ONE_TRIP, Self::bind).await?;
        Ok(settled)
    }

    /// `query` ([`ONE_TRIP`] or [`ONE_TRIP_IN_GROUP`]) with this batch's
    /// arguments.
    pub(super) fn bind<'q>(
        store: &SqliteStore,
        batch: &'q Self,
        query: SqliteQuery<'q>,
    ) -> SqliteQuery<'q> {
        query
            .bind(store.clock().offset_ms())
            .bind(batch.session)
            .bind(batch.process.as_str())
            .bind(batch.leases.as_str())
    }
}

/// The tokens a [`ONE_TRIP`] settled, from its JSON answer.
fn settled_tokens(settled: &str) -> Result<HashSet<i64>, StoreError> {
    let settled: Vec<i64> = json_rows(settled, "a completion's settled tokens")?;
    Ok(settled.into_iter().collect())
}

/// A batch of clean `done`s of session `?2` and process `?3` (`?4`: a JSON
/// object of their keys by lease token) at the database clock shifted by the
/// test offset `?1`, settled in one trip: each lease whose row is running
/// under that session and token, for that key and process, with no enqueue
/// during the run, while the session is alive, gets its run row; then the
/// tokens of the runs just written (the rows after `last_insert_rowid() -
/// changes()`, consecutive, as one statement inserts them) are read back,
/// those items are left idle and the counts moved by as many (`changes()`
/// again), and the transaction commits. The leases it did not settle go the
/// general way.
pub(super) const ONE_TRIP: &str = concat!(begin_immediate!(), one_trip_sql!(), "COMMIT");

/// [`ONE_TRIP`] for one batch of several in one transaction
/// ([`completions`](super::completions)): the same statements in a savepoint
/// of their own, so that a batch that fails takes back its own writes alone.
pub(super) const ONE_TRIP_IN_GROUP: &str = concat!(savepoint!(), one_trip_sql!(), release!());

/// [`ONE_TRIP`]'s statements, each ending with `;`, without its `BEGIN` and
/// `COMMIT`.
macro_rules! one_trip_sql {
    () => { concat!(
    "INSERT INTO drover_runs (process, key, outcome, attempt, session, token,
    pending_since, started_at, ended_at)
SELECT i.process, i.key, 'done', i.failures + 1, i.lease_session, i.lease_token,
    i.enqueued_at, i.started_at, t.now
FROM (SELECT ",
    clock_ms!(),
    " + ?1 AS now) AS t
    CROSS JOIN json_each(?4) AS j
    CROSS JOIN drover_items AS i
        ON i.lease_session = ?2 AND i.lease_token = CAST(j.key AS INTEGER)
WHERE i.state = 'running' AND +i.process = ?3 AND i.dirty_since IS NULL AND i.key = j.value
    AND EXISTS (SELECT 1 FROM drover_sessions WHERE id = ?2 AND deadline > t.now)
ORDER BY i.lease_token;
SELECT json_group_array(token) FROM drover_runs
WHERE changes() > 0 AND id > last_insert_rowid() - changes();
",
    idle_sql!("(SELECT ended_at FROM drover_runs WHERE id = last_insert_rowid())"),
    "state = 'running' AND lease_session = ?2 AND +process = ?3 AND lease_token IN
    (SELECT token FROM drover_runs WHERE changes() > 0 AND id > last_insert_rowid() - changes());
",
    counted::shift_sql!("?3", "'running'", "'idle'", "changes()"),
    ";\n"
    ) };
}
use one_trip_sql;

/// Settles `batch` the general way: every lease's row read, [`settle_batch`]
/// deciding, one transaction.
async fn complete_general(
    store: &SqliteStore,
    batch: &[LeaseComplete<'_>],
    quick_read: QuickRead,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let mut tx = store.lock().await?;
    let asked = Asked::of(batch, quick_read);
    let (now, live, expired, first) = opening(&mut tx, store.clock().offset_ms(), &asked).await?;
    let mut writes = Writes::default();
    let mut answers: Vec<Option<Result<(), StoreError>>> = batch.iter().map(|_| None).collect();
    let quick = quick(&mut tx, &live, batch, asked, first).await?;
    let mut rest = Vec::new();
    for (n, params) in batch.iter().enumerate() {
        match quick.get(&params.lease.token.0) {
            Some(&(first, id)) if first == n => {
                writes.done(&params.lease.process, id);
                answers[n] = Some(Ok(()));
            }
            // A repeat of a lease settled above: refused, as a repeat is.
            Some(_) => answers[n] = Some(Err(StoreError::lease_lost(params.lease))),
            None => rest.push(n),
        }
    }
    let general: Vec<LeaseComplete<'_>> = rest.iter().map(|&n| batch[n]).collect();
    let rows = held(&mut tx, &live, &general).await?;
    let settling = settle_batch(to_time(now), &general, rows, &expired, |params, row, s| {
        writes.add(&params.lease.process, row.id, s);
    });
    for (n, answer) in rest.into_iter().zip(settling.results) {
        answers[n] = Some(answer);
    }
    let traced = trace::trace_ids(batch, &answers);
    writes.flush_and_commit(tx, now, traced).await?;
    for process in settling.ready {
        wakeup::notify(process);
    }
    Ok(answers
        .into_iter()
        .map(|a| a.expect("each lease is answered quickly or settled"))
        .collect())
}

/// The running rows that clean `done` outcomes leave idle as they are: `?1` is
/// a JSON array of lease tokens of session `?2` and process `?3`, and a row is
/// listed, as `[token, id, key]` in one JSON array ([`json_rows`] says why one
/// value), when it is running under that token and session, for that process,
/// with no enqueue during the run (`dirty_since`), which is all
/// [`settle`](crate::store::rules::settle::settle) looks at for `done`; the caller
/// checks the key and that the session is alive. One probe of the lease index
/// per token (the `CROSS JOIN` keeps the array outside), and an array of plain
/// integers: with each lease passed as a `[token, session, process, key]`
/// array, SQLite turned every element back into text and parsed it again for
/// each field (about 9 % of a burn-down's instructions,
/// `scripts/bare/instructions.sh`).
pub(super) const QUICK: &str = quick_sql!("?1", "?2", "?3");

/// [`QUICK`]'s text with its three parameters named by the caller, so that it
/// can follow [`OPENING`] in one query ([`OPENING_QUICK`]), whose parameters
/// are numbered across its statements.
macro_rules! quick_sql {
    ($tokens:literal, $session:literal, $process:literal) => {
        concat!(
            "SELECT json_group_array(json_array(i.lease_token, i.id, i.key))
FROM json_each(",
            $tokens,
            ") AS j CROSS JOIN drover_items AS i
    ON i.lease_session = ",
            $session,
            " AND i.lease_token = j.value
WHERE i.state = 'running' AND +i.process = ",
            $process,
            " AND i.dirty_since IS NULL"
        )
    };
}
use quick_sql;

/// What a batch asks of [`QUICK`]: each lease's first position in the batch,
/// by token, and the tokens of its clean `done`s by session and process (one
/// group in the common batch).
struct Asked<'a> {
    sessions: Vec<i64>,
    first: HashMap<i64, usize>,
    groups: Vec<((i64, &'a str), Vec<i64>)>,
}

/// Whether the general way looks for clean `done`s to settle without their
/// rows ([`QUICK`]): not for the leases [`ONE_TRIP`] left, which it already
/// looked for with the same conditions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QuickRead {
    Try,
    Skip,
}

impl<'a> Asked<'a> {
    fn of(batch: &'a [LeaseComplete<'a>], quick_read: QuickRead) -> Self {
        let mut first = HashMap::with_capacity(batch.len());
        let mut groups: HashMap<(i64, &str), Vec<i64>> = HashMap::new();
        for (n, params) in batch.iter().enumerate() {
            let lease = params.lease;
            let seen = first.contains_key(&lease.token.0);
            first.entry(lease.token.0).or_insert(n);
            if !seen && quick_read == QuickRead::Try && matches!(params.outcome, Outcome::Done) {
                let group = (lease.session.0, lease.process.as_str());
                groups.entry(group).or_default().push(lease.token.0);
            }
        }
        Self {
            sessions: asked_sessions(batch),
            first,
            groups: groups.into_iter().collect(),
        }
    }
}

/// The leases of `batch` that [`QUICK`] settles: each clean `done` of a live
/// session, at the first position its token has in the batch, by token:
/// (that position, the row's id). A lease that does not qualify (its row was
/// lost, re-enqueued during the run, its key or process differ) is not here
/// and goes the general way, which decides it with the full row. `first` is
/// what [`opening`] read for the first group.
async fn quick(
    tx: &mut Tx,
    live: &[i64],
    batch: &[LeaseComplete<'_>],
    asked: Asked<'_>,
    mut first: Option<String>,
) -> Result<HashMap<i64, (usize, i64)>, StoreError> {
    let mut quick = HashMap::with_capacity(batch.len());
    for ((session, process), tokens) in asked.groups {
        let found = match first.take() {
            Some(found) => found,
            None if !live.contains(&session) => continue,
            None => sqlx::query_scalar(QUICK)
                .bind(Value::from(tokens).to_string())
                .bind(session)
                .bind(process)
                .fetch_one(&mut **tx)
                .await
                .db()?,
        };
        if !live.contains(&session) {
            continue;
        }
        let found: Vec<(i64, i64, String)> = json_rows(&found, "a completion's quick rows")?;
        for (token, id, key) in found {
            if let Some(&n) = asked.first.get(&token)
                && batch[n].lease.key == key
            {
                quick.insert(token, (n, id));
            }
        }
    }
    Ok(quick)
}

/// Each lease's running row, by position (`None`: not held, see
/// [`match_leases`]).
async fn held(
    tx: &mut Tx,
    live: &[i64],
    batch: &[LeaseComplete<'_>],
) -> Result<Vec<Option<RunningRow>>, StoreError> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let tokens: Vec<i64> = batch.iter().map(|p| p.lease.token.0).collect();
    let found: Vec<Found<RunningRow>> = sqlx::query_as(HELD)
        .bind(Value::from(live).to_string())
        .bind(Value::from(tokens).to_string())
        .fetch_all(&mut **tx)
        .await
        .db()?;
    Ok(match_leases(batch, live, found))
}

/// The database clock shifted by the test offset `?1`, and each session in
/// `?2` (a JSON array) that is alive then: one statement, the completion's
/// first (see [`OPENING`](super::leases::OPENING)), with one row for the
/// clock when none is.
pub(super) const OPENING: &str = concat!(begin_immediate!(), opening_sql!());

/// [`OPENING`]'s text, after its `BEGIN`.
macro_rules! opening_sql {
    () => {
        concat!(
            "WITH t(now) AS (SELECT ",
            clock_ms!(),
            " + ?1)
SELECT t.now, s.id FROM t LEFT JOIN drover_sessions s
    ON s.id IN (SELECT value FROM json_each(?2)) AND s.deadline > t.now"
        )
    };
}
use opening_sql;

/// [`OPENING`], then [`QUICK`] for one group of clean `done`s, in one trip to
/// the connection's thread: [`QUICK`] does not depend on what [`OPENING`]
/// reads (the caller drops its rows if their session is not alive).
pub(super) const OPENING_QUICK: &str = concat!(
    begin_immediate!(),
    opening_sql!(),
    ";\n",
    quick_sql!("?3", "?4", "?5")
);

/// The time the batch is written at, its sessions split into those alive
/// then and those gone or past their deadline, and [`QUICK`]'s answer for
/// the batch's first group of clean `done`s, if it has one.
async fn opening(
    tx: &mut Tx,
    offset_ms: i64,
    asked: &Asked<'_>,
) -> Result<(i64, Vec<i64>, HashSet<SessionId>, Option<String>), StoreError> {
    let sessions = Value::from(asked.sessions.as_slice()).to_string();
    let rows = match asked.groups.first() {
        Some(((session, process), tokens)) => sqlx::query(OPENING_QUICK)
            .bind(offset_ms)
            .bind(sessions)
            .bind(Value::from(tokens.as_slice()).to_string())
            .bind(*session)
            .bind(*process),
        None => sqlx::query(OPENING).bind(offset_ms).bind(sessions),
    };
    let rows = padded(rows).fetch_all(&mut **tx).await.db()?;
    let mut now = None;
    let mut live = Vec::new();
    let mut found = None;
    // OPENING's rows have two columns (the clock, a live session or NULL),
    // QUICK's one row one (its JSON array).
    for row in rows {
        if row.len() == 1 {
            found = Some(row.try_get::<String, _>(0).db()?);
        } else {
            now = Some(row.try_get::<i64, _>(0).db()?);
            live.extend(row.try_get::<Option<i64>, _>(1).db()?);
        }
    }
    let now = now.ok_or_else(|| corrupt("the completion's opening read no clock".to_owned()))?;
    let expired = expired_sessions(asked.sessions.clone(), &live);
    Ok((now, live, expired, found))
}

/// What a batch writes: each run's history row, each item's next row.
#[derive(Debug, Default)]
struct Writes<'a> {
    /// Runs that end with no error, by outcome: logged from their rows
    /// ([`log_from_rows`]) before those change.
    plain: HashMap<RunOutcome, Vec<i64>>,
    /// Runs that end with an error, as `[id, outcome, error]`.
    failed: Vec<Value>,
    /// Items left idle (a clean `done`, the common run), by process: one
    /// statement for each process's, counted once ([`counted`]).
    idle: HashMap<&'a str, Vec<i64>>,
    /// Every other item's next row, as `[id, outcome, state, priority,
    /// ready_at, enqueued_at, failures, backoff_until, backoff_ms, last_error,
    /// error_signature]`
    /// for [`NEXT`].
    updated: Vec<Value>,
}

impl<'a> Writes<'a> {
    /// A clean `done` of a key nobody enqueued during its run: its run row,
    /// and the item left idle.
    fn done(&mut self, process: &'a str, id: i64) {
        self.plain.entry(RunOutcome::Done).or_default().push(id);
        self.idle.entry(process).or_default().push(id);
    }

    fn add(&mut self, process: &'a str, id: i64, settled: Settled) {
        match settled.error {
            None => self.plain.entry(settled.outcome).or_default().push(id),
            Some(error) => self
                .failed
                .push(json!([id, settled.outcome.as_str(), error])),
        }
        if settled.next.state == NextState::Idle {
            self.idle.entry(process).or_default().push(id);
        } else {
            self.updated
                .push(next_row(id, settled.outcome, &settled.next));
        }
    }

    /// Writes the batch and commits: in one trip when the batch is the
    /// common one, clean `done`s of one process only ([`CLEAN`]), and
    /// untraced; `traced` is what [`trace::trace_ids`] found.
    async fn flush_and_commit(
        self,
        mut tx: Tx,
        now: i64,
        traced: Option<String>,
    ) -> Result<(), StoreError> {
        if let Some(traced) = traced {
            self.flush(&mut tx, now).await?;
            trace::keep_trace_ids(&mut tx, now, &traced).await?;
            return tx.commit().await.db();
        }
        // Clean: every run's row logged as `done` and every item left idle,
        // the same ids, all of one process.
        if self.failed.is_empty()
            && self.updated.is_empty()
            && self.plain.len() == 1
            && self.idle.len() == 1
            && let Some((&process, ids)) = self.idle.iter().next()
            && self.plain.get(&RunOutcome::Done) == Some(ids)
        {
            let ids = Value::from(ids.as_slice()).to_string();
            return tx
                .commit_with(CLEAN, |query| query.bind(now).bind(ids).bind(process))
                .await
                .db();
        }
        self.flush(&mut tx, now).await?;
        tx.commit().await.db()
    }

    /// Writes the batch's runs in one statement, in their leases' order (by
    /// token) as PostgreSQL does, and the items' next rows. Runs of one
    /// outcome and no error are logged from their rows alone; a mix goes
    /// into one [`log_with_errors`]: written one statement per outcome, the
    /// runs of one batch, which end at the same instant, came in the history
    /// grouped by outcome in a hash map's order, failures last.
    async fn flush(self, tx: &mut Tx, now: i64) -> Result<(), StoreError> {
        if self.failed.is_empty() && self.plain.len() <= 1 {
            for (outcome, ids) in self.plain {
                log_from_rows(tx, now, outcome, &Value::from(ids).to_string()).await?;
            }
        } else {
            let mut runs = self.failed;
            for (outcome, ids) in self.plain {
                runs.extend(
                    ids.into_iter()
                        .map(|id| json!([id, outcome.as_str(), null])),
                );
            }
            log_with_errors(tx, now, runs).await?;
        }
        for (process, ids) in self.idle {
            idle(tx, now, process, &Value::from(ids).to_string()).await?;
        }
        if !self.updated.is_empty() {
            sqlx::query(NEXT)
                .bind(now)
                .bind(Value::from(self.updated).to_string())
                .exec(&mut **tx)
                .await?;
        }
        Ok(())
    }
}

/// Leaves the running items of process `?3` whose ids are in `?2` (a JSON
/// array) idle at `?1`, marked as counted by the statement ([`counted`]); the
/// unary `+` keeps each row found by its id (see [`START`](super::leases::START)).
pub(super) const IDLE: &str = idle_by_ids!();

/// [`IDLE`]'s text.
macro_rules! idle_by_ids {
    () => {
        concat!(
            idle_sql!("?1"),
            "id IN (SELECT value FROM json_each(?2)) AND +state = 'running' AND +process = ?3"
        )
    };
}
use idle_by_ids;

/// [`IDLE`]'s text up to its `WHERE`, with the time given by the caller (a
/// parameter or an expression); the caller's condition follows, and must
/// name the rows' old state, `running` ([`counted`]).
macro_rules! idle_sql {
    ($now:literal) => {
        concat!(
            "UPDATE drover_items SET state = 'idle', ready_at = ",
            $now,
            ", failures = 0,
    backoff_until = NULL, backoff_ms = NULL, last_error = NULL, error_signature = NULL,
    lease_session = NULL, lease_token = NULL, started_at = NULL,
    last_outcome = 'done', last_ended_at = ",
            $now,
            ", counts_mark = counts_mark + 1
WHERE "
        )
    };
}
use idle_sql;

/// A batch of clean `done`s of process `?3` (item ids in `?2`, a JSON array),
/// ended at `?1`, written and committed in one trip: their runs, the items left
/// idle ([`IDLE`]), the counts moved by as many rows as that changed
/// (`changes()`, read before the counts' own update completes), `COMMIT`.
pub(super) const CLEAN: &str = concat!(
    log_from_rows_sql!("'done'", "?2"),
    ";\n",
    idle_by_ids!(),
    ";\n",
    counted::shift_sql!("?3", "'running'", "'idle'", "changes()"),
    ";\nCOMMIT"
);

/// Leaves converged items of `process` idle: no lease, no failures, no error;
/// their last outcome `done`. What [`settle`](crate::store::rules::settle::settle)
/// returns for a clean `done`, written for a whole batch at once and counted
/// once ([`counted`]): only running rows change.
async fn idle(tx: &mut Tx, now: i64, process: &str, ids: &str) -> Result<(), StoreError> {
    let done = sqlx::query(IDLE)
        .bind(now)
        .bind(ids)
        .bind(process)
        .exec(&mut **tx)
        .await?;
    counted::shift(tx, process, ("running", "idle"), done).await
}

/// Writes the next rows of the items that stay pending or parked, one
/// statement for the whole batch: `?2` is a JSON array of [`next_row`]s, `?1`
/// the time their runs ended.
pub(super) const NEXT: &str = "
UPDATE drover_items AS i SET state = n.state, priority = n.priority, ready_at = n.ready_at,
    enqueued_at = n.enqueued_at, failures = n.failures, backoff_until = n.backoff_until,
    backoff_ms = n.backoff_ms, last_error = n.last_error, error_signature = n.error_signature,
    dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
    lease_session = NULL, lease_token = NULL, started_at = NULL,
    last_outcome = n.outcome, last_ended_at = ?1
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS outcome,
          json_extract(value, '$[2]') AS state, json_extract(value, '$[3]') AS priority,
          json_extract(value, '$[4]') AS ready_at, json_extract(value, '$[5]') AS enqueued_at,
          json_extract(value, '$[6]') AS failures, json_extract(value, '$[7]') AS backoff_until,
          json_extract(value, '$[8]') AS backoff_ms, json_extract(value, '$[9]') AS last_error,
          json_extract(value, '$[10]') AS error_signature
      FROM json_each(?2)) AS n
WHERE i.id = n.id";

/// An item's next row (pending again, or parked) as [`NEXT`] reads it.
fn next_row(id: i64, outcome: RunOutcome, next: &NextRow) -> Value {
    json!([
        id,
        outcome.as_str(),
        next.state.as_str(),
        next.priority,
        to_ms(next.ready_at),
        to_ms(next.enqueued_at),
        next.failures,
        next.backoff_until.map(to_ms),
        next.backoff.map(duration_ms),
        next.last_error,
        next.error_signature,
    ])
}

/// SQLite's primary result codes for errors a value can cause: a string or
/// blob too big (`SQLITE_TOOBIG`), a constraint (`SQLITE_CONSTRAINT`, which a
/// trigger's `RAISE(ABORT, …)` also gives) and a datatype mismatch. Any other
/// failure (I/O, a full disk, a read-only file) is about the database.
const DATA_ERRORS: [i64; 3] = [18, 19, 20];

impl CompleteOnce for SqliteStore {
    async fn complete_once(&self, batch: &[LeaseComplete<'_>]) -> Result<Answers, StoreError> {
        complete_batch(self, batch).await
    }

    fn from_data(e: &StoreError) -> bool {
        e.database_code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| DATA_ERRORS.contains(&(c & 0xff)))
    }

    /// One read of the runs by key (`drover_runs_key`), on a reader (not the
    /// writer), the leases passed as one JSON array of `[process, key,
    /// token, session, outcome]`.
    async fn recorded(
        &self,
        leases: &[(&Lease, RunOutcome)],
    ) -> Result<HashSet<(i64, i64, String)>, StoreError> {
        let asked: Vec<Value> = leases
            .iter()
            .map(|(l, o)| json!([l.process, l.key, l.token.0, l.session.0, o.as_str()]))
            .collect();
        let tokens: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT r.token, r.session, r.outcome FROM json_each(?1) AS j
             JOIN drover_runs r ON r.process = j.value ->> 0 AND r.key = j.value ->> 1
                 AND r.token = j.value ->> 2 AND r.session = j.value ->> 3
                 AND r.outcome = j.value ->> 4",
        )
        .bind(Value::Array(asked).to_string())
        .fetch_all(self.pool())
        .await
        .db()?;
        Ok(tokens.into_iter().collect())
    }
}
