//! Completing leases on SQLite, set-based: one statement finds every lease's
//! running row, one deletes the finished items, one appends the history, all in
//! one `BEGIN IMMEDIATE` transaction, so a batch costs a handful of statements
//! and one commit however many outcomes it carries.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use super::engine::{SqliteStore, Tx};
use super::error::Db as _;
use super::rows::{RunningRow, duration_ms, to_ms, to_time};
use crate::store::StoreError;
use crate::store::holding::{Found, asked_sessions, expired_sessions, match_leases, settle_batch};
use crate::store::params::LeaseComplete;
use crate::store::parts::{Answers, CompleteOnce};
use crate::store::settle::{NextRow, Settled};
use crate::store::types::{EventKind, Lease, SessionId};
use crate::store::wakeup;

/// The running rows leased to the live sessions in `?1` under the tokens in
/// `?2` (both JSON arrays of integers): one probe of the `(lease_session,
/// lease_token)` index per lease, with no JSON to pick apart per row. Whether
/// each row is its lease's is decided by [`match_leases`].
pub(super) const HELD: &str = "
SELECT i.process, i.key, i.state, i.lease_token, i.lease_session, i.id, i.priority,
    i.failures, i.enqueued_at, i.dirty_since, i.dirty_ready_at, i.dirty_priority,
    p.backoff_initial_ms, p.backoff_factor, p.backoff_max_ms, p.backoff_jitter
FROM drover_items i LEFT JOIN drover_processes p ON p.process = i.process
WHERE i.state = 'running' AND i.lease_session IN (SELECT value FROM json_each(?1))
    AND i.lease_token IN (SELECT value FROM json_each(?2))";

/// Appends one history row per element of `?2`, a JSON array of
/// `[process, key, event, session, token, attempt, error, transient]`, all at `?1`.
const LOG: &str = "
INSERT INTO drover_history (at, process, key, event, session, token, attempt, error, transient)
SELECT ?1, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
    json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'),
    json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]')
FROM json_each(?2)";

/// Appends event `?2` at `?1` for each running row whose id is in `?3` (a JSON
/// array), its names and lease read from the row itself: half the cost of
/// [`LOG`]'s eight `json_extract` calls per row, for the common run that ends
/// with one plain event. The row is the lease's (matched on session and
/// token), and nothing changes a running row's failures, so `failures + 1` is
/// the lease's attempt.
const LOG_FROM_ROWS: &str = "
INSERT INTO drover_history (at, process, key, event, session, token, attempt)
SELECT ?1, process, key, ?2, lease_session, lease_token, failures + 1 FROM drover_items
WHERE id IN (SELECT value FROM json_each(?3)) ORDER BY lease_token";

/// Settles every lease in one transaction. A lease that was lost or whose
/// session expired gets its own error and changes nothing; the others commit.
/// Any other failure rolls the whole batch back.
pub(super) async fn complete_batch(
    store: &SqliteStore,
    batch: &[LeaseComplete<'_>],
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let (mut tx, now) = store.write().await?;
    let (live, expired) = sessions(&mut tx, now, batch).await?;
    let rows = held(&mut tx, &live, batch).await?;
    let mut writes = Writes::default();
    let settling = settle_batch(to_time(now), batch, rows, &expired, |id, lease, s| {
        writes.add(id, lease, s);
    });
    writes.flush(&mut tx, now).await?;
    tx.commit().await.db()?;
    for process in settling.ready {
        wakeup::notify(process);
    }
    Ok(settling.results)
}

/// Each lease's running row, by position (`None`: not held, see
/// [`match_leases`]).
async fn held(
    tx: &mut Tx,
    live: &[i64],
    batch: &[LeaseComplete<'_>],
) -> Result<Vec<Option<RunningRow>>, StoreError> {
    let tokens: Vec<i64> = batch.iter().map(|p| p.lease.token.0).collect();
    let found: Vec<Found<RunningRow>> = sqlx::query_as(HELD)
        .bind(Value::from(live).to_string())
        .bind(Value::from(tokens).to_string())
        .fetch_all(&mut **tx)
        .await
        .db()?;
    Ok(match_leases(batch, live, found))
}

/// The batch's sessions split into those alive at `now` and those gone or past
/// their deadline.
async fn sessions(
    tx: &mut Tx,
    now: i64,
    batch: &[LeaseComplete<'_>],
) -> Result<(Vec<i64>, HashSet<SessionId>), StoreError> {
    let asked = asked_sessions(batch);
    let live: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM drover_sessions
         WHERE id IN (SELECT value FROM json_each(?1)) AND deadline > ?2",
    )
    .bind(Value::from(asked.clone()).to_string())
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
    /// Runs that end with one event and no error, by event: logged from their
    /// rows ([`LOG_FROM_ROWS`]) before those are deleted or updated.
    plain: HashMap<EventKind, Vec<i64>>,
    /// Every other event, in batch order ([`LOG`]).
    events: Vec<Value>,
}

impl Writes {
    fn add(&mut self, id: i64, lease: &Lease, settled: Settled) {
        match settled.events.as_slice() {
            [event] if event.error.is_none() && event.transient.is_none() => {
                self.plain.entry(event.kind).or_default().push(id);
            }
            events => {
                for e in events {
                    self.events.push(json!([
                        lease.process,
                        lease.key,
                        e.kind.as_str(),
                        lease.session.0,
                        lease.token.0,
                        lease.attempt,
                        e.error,
                        e.transient,
                    ]));
                }
            }
        }
        match settled.next {
            None => self.deleted.push(id),
            Some(next) => self.updated.push((id, next)),
        }
    }

    async fn flush(self, tx: &mut Tx, now: i64) -> Result<(), StoreError> {
        for (kind, ids) in self.plain {
            sqlx::query(LOG_FROM_ROWS)
                .bind(now)
                .bind(kind.as_str())
                .bind(Value::from(ids).to_string())
                .execute(&mut **tx)
                .await
                .db()?;
        }
        if !self.events.is_empty() {
            sqlx::query(LOG)
                .bind(now)
                .bind(Value::from(self.events).to_string())
                .execute(&mut **tx)
                .await
                .db()?;
        }
        if !self.deleted.is_empty() {
            sqlx::query("DELETE FROM drover_items WHERE id IN (SELECT value FROM json_each(?1))")
                .bind(Value::from(self.deleted).to_string())
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
        "UPDATE drover_items SET state = ?2, priority = ?3, ready_at = ?4, enqueued_at = ?5,
             failures = ?6, backoff_until = ?7, backoff_ms = ?8, last_error = ?9,
             dirty_since = NULL, dirty_ready_at = NULL, dirty_priority = NULL,
             lease_session = NULL, lease_token = NULL, started_at = NULL
         WHERE id = ?1",
    )
    .bind(id)
    .bind(if next.parked { "parked" } else { "pending" })
    .bind(next.priority)
    .bind(to_ms(next.ready_at))
    .bind(to_ms(next.enqueued_at))
    .bind(next.failures)
    .bind(next.backoff_until.map(to_ms))
    .bind(next.backoff.map(duration_ms))
    .bind(&next.last_error)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
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
}
