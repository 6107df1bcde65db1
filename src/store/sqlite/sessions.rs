//! Sessions on SQLite: start, heartbeat, close, and reclaiming expired ones.

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::store::exec::Exec as _;
use chrono::{DateTime, Utc};
use sqlx::SqlitePool;

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::rows::to_time;
use super::runs::log_from_rows;
use crate::store::params::{SessionList, SessionStart};
use crate::store::rules::pages;
use crate::store::rules::rows::{HeldLeases, HeldRow, SESSION_COLUMNS, SessionRow, session_page};
use crate::store::rules::sessions::NewSession;
use crate::store::types::{Page, ReclaimReport, RunOutcome, Session, SessionId, SessionInfo};
use crate::store::wakeup::Requeued;
use crate::store::{StoreError, TRACE_LINKS_KEPT};

pub(super) async fn start(
    store: &SqliteStore,
    params: SessionStart,
) -> Result<Session, StoreError> {
    let new = NewSession::checked(&params)?;
    let (mut tx, now) = store.write().await?;
    let insert = sqlx::query_as(
        "INSERT INTO drover_sessions (component, ttl_ms, started_at, heartbeat_at, deadline,
             host, pid, version, owner)
         VALUES (?1, ?2, ?3, ?3, ?3 + ?2, ?4, ?5, ?6, ?7) RETURNING id, deadline",
    );
    let (id, deadline): (i64, i64) = new.bind(insert, now).fetch_one(&mut *tx).await.db()?;
    tx.commit().await.db()?;
    Ok(Session {
        id: SessionId(id),
        component: new.component,
        ttl: params.ttl,
        deadline: to_time(deadline),
    })
}

pub(super) async fn heartbeat(
    store: &SqliteStore,
    session: SessionId,
) -> Result<DateTime<Utc>, StoreError> {
    let (mut tx, now) = store.write().await?;
    let deadline: Option<i64> = sqlx::query_scalar(
        "UPDATE drover_sessions SET heartbeat_at = ?2, deadline = ?2 + ttl_ms
         WHERE id = ?1 AND deadline > ?2 RETURNING deadline",
    )
    .bind(session.0)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    let deadline = deadline.ok_or(StoreError::SessionExpired { session })?;
    tx.commit().await.db()?;
    Ok(to_time(deadline))
}

pub(super) async fn close(store: &SqliteStore, session: SessionId) -> Result<u64, StoreError> {
    let (mut tx, now) = store.write().await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM drover_items WHERE state = 'running' AND lease_session = ?1",
    )
    .bind(session.0)
    .fetch_all(&mut *tx)
    .await
    .db()?;
    let requeued = requeue(&mut tx, now, &ids, RunOutcome::Canceled).await?;
    sqlx::query("DELETE FROM drover_sessions WHERE id = ?1")
        .bind(session.0)
        .exec(&mut *tx)
        .await?;
    tx.commit().await.db()?;
    requeued.wake();
    Ok(ids.len() as u64)
}

/// The most leases one reclaim transaction requeues: the write lock is let go
/// between batches, so a node that died holding many leases does not stop
/// every other writer of the file for the whole requeue (100,000 leases held
/// it about 1.5 s in one transaction).
const RECLAIMED_AT_ONCE: usize = 1_000;

/// The running items whose session row is gone, at most `?1` of them, by the
/// lease index (the lowest session ids first: an expired session's leases
/// come before those of the sessions started after it).
pub(super) const ORPHANS: &str = "
SELECT i.id FROM drover_items i WHERE i.state = 'running' AND NOT EXISTS (
    SELECT 1 FROM drover_sessions s WHERE s.id = i.lease_session)
LIMIT ?1";

/// Reclaims the leases of expired sessions: the same steps as on PostgreSQL,
/// in `BEGIN IMMEDIATE` transactions, which no heartbeat can interleave
/// with. Expiry is decided once, by the `DELETE` in the first; then every
/// running item whose session row is gone (those sessions' own, and any
/// orphan) is requeued, [`RECLAIMED_AT_ONCE`] per transaction. A session id
/// is never handed out again (`AUTOINCREMENT`), so a lease orphaned in one
/// transaction is still one in the next, and a reclaim cut short leaves its
/// orphans to the next.
pub(super) async fn reclaim(store: &SqliteStore) -> Result<ReclaimReport, StoreError> {
    let (mut tx, mut now) = store.write().await?;
    let expired: Vec<i64> =
        sqlx::query_scalar("DELETE FROM drover_sessions WHERE deadline <= ?1 RETURNING id")
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .db()?;
    let mut leases = 0;
    loop {
        let ids: Vec<i64> = sqlx::query_scalar(ORPHANS)
            .bind(i64::try_from(RECLAIMED_AT_ONCE).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .db()?;
        let requeued = requeue(&mut tx, now, &ids, RunOutcome::Expired).await?;
        tx.commit().await.db()?;
        requeued.wake();
        leases += ids.len() as u64;
        if ids.len() < RECLAIMED_AT_ONCE {
            break;
        }
        (tx, now) = store.write().await?;
    }
    Ok(ReclaimReport {
        sessions: expired.len() as u64,
        leases,
    })
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
             ELSE (SELECT json_object('links', json_group_array(c.v ORDER BY c.pos), 'dropped',
                       COALESCE(json_extract(drover_items.trace_run, '$.dropped'), 0)
                       + COALESCE(json_extract(drover_items.trace_links, '$.dropped'), 0)
                       + MAX(json_array_length(drover_items.trace_run, '$.links')
                             + json_array_length(drover_items.trace_links, '$.links')
                             - 2 * {kept}, 0))
                   FROM (SELECT r.key AS pos, r.value AS v
                         FROM json_each(drover_items.trace_run, '$.links') AS r
                         UNION ALL
                         SELECT json_array_length(drover_items.trace_run, '$.links') + l.key, l.value
                         FROM json_each(drover_items.trace_links, '$.links') AS l) AS c
                   WHERE c.pos < {kept}
                       OR c.pos >= json_array_length(drover_items.trace_run, '$.links')
                                   + json_array_length(drover_items.trace_links, '$.links') - {kept})
        END",
        kept = TRACE_LINKS_KEPT
    )
}

/// [`requeue`]'s statement: `?1` the time, `?2` the items' ids (a JSON
/// array), `?3` the outcome.
static REQUEUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE drover_items SET state = 'pending', ready_at = ?1,
             priority = MAX(priority, COALESCE(dirty_priority, priority)),
             dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
             lease_session = NULL, lease_token = NULL, started_at = NULL,
             last_outcome = ?3, last_ended_at = ?1,
             trace_links = {}, trace_run = NULL
         WHERE id IN (SELECT value FROM json_each(?2))
         RETURNING process",
        returned_links()
    )
});

/// Turns running items back into pending ones without counting a failure: ready
/// at once, keeping the higher of their own and a dirty enqueue's priority, each
/// run ending with `outcome` (`canceled` or `expired`) in the history.
pub(super) async fn requeue(
    tx: &mut Tx,
    now: i64,
    ids: &[i64],
    outcome: RunOutcome,
) -> Result<Requeued, StoreError> {
    if ids.is_empty() {
        return Ok(Requeued::default());
    }
    let ids = serde_json::Value::from(ids).to_string();
    log_from_rows(tx, now, outcome, &ids).await?;
    let processes: Vec<String> = sqlx::query_scalar(REQUEUE.as_str())
        .bind(now)
        .bind(&ids)
        .bind(outcome.as_str())
        .fetch_all(&mut **tx)
        .await
        .db()?;
    Ok(Requeued::of(processes))
}

/// One page of sessions with their first leases: one query for the sessions
/// (a range of their key, each with its lease count from the lease index),
/// one per session for its leases, oldest token first.
pub(super) async fn list(
    store: &SqliteStore,
    params: SessionList,
) -> Result<Page<SessionInfo, SessionId>, StoreError> {
    let now = store.now_ms(&store.pool).await?;
    let rows: Vec<SessionRow<i64>> = sqlx::query_as(sqlx::AssertSqlSafe(list_sql()))
        .bind(params.after.map_or(i64::MIN, |s| s.0))
        .bind(pages::read_limit(params.limit))
        .fetch_all(&store.pool)
        .await
        .db()?;
    session_page(rows, &params, now, &mut &store.pool).await
}

impl HeldLeases<i64> for &SqlitePool {
    async fn held(&mut self, session: i64, n: u32) -> Result<Vec<HeldRow<i64>>, StoreError> {
        sqlx::query_as(
            "SELECT process, key, started_at, lease_token FROM drover_items
             WHERE lease_session = ?1 AND state = 'running' ORDER BY lease_token LIMIT ?2",
        )
        .bind(session)
        .bind(i64::from(n))
        .fetch_all(*self)
        .await
        .db()
    }
}

/// The sessions with an id above `?1`, at most `?2` of them, oldest first.
pub(super) fn list_sql() -> String {
    format!(
        "SELECT {SESSION_COLUMNS} FROM drover_sessions s WHERE s.id > ?1 ORDER BY s.id LIMIT ?2"
    )
}

/// The owners of those of `sessions` that exist, in one read.
pub(super) async fn owners(
    store: &SqliteStore,
    sessions: &[SessionId],
) -> Result<HashMap<SessionId, Option<String>>, StoreError> {
    let ids: Vec<i64> = sessions.iter().map(|s| s.0).collect();
    let ids = serde_json::Value::from(ids).to_string();
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT id, owner FROM drover_sessions WHERE id IN (SELECT value FROM json_each(?1))",
    )
    .bind(&ids)
    .fetch_all(&store.pool)
    .await
    .db()?;
    Ok(rows
        .into_iter()
        .map(|(id, owner)| (SessionId(id), owner))
        .collect())
}

/// How many sessions `owner` started that have not expired.
pub(super) async fn count_owned(store: &SqliteStore, owner: &str) -> Result<u64, StoreError> {
    let now = store.now_ms(&store.pool).await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM drover_sessions WHERE owner = ?1 AND deadline > ?2",
    )
    .bind(owner)
    .bind(now)
    .fetch_one(&store.pool)
    .await
    .db()?;
    Ok(u64::try_from(n).unwrap_or(0))
}
