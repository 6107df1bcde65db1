//! Sessions on PostgreSQL: start, heartbeat, close, and reclaiming expired ones.

use chrono::{DateTime, Utc};

use super::engine::{PostgresStore, Tx};
use super::error::{Db as _, commit};
use super::rows::duration_ms;
use crate::store::StoreError;
use crate::store::params::SessionStart;
use crate::store::types::{EventKind, ReclaimReport, Session, SessionId};

pub(super) async fn start(
    store: &PostgresStore,
    params: &SessionStart,
) -> Result<Session, StoreError> {
    let ttl_ms = duration_ms(params.ttl);
    if ttl_ms < 1 {
        return Err(StoreError::InvalidArgument(
            "a session's ttl must be at least 1 ms".into(),
        ));
    }
    let (mut tx, now) = store.write().await?;
    let (id, deadline): (i64, DateTime<Utc>) = sqlx::query_as(
        "INSERT INTO drover_sessions (component, ttl_ms, started_at, heartbeat_at, deadline)
         VALUES ($1, $2, $3, $3, $3 + $2::float8 * interval '1 millisecond')
         RETURNING id, deadline",
    )
    .bind(&params.component)
    .bind(ttl_ms)
    .bind(now)
    .fetch_one(&mut *tx)
    .await
    .db()?;
    commit(tx).await?;
    Ok(Session {
        id: SessionId(id),
        component: params.component.clone(),
        ttl: params.ttl,
        deadline,
    })
}

pub(super) async fn heartbeat(
    store: &PostgresStore,
    session: SessionId,
) -> Result<DateTime<Utc>, StoreError> {
    let (mut tx, now) = store.write().await?;
    let deadline: Option<DateTime<Utc>> = sqlx::query_scalar(
        "UPDATE drover_sessions SET heartbeat_at = $2,
             deadline = $2 + ttl_ms::float8 * interval '1 millisecond'
         WHERE id = $1 AND deadline > $2 RETURNING deadline",
    )
    .bind(session.0)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .db()?;
    let deadline = deadline.ok_or(StoreError::SessionExpired { session })?;
    commit(tx).await?;
    Ok(deadline)
}

pub(super) async fn close(store: &PostgresStore, session: SessionId) -> Result<u64, StoreError> {
    let (mut tx, now) = store.write().await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM drover_items WHERE state = 'running' AND lease_session = $1
         FOR UPDATE",
    )
    .bind(session.0)
    .fetch_all(&mut *tx)
    .await
    .db()?;
    requeue(&mut tx, now, &ids, EventKind::Canceled).await?;
    sqlx::query("DELETE FROM drover_sessions WHERE id = $1")
        .bind(session.0)
        .execute(&mut *tx)
        .await
        .db()?;
    commit(tx).await?;
    Ok(ids.len() as u64)
}

/// Reclaims leases of expired or vanished sessions. Rows another transaction
/// holds are skipped (that transaction is finishing them); a lease skipped here
/// whose session is then deleted is picked up by the next reclaim as an orphan.
pub(super) async fn reclaim(store: &PostgresStore) -> Result<ReclaimReport, StoreError> {
    let (mut tx, now) = store.write().await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT i.id FROM drover_items i WHERE i.state = 'running' AND NOT EXISTS (
             SELECT 1 FROM drover_sessions s WHERE s.id = i.lease_session AND s.deadline > $1)
         FOR UPDATE OF i SKIP LOCKED",
    )
    .bind(now)
    .fetch_all(&mut *tx)
    .await
    .db()?;
    requeue(&mut tx, now, &ids, EventKind::Expired).await?;
    let sessions = sqlx::query("DELETE FROM drover_sessions WHERE deadline <= $1")
        .bind(now)
        .execute(&mut *tx)
        .await
        .db()?
        .rows_affected();
    commit(tx).await?;
    Ok(ReclaimReport {
        sessions,
        leases: ids.len() as u64,
    })
}

/// Turns locked running items back into pending ones without counting a failure:
/// ready at once, keeping the higher of their own and a dirty enqueue's priority,
/// with a `canceled` or `expired` event naming the lost lease.
pub(super) async fn requeue(
    tx: &mut Tx,
    now: DateTime<Utc>,
    ids: &[i64],
    event: EventKind,
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "WITH logged AS (
             INSERT INTO drover_history (at, process, key, event, session, token, attempt)
             SELECT $1, process, key, $2, lease_session, lease_token, failures + 1
             FROM drover_items WHERE id = ANY($3))
         UPDATE drover_items SET state = 'pending', ready_at = $1,
             priority = GREATEST(priority, dirty_priority),
             dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
             lease_session = NULL, lease_token = NULL, started_at = NULL
         WHERE id = ANY($3)",
    )
    .bind(now)
    .bind(event.as_str())
    .bind(ids)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}
