//! Leases on PostgreSQL: claim (one `SKIP LOCKED` statement per batch), complete,
//! release and lock, each checked against the session and the fencing token.

use chrono::{DateTime, Utc};

use super::claims;
use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit, map, map_commit};
use super::gate;
use super::gated;
use super::processes::ensure_process;
use super::retry::bounded;
use super::rows::{LockedRow, running_columns};
use super::sessions::requeue;
use crate::store::fleet::Claimed;
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{LeaseClaim, LeaseLock, LeaseRelease};
use crate::store::rules::gate::{Admission, GateRow};
use crate::store::rules::refusal::{Unlockable, lock_refusal};
use crate::store::types::{FencingToken, Lease, RunOutcome, SessionId};
use crate::store::{StoreError, TraceLinks};

/// The whole claim in one statement, a call of the SQL function
/// `drover_claim` (migration 0025): check the session, walk the process's
/// distinct pending priorities from the highest down, take each priority's
/// ready rows in (ready time, id) order skipping rows other claimers hold,
/// lease them with fresh fencing tokens. A start writes no history row: the
/// running item shows it, and the run's row is written when it ends.
///
/// A function rather than a prepared statement so that it runs on a generic
/// plan: PostgreSQL planned the prepared claim afresh on every call (its
/// generic plan prices `LIMIT $3` at a tenth of the table), which was nearly
/// half of what a claim of a few keys cost the database.
///
/// Why the function's statement is written as it is:
/// - `prios` walks the distinct pending priorities, one index probe each, so
///   a claim costs O(P log n) for P priorities: a plain `ORDER BY priority
///   DESC, ready_at` scan would step over every not-yet-ready row of a higher
///   priority (a million keys in backoff after an outage) on each poll. The
///   outer `LIMIT` stops the walk, and the locking, once enough rows are in.
/// - `claimed` finds its rows by `process = … AND key = ANY(ARRAY(…))`, a
///   primary-key probe each: written as a join, a custom plan for a large
///   batch hashed the picked rows and scanned the whole table (37 ms of a
///   54 ms claim of 1,000 keys). Not by `ctid`: a row that `picked` locked
///   after a concurrent update is a version the statement's snapshot does not
///   see, so a TID scan would miss it, where the index finds the version it
///   sees and the update follows it to the locked one.
/// - `gate` is the fleet controls' fast path (one primary-key probe): a
///   paused or limited process claims nothing here and reports `held`, and
///   the caller claims again through [`gated::claim`] (`drover_claim_gated`,
///   whose claim is this one without the gate: keep the two in step).
/// - `forked` is the pause after a fork in the database's history (see
///   `lineage`): while it lasts nothing is claimed.
/// - `trace_run` is read only when `$5` asks for the runs' trace contexts:
///   `RETURNING` sees the row as the `BEFORE` trigger of migration 0015 left
///   it, the contexts moved there.
/// - The final outer join yields one row even when nothing was claimed, so
///   `live` tells an expired session apart from an empty queue.
pub(super) const CLAIM: &str = "
SELECT c.live, c.held, c.process, c.key, c.priority, c.failures, c.enqueued_at, c.lease_token,
    c.started_at, c.trace_run
FROM drover_claim($1, $2, $3, $4::float8, $5) WITH ORDINALITY c
ORDER BY c.ordinality";

/// One row of [`CLAIM`]'s result.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct ClaimRow {
    live: i64,
    held: i64,
    #[sqlx(flatten)]
    claimed: ClaimedKey,
}

/// The claimed key of one row of a claim, [`CLAIM`] or the gated claim
/// function: all `None` on the one row a claim that took nothing returns.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct ClaimedKey {
    process: Option<String>,
    key: Option<String>,
    priority: Option<i32>,
    failures: Option<i32>,
    enqueued_at: Option<DateTime<Utc>>,
    lease_token: Option<i64>,
    started_at: Option<DateTime<Utc>>,
    /// The run's trace contexts as stored, when the claim asked for them
    /// (only [`CLAIM`] reads them; the gated claim's are read after it).
    #[sqlx(default)]
    trace_run: Option<String>,
}

impl ClaimedKey {
    /// The lease of `session` on this key, if a key was claimed; with its
    /// trace links when `traced` (the claim asked for them).
    pub(super) fn into_lease(self, session: SessionId, traced: bool) -> Option<Lease> {
        Some(Lease {
            session,
            process: self.process?,
            key: self.key?,
            token: FencingToken(self.lease_token?),
            attempt: u32::try_from(self.failures?).unwrap_or(0).saturating_add(1),
            priority: self.priority?,
            enqueued_at: self.enqueued_at?,
            started_at: self.started_at?,
            trace_links: traced.then(|| TraceLinks::from_json(self.trace_run.as_deref())),
        })
    }
}

/// The rows of a claim statement, [`CLAIM`] or the gated claim function,
/// both bound as `(session, process, max, clock offset)`, then the claim's
/// `trace_links` as `$5` when `sql` takes it (`binds_trace`: [`CLAIM`]
/// does). Directly connected
/// the statement is its own transaction; through a pooler it needs one around
/// it (see `Tx`), and then the commit is where the outcome may become unknown.
/// Watched by [`bounded`] (see [`ANSWER_TIMEOUT`](super::retry::ANSWER_TIMEOUT)).
pub(super) async fn claim_rows<R>(
    store: &PostgresStore,
    (sql, binds_trace): (&'static str, bool),
    params: &LeaseClaim,
) -> Result<Vec<R>, StoreError>
where
    R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    bounded(store, async {
        let mut tx = store.read().await?;
        let mut query = sqlx::query_as(sql)
            .bind(params.session.0)
            .bind(&params.process)
            .bind(i64::from(params.max))
            .bind(store.clock.offset_ms());
        if binds_trace {
            query = query.bind(params.trace_links);
        }
        let rows: Vec<R> = query.fetch_all(&mut tx).await.map_err(map_commit)?;
        commit(tx).await?;
        Ok(rows)
    })
    .await
}

pub(super) async fn claim(
    store: &PostgresStore,
    params: &LeaseClaim,
) -> Result<Claimed, StoreError> {
    validate_process(&params.process)?;
    if store.gated.contains(&params.process) {
        return gated::claim(store, params).await;
    }
    let rows = claims::claim(store, params).await?;
    if rows.first().is_some_and(|r| r.held > 0) {
        return gated::claim(store, params).await;
    }
    leases(rows, params).map(Claimed::open)
}

/// The leases of a claim's rows; `SessionExpired` if the session was not live.
fn leases(rows: Vec<ClaimRow>, params: &LeaseClaim) -> Result<Vec<Lease>, StoreError> {
    let session = params.session;
    if rows.first().is_none_or(|r| r.live == 0) {
        return Err(StoreError::SessionExpired { session });
    }
    Ok(rows
        .into_iter()
        .filter_map(|r| r.claimed.into_lease(session, params.trace_links))
        .collect())
}

/// Fails with `SessionExpired` unless the session exists and its deadline is
/// still ahead.
async fn check_session(
    tx: &mut Tx,
    now: DateTime<Utc>,
    session: SessionId,
) -> Result<(), StoreError> {
    let alive: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM drover_sessions WHERE id = $1 AND deadline > $2")
            .bind(session.0)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .db()?;
    alive
        .map(|_| ())
        .ok_or(StoreError::SessionExpired { session })
}

/// Checks the session, then locks the lease's running row; `LeaseLost` if the
/// token or session no longer match.
async fn held(tx: &mut Tx, now: DateTime<Utc>, lease: &Lease) -> Result<LockedRow, StoreError> {
    check_session(tx, now, lease.session).await?;
    let row: Option<LockedRow> = sqlx::query_as(concat!(
        "SELECT i.ctid::text AS ctid, ",
        running_columns!(),
        " FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
         WHERE i.process = $1 AND i.key = $2 AND i.state = 'running'
             AND i.lease_token = $3 AND i.lease_session = $4
         FOR UPDATE OF i"
    ))
    .bind(&lease.process)
    .bind(&lease.key)
    .bind(lease.token.0)
    .bind(lease.session.0)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    row.ok_or_else(|| StoreError::lease_lost(lease))
}

pub(super) async fn release(
    store: &PostgresStore,
    params: LeaseRelease<'_>,
) -> Result<(), StoreError> {
    let (mut tx, now) = store.write().await?;
    let row = held(&mut tx, now, params.lease).await?;
    let now = store.now(&mut tx).await?; // after the row lock's wait
    let requeued = requeue(&mut tx, now, &[row.ctid], RunOutcome::Canceled).await?;
    commit(tx).await?;
    requeued.wake();
    Ok(())
}

/// The row `lease_lock` took.
#[derive(Debug, sqlx::FromRow)]
struct Locked {
    priority: i32,
    failures: i32,
    enqueued_at: DateTime<Utc>,
    lease_token: i64,
    started_at: DateTime<Utc>,
}

pub(super) async fn lock(store: &PostgresStore, params: &LeaseLock) -> Result<Lease, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let (mut tx, now) = store.write().await?;
    check_session(&mut tx, now, params.session).await?;
    lock_pause(&mut tx, now, &params.process).await?;
    ensure_process(&mut tx, now, &params.process).await?;
    // The key's row is taken first, after any wait for it (a caller's
    // transaction that enqueued the key holds it), and the fleet controls
    // are read after: a pause or a limit committed while the lock waited is
    // obeyed, and the process row is not held while it waits, which would
    // stall every claim of the process on every node behind one caller's
    // transaction. A refusal then rolls the row back. The started time is
    // read when the row is taken; an idle key is taken like a new one:
    // pending since then.
    let row: Option<Locked> = sqlx::query_as(
        "INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at,
             lease_session, lease_token, started_at)
         VALUES ($1, $2, 'running', 0, $3, $3, $4, nextval('drover_lease_tokens'), $3)
         ON CONFLICT (process, key) DO UPDATE SET state = 'running',
             lease_session = EXCLUDED.lease_session, lease_token = EXCLUDED.lease_token,
             started_at = clock_timestamp() + $5::float8 * interval '1 millisecond',
             enqueued_at = CASE i.state
                 WHEN 'idle' THEN clock_timestamp() + $5::float8 * interval '1 millisecond'
                 ELSE i.enqueued_at END
         WHERE (i.state = 'pending' AND i.ready_at <= $3 AND COALESCE(i.backoff_until, $3) <= $3)
             OR i.state = 'idle'
         RETURNING priority, failures, enqueued_at, lease_token, started_at",
    )
    .bind(&params.process)
    .bind(&params.key)
    .bind(now)
    .bind(params.session.0)
    .bind(store.clock.offset_ms())
    .fetch_optional(&mut tx)
    .await
    .db()?;
    let Some(Locked {
        priority,
        failures,
        enqueued_at,
        lease_token: token,
        started_at: now,
    }) = row
    else {
        // The controls' refusal first, as a claim would give it (and SQLite
        // does): a key that is running, of a paused process, is held back.
        lock_gate(store, &mut tx, &params.process, 0).await?;
        return Err(refusal(&mut tx, now, params).await);
    };
    let decided = lock_gate(store, &mut tx, &params.process, 1).await?;
    let attempt = u32::try_from(failures).unwrap_or(0).saturating_add(1);
    if let Some(decided) = decided {
        gate::take(&mut tx, &params.process, decided, 1).await?;
    }
    commit(tx).await?;
    Ok(Lease {
        session: params.session,
        process: params.process.clone(),
        key: params.key.clone(),
        token: FencingToken(token),
        attempt,
        priority,
        enqueued_at,
        started_at: now,
        trace_links: None,
    })
}

/// The pause after a fork in the database's history (see `lineage`) on one
/// `lease_lock`: refused with [`StoreError::Held`] while claims are paused,
/// as a claim would take nothing. A query source locks its keys one by one
/// through here, and locked a key its worker of before the fork still ran.
async fn lock_pause(tx: &mut Tx, now: DateTime<Utc>, process: &str) -> Result<(), StoreError> {
    let paused: bool = sqlx::query_scalar("SELECT drover_claims_paused($1)")
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .db()?;
    if paused {
        return Err(StoreError::Held {
            process: process.to_owned(),
            why: FORKED,
        });
    }
    Ok(())
}

/// Why a lock is refused during the pause after a fork.
const FORKED: &str = "held back after a fork in the database's history (a standby was \
    promoted): no key is handed out until every worker of before has given its runs up";

/// The fleet controls' say on one `lease_lock`, `own` runs of it (its key's
/// row, once taken) running in this transaction already: nothing to decide
/// for a process that is neither paused nor limited (its row is not
/// locked); otherwise the row is locked and the lock refused with
/// [`StoreError::Held`] unless one more run may start now (the running count
/// read under the lock includes this transaction's).
async fn lock_gate(
    store: &PostgresStore,
    tx: &mut Tx,
    process: &str,
    own: i64,
) -> Result<Option<(GateRow, Admission)>, StoreError> {
    if !gate::read(tx, process, false)
        .await?
        .is_some_and(|row| row.binds())
    {
        return Ok(None);
    }
    let decided = gate::admit(store, tx, process, 1, own).await?;
    if decided.1.allowed == 0 {
        return Err(StoreError::Held {
            process: process.to_owned(),
            why: decided.0.why_held(&decided.1),
        });
    }
    Ok(Some(decided))
}

/// Why `lease_lock` could not take a key (the upsert above locked its row).
async fn refusal(tx: &mut Tx, now: DateTime<Utc>, params: &LeaseLock) -> StoreError {
    let row: Option<(String, Option<DateTime<Utc>>, DateTime<Utc>)> = match sqlx::query_as(
        "SELECT state, backoff_until, ready_at FROM drover_items WHERE process = $1 AND key = $2",
    )
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&mut *tx)
    .await
    {
        Ok(row) => row,
        Err(e) => return map(e),
    };
    let row = row
        .as_ref()
        .map(|(state, backoff_until, ready_at)| Unlockable {
            state,
            backoff_until: *backoff_until,
            ready_at: *ready_at,
        });
    lock_refusal(params.process.clone(), params.key.clone(), row, now)
}
