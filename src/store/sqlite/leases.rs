//! Leases on SQLite: claim, complete, release and lock, each checked against the
//! session and the fencing token inside one write transaction.

use super::counted;
use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::gate;
use super::items::ensure_process;
use super::rows::{RunningRow, running_columns, to_time};
use super::sessions::requeue;
use crate::store::StoreError;
use crate::store::fleet::{ClaimGate, Claimed};
use crate::store::key::{validate_key, validate_process};
use crate::store::params::{LeaseClaim, LeaseLock, LeaseRelease};
use crate::store::refusal::{Unlockable, lock_refusal};
use crate::store::types::{FencingToken, Lease, RunOutcome, SessionId};

/// Fails with `SessionExpired` unless the session exists and its deadline is
/// still ahead.
async fn check_session(tx: &mut Tx, now: i64, session: SessionId) -> Result<(), StoreError> {
    let alive: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM drover_sessions WHERE id = ?1 AND deadline > ?2")
            .bind(session.0)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .db()?;
    alive
        .map(|_| ())
        .ok_or(StoreError::SessionExpired { session })
}

/// Takes `n` fencing tokens; returns the first.
async fn take_tokens(tx: &mut Tx, n: i64) -> Result<i64, StoreError> {
    let last: i64 = sqlx::query_scalar(
        "UPDATE drover_counters SET value = value + ?1 WHERE name = 'lease_token' RETURNING value",
    )
    .bind(n)
    .fetch_one(&mut **tx)
    .await
    .db()?;
    Ok(last - n + 1)
}

/// Marks one item running under a lease. A run's start has no history row of
/// its own: the running item shows it, and the run's row is written when it
/// ends.
async fn start_run(
    tx: &mut Tx,
    now: i64,
    id: i64,
    session: SessionId,
    token: i64,
) -> Result<Lease, StoreError> {
    let (process, key, priority, failures, enqueued_at): (String, String, i32, i64, i64) =
        sqlx::query_as(
            "UPDATE drover_items SET state = 'running', lease_session = ?2, lease_token = ?3,
                 started_at = ?4 WHERE id = ?1
             RETURNING process, key, priority, failures, enqueued_at",
        )
        .bind(id)
        .bind(session.0)
        .bind(token)
        .bind(now)
        .fetch_one(&mut **tx)
        .await
        .db()?;
    let attempt = u32::try_from(failures).unwrap_or(0).saturating_add(1);
    Ok(Lease {
        session,
        process,
        key,
        token: FencingToken(token),
        attempt,
        priority,
        enqueued_at: to_time(enqueued_at),
        started_at: to_time(now),
    })
}

/// Up to `max` ready items in claim order: priorities from the highest down (one
/// index probe each), each priority's ready rows by (ready time, id). Walking the
/// priorities keeps a claim O(P log n) for P distinct priorities, where one
/// `ORDER BY priority DESC, ready_at` scan would step over every not-yet-ready row
/// of a higher priority (a million keys in backoff after an outage) on each poll.
async fn ready_ids(tx: &mut Tx, now: i64, process: &str, max: u32) -> Result<Vec<i64>, StoreError> {
    let mut ids = Vec::new();
    let mut below = i64::MAX;
    while ids.len() < max as usize {
        let priority: Option<i32> = sqlx::query_scalar(
            "SELECT priority FROM drover_items
             WHERE process = ?1 AND state = 'pending' AND priority < ?2
             ORDER BY priority DESC LIMIT 1",
        )
        .bind(process)
        .bind(below)
        .fetch_optional(&mut **tx)
        .await
        .db()?;
        let Some(priority) = priority else { break };
        let more: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM drover_items
             WHERE process = ?1 AND state = 'pending' AND priority = ?2 AND ready_at <= ?3
             ORDER BY ready_at, id LIMIT ?4",
        )
        .bind(process)
        .bind(priority)
        .bind(now)
        .bind(i64::from(max) - ids.len() as i64)
        .fetch_all(&mut **tx)
        .await
        .db()?;
        ids.extend(more);
        below = i64::from(priority);
    }
    Ok(ids)
}

pub(super) async fn claim(store: &SqliteStore, params: LeaseClaim) -> Result<Claimed, StoreError> {
    validate_process(&params.process)?;
    let (mut tx, now) = store.write().await?;
    check_session(&mut tx, now, params.session).await?;
    let decided = gate::admit(&mut tx, now, &params.process, params.max).await?;
    let max = decided.map_or(params.max, |(_, admission)| admission.allowed);
    let ids = ready_ids(&mut tx, now, &params.process, max).await?;
    let leases = if ids.is_empty() {
        Vec::new()
    } else {
        let first = take_tokens(&mut tx, ids.len() as i64).await?;
        let starting = Starting {
            process: &params.process,
            ids: &ids,
            session: params.session,
            first,
        };
        start_runs(&mut tx, now, starting).await?
    };
    let gate = match decided {
        Some(decided) => {
            let taken = u32::try_from(leases.len()).unwrap_or(u32::MAX);
            gate::take(&mut tx, &params.process, decided, taken).await?
        }
        None => ClaimGate::default(),
    };
    if leases.is_empty() {
        // Nothing to write: a bucket's refill is recomputed from what is stored.
        return Ok(Claimed { leases, gate });
    }
    tx.commit().await.db()?;
    Ok(Claimed { leases, gate })
}

/// Starts the claimed items whose ids are in `?1` (a JSON array) under
/// session `?2`, the `n`th with token `?3 + n`, at `?4`: only the pending rows
/// of process `?5`, marked as counted by the statement ([`counted`]). The
/// unary `+` keeps those two checks off the indexes: each row is found by its
/// id, where `state = 'pending' AND process = ?5` would lead SQLite to walk the
/// claim index over the whole backlog.
pub(super) const START: &str = "
UPDATE drover_items AS i SET state = 'running', lease_session = ?2,
    lease_token = ?3 + j.key, started_at = ?4, counts_mark = counts_mark + 1
FROM json_each(?1) AS j
WHERE i.id = j.value AND +i.state = 'pending' AND +i.process = ?5
RETURNING key, priority, failures, enqueued_at, lease_token";

/// The pending items of one process a claim starts, and their leases' session
/// and first fencing token.
struct Starting<'a> {
    process: &'a str,
    ids: &'a [i64],
    session: SessionId,
    first: i64,
}

/// Like [`start_run`] for many items at once (one `UPDATE`, counted once: see
/// [`counted`]): the `n`th id gets token `first + n`, and the leases come back
/// in `ids` order. Only pending rows of the process change.
async fn start_runs(
    tx: &mut Tx,
    now: i64,
    starting: Starting<'_>,
) -> Result<Vec<Lease>, StoreError> {
    let Starting {
        process,
        ids,
        session,
        first,
    } = starting;
    let ids = serde_json::Value::from(ids).to_string();
    let mut rows: Vec<(String, i32, i64, i64, i64)> = sqlx::query_as(START)
        .bind(&ids)
        .bind(session.0)
        .bind(first)
        .bind(now)
        .bind(process)
        .fetch_all(&mut **tx)
        .await
        .db()?;
    counted::shift(tx, process, ("pending", "running"), rows.len() as u64).await?;
    rows.sort_unstable_by_key(|row| row.4);
    Ok(rows
        .into_iter()
        .map(|(key, priority, failures, enqueued_at, token)| Lease {
            session,
            process: process.to_owned(),
            key,
            token: FencingToken(token),
            attempt: u32::try_from(failures).unwrap_or(0).saturating_add(1),
            priority,
            enqueued_at: to_time(enqueued_at),
            started_at: to_time(now),
        })
        .collect())
}

/// Checks the session, then finds the lease's running row; `LeaseLost` if the
/// token or session no longer match.
async fn held(tx: &mut Tx, now: i64, lease: &Lease) -> Result<RunningRow, StoreError> {
    check_session(tx, now, lease.session).await?;
    let row: Option<RunningRow> = sqlx::query_as(concat!(
        "SELECT ",
        running_columns!(),
        " FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
         WHERE i.process = ?1 AND i.key = ?2 AND i.state = 'running'
             AND i.lease_token = ?3 AND i.lease_session = ?4"
    ))
    .bind(&lease.process)
    .bind(&lease.key)
    .bind(lease.token.0)
    .bind(lease.session.0)
    .fetch_optional(&mut **tx)
    .await
    .db()?;
    row.ok_or_else(|| StoreError::lease_lost(lease))
}

pub(super) async fn release(
    store: &SqliteStore,
    params: LeaseRelease<'_>,
) -> Result<(), StoreError> {
    let (mut tx, now) = store.write().await?;
    let row = held(&mut tx, now, params.lease).await?;
    requeue(&mut tx, now, &[row.id], RunOutcome::Canceled).await?;
    tx.commit().await.db()
}

pub(super) async fn lock(store: &SqliteStore, params: LeaseLock) -> Result<Lease, StoreError> {
    validate_process(&params.process)?;
    validate_key(&params.key)?;
    let (mut tx, now) = store.write().await?;
    check_session(&mut tx, now, params.session).await?;
    ensure_process(&mut tx, now, &params.process).await?;
    let decided = gate::admit(&mut tx, now, &params.process, 1).await?;
    if let Some((row, admission)) = &decided
        && admission.allowed == 0
    {
        return Err(StoreError::Held {
            process: params.process,
            why: row.why_held(admission),
        });
    }
    // An idle key is taken like a new one: pending since now.
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at)
         VALUES (?1, ?2, 'pending', 0, ?3, ?3)
         ON CONFLICT (process, key) DO UPDATE SET
             enqueued_at = CASE i.state WHEN 'idle' THEN ?3 ELSE i.enqueued_at END
         WHERE (i.state = 'pending' AND i.ready_at <= ?3 AND COALESCE(i.backoff_until, ?3) <= ?3)
             OR i.state = 'idle'
         RETURNING id",
    )
    .bind(&params.process)
    .bind(&params.key)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    let Some(id) = id else {
        return Err(refusal(&mut tx, now, params).await);
    };
    let token = take_tokens(&mut tx, 1).await?;
    let lease = start_run(&mut tx, now, id, params.session, token).await?;
    if let Some(decided) = decided {
        gate::take(&mut tx, &params.process, decided, 1).await?;
    }
    tx.commit().await.db()?;
    Ok(lease)
}

/// Why `lease_lock` could not take a key.
async fn refusal(tx: &mut Tx, now: i64, params: LeaseLock) -> StoreError {
    let row: Option<(String, Option<i64>, i64)> = match sqlx::query_as(
        "SELECT state, backoff_until, ready_at FROM drover_items WHERE process = ?1 AND key = ?2",
    )
    .bind(&params.process)
    .bind(&params.key)
    .fetch_optional(&mut **tx)
    .await
    {
        Ok(row) => row,
        Err(e) => return super::error::map(e),
    };
    let row = row
        .as_ref()
        .map(|(state, backoff_until, ready_at)| Unlockable {
            state,
            backoff_until: backoff_until.map(to_time),
            ready_at: to_time(*ready_at),
        });
    lock_refusal(params.process, params.key, row, to_time(now))
}
