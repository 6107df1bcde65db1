//! PostgreSQL rows and their conversion to domain types.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backoff::clamp_delay;
use crate::store::StoreError;
use crate::store::decode::{backoff_policy, event_kind, item_state};
use crate::store::holding::Held;
use crate::store::settle::{Dirty, Running};
use crate::store::types::{FencingToken, HistoryEvent, Item, SessionId};

/// A duration as whole milliseconds, clamped to drover's maximum delay.
pub(super) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(clamp_delay(d).as_millis()).unwrap_or(i64::MAX)
}

/// Every column of `drover_items` that the domain [`Item`] shows.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct ItemRow {
    process: String,
    key: String,
    state: String,
    priority: i32,
    ready_at: DateTime<Utc>,
    enqueued_at: DateTime<Utc>,
    failures: i32,
    backoff_until: Option<DateTime<Utc>>,
    last_error: Option<String>,
    dirty_since: Option<DateTime<Utc>>,
    lease_session: Option<i64>,
    lease_token: Option<i64>,
    started_at: Option<DateTime<Utc>>,
}

/// `SELECT <this> FROM drover_items` yields an [`ItemRow`].
macro_rules! item_columns {
    () => {
        "process, key, state, priority, ready_at, enqueued_at, failures, backoff_until, \
         last_error, dirty_since, lease_session, lease_token, started_at"
    };
}
pub(super) use item_columns;

impl ItemRow {
    /// The domain item as seen at `now` (a pending item still backing off shows as
    /// `backoff`).
    pub(super) fn into_item(self, now: DateTime<Utc>) -> Result<Item, StoreError> {
        let backing_off = self.backoff_until.is_some_and(|b| b > now);
        Ok(Item {
            state: item_state(&self.state, backing_off)?,
            process: self.process,
            key: self.key,
            priority: self.priority,
            ready_at: self.ready_at,
            enqueued_at: self.enqueued_at,
            failures: u32::try_from(self.failures).unwrap_or(0),
            backoff_until: self.backoff_until,
            last_error: self.last_error,
            dirty: self.dirty_since.is_some(),
            lease_session: self.lease_session.map(SessionId),
            lease_token: self.lease_token.map(FencingToken),
            started_at: self.started_at,
        })
    }
}

/// A running item with its process's backoff policy, as `lease_complete` reads it.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct RunningRow {
    pub(super) id: i64,
    priority: i32,
    failures: i32,
    enqueued_at: DateTime<Utc>,
    dirty_since: Option<DateTime<Utc>>,
    dirty_ready_at: Option<DateTime<Utc>>,
    dirty_priority: Option<i32>,
    backoff_initial_ms: Option<i64>,
    backoff_factor: Option<f64>,
    backoff_max_ms: Option<i64>,
    backoff_jitter: Option<f64>,
}

impl Held for RunningRow {
    fn id(&self) -> i64 {
        self.id
    }

    fn running(&self) -> Running {
        let dirty = self.dirty_since.map(|since| Dirty {
            since,
            ready_at: self.dirty_ready_at.unwrap_or(since),
            priority: self.dirty_priority.unwrap_or(self.priority),
        });
        Running {
            priority: self.priority,
            failures: u32::try_from(self.failures).unwrap_or(0),
            enqueued_at: self.enqueued_at,
            dirty,
            backoff: backoff_policy(
                self.backoff_initial_ms,
                self.backoff_factor,
                self.backoff_max_ms,
                self.backoff_jitter,
            ),
        }
    }
}

/// A `drover_history` row.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct HistoryRow {
    id: i64,
    at: DateTime<Utc>,
    process: String,
    key: String,
    event: String,
    session: Option<i64>,
    attempt: Option<i32>,
    error: Option<String>,
    transient: Option<bool>,
}

impl HistoryRow {
    /// The domain event.
    pub(super) fn into_event(self) -> Result<HistoryEvent, StoreError> {
        Ok(HistoryEvent {
            id: self.id,
            at: self.at,
            event: event_kind(&self.event)?,
            process: self.process,
            key: self.key,
            session: self.session.map(SessionId),
            attempt: self.attempt.and_then(|a| u32::try_from(a).ok()),
            error: self.error,
            transient: self.transient,
        })
    }
}
