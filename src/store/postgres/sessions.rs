//! Sessions on PostgreSQL: start, heartbeat, close, and reclaiming expired ones.

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::lineage;
use super::runs::{Ending, log_runs};
use super::tid::Tid;
use crate::store::params::{SessionList, SessionStart};
use crate::store::rules::pages;
use crate::store::rules::rows::{HeldLeases, HeldRow, SESSION_COLUMNS, SessionRow, session_page};
use crate::store::rules::sessions::NewSession;
use crate::store::types::{Page, ReclaimReport, RunOutcome, Session, SessionId, SessionInfo};
use crate::store::wakeup::Requeued;
use crate::store::{StoreError, TRACE_LINKS_KEPT};

pub(super) async fn start(
    store: &PostgresStore,
    params: &SessionStart,
) -> Result<Session, StoreError> {
    let new = NewSession::checked(params)?;
    let (mut tx, now) = store.write().await?;
    // The longest TTL ever started is kept apart (see `lineage`): a pause
    // after a fork covers it even if this session's row is lost with it.
    let insert = sqlx::query_as(
        "WITH started AS (
           INSERT INTO drover_sessions (component, ttl_ms, started_at, heartbeat_at, deadline,
               host, pid, version, owner)
           VALUES ($1, $2, $3, $3, $3 + $2::float8 * interval '1 millisecond', $4, $5, $6, $7)
           RETURNING id, deadline),
         longest AS (
           UPDATE drover_lineage SET longest_ttl_ms = $2
           WHERE longest_ttl_ms IS NULL OR longest_ttl_ms < $2)
         SELECT id, deadline FROM started",
    );
    let (id, deadline): (i64, DateTime<Utc>) =
        new.bind(insert, now).fetch_one(&mut tx).await.db()?;
    commit(tx).await?;
    Ok(Session {
        id: SessionId(id),
        component: new.component,
        ttl: params.ttl,
        deadline,
    })
}

pub(super) async fn heartbeat(
    store: &PostgresStore,
    session: SessionId,
) -> Result<DateTime<Utc>, StoreError> {
    // The row is locked first and the clock read after: a heartbeat that
    // waited for a reclaim's lock renews from when it writes, and is judged
    // by the time it got the row. (An `UPDATE` computes its new values before
    // it waits for a row that another transaction only locked.)
    let mut tx = store.begin().await?;
    sqlx::query("SELECT 1 FROM drover_sessions WHERE id = $1 FOR NO KEY UPDATE")
        .bind(session.0)
        .exec(&mut tx)
        .await?;
    let now = store.now(&mut tx).await?;
    let deadline: Option<DateTime<Utc>> = sqlx::query_scalar(
        "UPDATE drover_sessions SET heartbeat_at = $2,
             deadline = $2 + ttl_ms::float8 * interval '1 millisecond'
         WHERE id = $1 AND deadline > $2 RETURNING deadline",
    )
    .bind(session.0)
    .bind(now)
    .fetch_optional(&mut tx)
    .await
    .db()?;
    let deadline = deadline.ok_or(StoreError::SessionExpired { session })?;
    commit(tx).await?;
    Ok(deadline)
}

/// Ends a session. Its row is deleted first, as [`reclaim`] does, so the two
/// take their locks in the same order (session, then items) and cannot deadlock.
pub(super) async fn close(store: &PostgresStore, session: SessionId) -> Result<u64, StoreError> {
    let (mut tx, _) = store.write().await?;
    sqlx::query("DELETE FROM drover_sessions WHERE id = $1")
        .bind(session.0)
        .exec(&mut tx)
        .await?;
    let ctids = lock_leases(&mut tx, &[session.0]).await?;
    // Read after the locks: the requeue's time is when it is written.
    let now = store.now(&mut tx).await?;
    let requeued = requeue(&mut tx, now, &ctids, RunOutcome::Canceled).await?;
    commit(tx).await?;
    requeued.wake();
    Ok(ctids.len() as u64)
}

/// Reclaims the leases of expired sessions, deciding expiry once and under
/// lock: the `DELETE … RETURNING` waits for a heartbeat that holds a session's
/// row and re-checks the deadline on the row it committed, so a heartbeat and a
/// reclaim never both win. Then it requeues the running items of exactly the
/// deleted sessions (waiting for completions in flight, which settle them
/// first), and any orphan whose session row is gone ([`orphans`]).
pub(super) async fn reclaim(store: &PostgresStore) -> Result<ReclaimReport, StoreError> {
    // A fork this store's connections did not see (see `lineage`) is
    // noticed here: its sessions expire, and this reclaim requeues them.
    let mut tx = store.read().await?;
    lineage::observe(&mut tx, store.clock.offset_ms())
        .await
        .db()?;
    commit(tx).await?;
    let (mut tx, now) = store.write().await?;
    let expired: Vec<i64> =
        sqlx::query_scalar("DELETE FROM drover_sessions WHERE deadline <= $1 RETURNING id")
            .bind(now)
            .fetch_all(&mut tx)
            .await
            .db()?;
    let mut ctids = lock_leases(&mut tx, &expired).await?;
    ctids.extend(orphans(&mut tx, &ctids).await?);
    // Read after the locks: the requeue's time is when it is written.
    let now = store.now(&mut tx).await?;
    let requeued = requeue(&mut tx, now, &ctids, RunOutcome::Expired).await?;
    commit(tx).await?;
    requeued.wake();
    Ok(ReclaimReport {
        sessions: expired.len() as u64,
        leases: ctids.len() as u64,
    })
}

/// Locks the running items of `sessions`, in key order (as every writer that
/// waits on item rows locks them), and returns their `ctid`s. A row that changed
/// while this waited is re-checked on its committed version: a completion that
/// settled it first leaves nothing to reclaim.
async fn lock_leases(tx: &mut Tx, sessions: &[i64]) -> Result<Vec<Tid>, StoreError> {
    if sessions.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(
        "SELECT ctid::text FROM drover_items WHERE state = 'running' AND lease_session = ANY($1)
         ORDER BY process, key FOR UPDATE",
    )
    .bind(sessions)
    .fetch_all(&mut *tx)
    .await
    .db()
}

/// Running items whose session row is gone (a claim that read its session as
/// live just before a reclaim deleted it), besides `taken`. Rows other
/// transactions hold are skipped (the next reclaim finds them). The orphans are
/// locked first and then re-checked by a second statement, whose fresh snapshot
/// sees every session committed before the lock was taken: a row that a new
/// session claimed after the first statement's snapshot is left alone, where a
/// re-check inside the locking statement would still judge it by the old
/// snapshot, in which that session did not exist yet (it finds the locked
/// candidates by their `ctid`s, see [`Tid`]).
async fn orphans(tx: &mut Tx, taken: &[Tid]) -> Result<Vec<Tid>, StoreError> {
    let candidates: Vec<Tid> = sqlx::query_scalar(
        "SELECT i.ctid::text FROM drover_items i
         WHERE i.state = 'running' AND i.ctid <> ALL($1::text[]::tid[])
             AND NOT EXISTS (SELECT 1 FROM drover_sessions s WHERE s.id = i.lease_session)
         FOR UPDATE OF i SKIP LOCKED",
    )
    .bind(taken)
    .fetch_all(&mut *tx)
    .await
    .db()?;
    if candidates.is_empty() {
        return Ok(candidates);
    }
    sqlx::query_scalar(
        "SELECT i.ctid::text FROM drover_items i
         WHERE i.ctid = ANY(ARRAY(SELECT unnest($1::text[]::tid[]))) AND i.state = 'running'
             AND NOT EXISTS (SELECT 1 FROM drover_sessions s WHERE s.id = i.lease_session)",
    )
    .bind(&candidates)
    .fetch_all(&mut *tx)
    .await
    .db()
}

/// The trace links a requeued run gives back to its key's next run
/// (DESIGN.md rule 14): a run canceled or expired did none of the work its
/// enqueues asked for, so the run after it links to them, then to those that
/// came meanwhile, kept as an enqueue keeps them (the first and the last
/// [`TRACE_LINKS_KEPT`], the rest counted). Without it the claim had moved
/// them to `trace_run`, and the next claim overwrote them: the run that did
/// the work linked to nothing.
fn returned_links() -> String {
    format!(
        "CASE WHEN trace_run IS NULL THEN trace_links
             WHEN trace_links IS NULL THEN trace_run
             ELSE (SELECT jsonb_build_object('links', jsonb_agg(c.v ORDER BY c.pos), 'dropped',
                       COALESCE((drover_items.trace_run ->> 'dropped')::bigint, 0)
                       + COALESCE((drover_items.trace_links ->> 'dropped')::bigint, 0)
                       + GREATEST(jsonb_array_length(drover_items.trace_run -> 'links')
                                  + jsonb_array_length(drover_items.trace_links -> 'links')
                                  - 2 * {kept}, 0))
                   FROM (SELECT r.pos, r.v
                         FROM jsonb_array_elements(drover_items.trace_run -> 'links')
                             WITH ORDINALITY AS r(v, pos)
                         UNION ALL
                         SELECT jsonb_array_length(drover_items.trace_run -> 'links') + l.pos, l.v
                         FROM jsonb_array_elements(drover_items.trace_links -> 'links')
                             WITH ORDINALITY AS l(v, pos)) AS c
                   WHERE c.pos <= {kept}
                       OR c.pos > jsonb_array_length(drover_items.trace_run -> 'links')
                                  + jsonb_array_length(drover_items.trace_links -> 'links')
                                  - {kept})
        END",
        kept = TRACE_LINKS_KEPT
    )
}

/// [`requeue`]'s statement: `$1` the time, `$2` the rows' `ctid`s, `$3` the
/// outcome.
static REQUEUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE drover_items SET state = 'pending', ready_at = $1,
             priority = GREATEST(priority, dirty_priority),
             dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
             lease_session = NULL, lease_token = NULL, started_at = NULL,
             last_outcome = $3, last_ended_at = $1,
             trace_links = {}, trace_run = NULL
         WHERE ctid = ANY(ARRAY(SELECT unnest($2::text[]::tid[])))
         RETURNING process",
        returned_links()
    )
});

/// Turns locked running items back into pending ones without counting a failure:
/// ready at once, keeping the higher of their own and a dirty enqueue's priority,
/// each run ending with `outcome` (`canceled` or `expired`) in the history.
/// The rows are found by their `ctid`s, one TID scan (see [`Tid`]).
///
/// Their processes' channels are notified in the same transaction, so every
/// node's waiting claimers hear of the keys at the commit; the caller wakes
/// this process's with [`Requeued::wake`] once it commits.
pub(super) async fn requeue(
    tx: &mut Tx,
    now: DateTime<Utc>,
    ctids: &[Tid],
    outcome: RunOutcome,
) -> Result<Requeued, StoreError> {
    if ctids.is_empty() {
        return Ok(Requeued::default());
    }
    log_runs(tx, now, &Ending::all(ctids, outcome)).await?;
    let processes: Vec<String> = sqlx::query_scalar(REQUEUE.as_str())
        .bind(now)
        .bind(ctids)
        .bind(outcome.as_str())
        .fetch_all(&mut *tx)
        .await
        .db()?;
    let requeued = Requeued::of(processes);
    PostgresStore::notify_ready_all(tx, requeued.processes()).await?;
    Ok(requeued)
}

/// One page of sessions with their first leases: one query for the sessions
/// (a range of their key, each with its lease count from the lease index),
/// one per session for its leases, oldest token first.
pub(super) async fn list(
    store: &PostgresStore,
    params: SessionList,
) -> Result<Page<SessionInfo, SessionId>, StoreError> {
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let sql = format!(
        "SELECT {SESSION_COLUMNS} FROM drover_sessions s WHERE s.id > $1 ORDER BY s.id LIMIT $2"
    );
    let rows: Vec<SessionRow<DateTime<Utc>>> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(params.after.map_or(i64::MIN, |s| s.0))
        .bind(pages::read_limit(params.limit))
        .fetch_all(&mut tx)
        .await
        .db()?;
    let page = session_page(rows, &params, now, &mut tx).await?;
    tx.commit().await.db()?;
    Ok(page)
}

impl HeldLeases<DateTime<Utc>> for Tx {
    async fn held(
        &mut self,
        session: i64,
        n: u32,
    ) -> Result<Vec<HeldRow<DateTime<Utc>>>, StoreError> {
        sqlx::query_as(
            "SELECT process, key, started_at, lease_token FROM drover_items
             WHERE lease_session = $1 AND state = 'running' ORDER BY lease_token LIMIT $2",
        )
        .bind(session)
        .bind(i64::from(n))
        .fetch_all(self)
        .await
        .db()
    }
}

/// The owners of those of `sessions` that exist, in one read.
pub(super) async fn owners(
    store: &PostgresStore,
    sessions: &[SessionId],
) -> Result<HashMap<SessionId, Option<String>>, StoreError> {
    let ids: Vec<i64> = sessions.iter().map(|s| s.0).collect();
    let mut tx = store.read().await?;
    let rows: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT id, owner FROM drover_sessions WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut tx)
            .await
            .db()?;
    commit(tx).await?;
    Ok(rows
        .into_iter()
        .map(|(id, owner)| (SessionId(id), owner))
        .collect())
}

/// How many sessions `owner` started that have not expired.
pub(super) async fn count_owned(store: &PostgresStore, owner: &str) -> Result<u64, StoreError> {
    let mut tx = store.read().await?;
    let now = store.now(&mut tx).await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_sessions WHERE owner = $1 AND deadline > $2",
    )
    .bind(owner)
    .bind(now)
    .fetch_one(&mut tx)
    .await
    .db()?;
    commit(tx).await?;
    Ok(u64::try_from(n).unwrap_or(0))
}
