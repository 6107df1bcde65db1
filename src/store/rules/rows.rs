//! The rows both engines read, generic over how an engine stores a time
//! (PostgreSQL's `TIMESTAMPTZ`, SQLite's integer milliseconds), so an item, a
//! running item and a run are decoded into domain types in one place.

use chrono::{DateTime, Utc};

use super::decode::{backoff_policy, item_state, run_outcome};
use super::holding::Held;
use super::settle::{Dirty, Running};
use crate::store::params::{SessionList, WorkerIdentity};
use crate::store::types::{FencingToken, HeldLease, Item, Page, Run, SessionId, SessionInfo};
use crate::store::{StoreError, TraceId};

/// A duration as whole milliseconds, clamped to drover's maximum delay: how
/// both engines store a delay or a TTL.
pub(crate) fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(crate::backoff::clamp_delay(d).as_millis()).unwrap_or(i64::MAX)
}

/// The longest retention or resync period a process may set: 100 years. A
/// period is a setting the operator chose, kept as given, unlike a delay
/// (which drover clamps to 180 days); bounded so that a time plus or minus it
/// stays an integer in SQLite and a timestamp in PostgreSQL.
/// Years of 365.25 days, as the CLI's durations count them (`100y`).
pub(crate) const MAX_PERIOD: std::time::Duration =
    std::time::Duration::from_secs(36_525 * 24 * 60 * 60);

/// A retention or resync period as whole milliseconds, as given (up to
/// [`MAX_PERIOD`], which `checked` holds settings to; longer saturates there).
pub(crate) fn period_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.min(MAX_PERIOD).as_millis()).unwrap_or(i64::MAX)
}

/// A time as an engine stores it.
pub(crate) trait Stamp: Copy + Ord {
    /// The time it stands for.
    fn time(self) -> DateTime<Utc>;
}

impl Stamp for DateTime<Utc> {
    fn time(self) -> DateTime<Utc> {
        self
    }
}

impl Stamp for i64 {
    /// Milliseconds since the epoch; out-of-range values saturate.
    fn time(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self).unwrap_or(if self < 0 {
            DateTime::<Utc>::MIN_UTC
        } else {
            DateTime::<Utc>::MAX_UTC
        })
    }
}

/// Text as an engine stores it, read with any bytes that are not UTF-8
/// replaced by U+FFFD.
///
/// drover writes only UTF-8, and PostgreSQL stores nothing else, but SQLite
/// keeps whatever bytes SQL hands it as text: a key written into
/// `drover_items` by hand, or through `drover_enqueue` before migration 0014
/// refused it. Read as a `String`, one such key failed every list that met it
/// (the process page, triage, runs, bulk actions) with an internal error, so
/// the operator could not even see it. Read this way it shows as the claim
/// that parks it describes it. Only where keys are listed: where a key is
/// matched or handed to a worker, an exact decode still refuses it.
#[derive(Debug)]
pub(crate) struct Lossy(pub(crate) String);

#[cfg(feature = "sqlite")]
impl sqlx::Type<sqlx::Sqlite> for Lossy {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <String as sqlx::Type<sqlx::Sqlite>>::type_info()
    }

    fn compatible(ty: &sqlx::sqlite::SqliteTypeInfo) -> bool {
        <[u8] as sqlx::Type<sqlx::Sqlite>>::compatible(ty)
    }
}

#[cfg(feature = "sqlite")]
impl<'r> sqlx::Decode<'r, sqlx::Sqlite> for Lossy {
    fn decode(value: sqlx::sqlite::SqliteValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let bytes = <&[u8] as sqlx::Decode<sqlx::Sqlite>>::decode(value)?;
        Ok(Self(String::from_utf8_lossy(bytes).into_owned()))
    }
}

#[cfg(feature = "postgres")]
impl sqlx::Type<sqlx::Postgres> for Lossy {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

#[cfg(feature = "postgres")]
impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Lossy {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <String as sqlx::Decode<sqlx::Postgres>>::decode(value).map(Self)
    }
}

/// Every column of `drover_items` that the domain [`Item`] shows.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ItemRow<T> {
    process: String,
    key: Lossy,
    state: String,
    priority: i32,
    ready_at: T,
    enqueued_at: T,
    failures: i32,
    backoff_until: Option<T>,
    last_error: Option<String>,
    dirty_since: Option<T>,
    lease_session: Option<i64>,
    lease_token: Option<i64>,
    started_at: Option<T>,
    first_enqueued_at: Option<T>,
    last_enqueued_at: Option<T>,
    enqueue_count: i64,
    last_outcome: Option<String>,
    last_ended_at: Option<T>,
}

/// `SELECT <this> FROM drover_items` yields an [`ItemRow`] on PostgreSQL,
/// whose columns hold their types. SQLite reads its own, each number cast
/// (`src/store/sqlite/rows.rs`).
#[cfg(feature = "postgres")]
macro_rules! item_columns {
    () => {
        "process, key, state, priority, ready_at, enqueued_at, failures, backoff_until, \
         last_error, dirty_since, lease_session, lease_token, started_at, first_enqueued_at, \
         last_enqueued_at, enqueue_count, last_outcome, last_ended_at"
    };
}
#[cfg(feature = "postgres")]
pub(crate) use item_columns;

impl<T: Stamp> ItemRow<T> {
    /// The domain item as seen at `now` (a pending item still backing off shows as
    /// `backoff`).
    pub(crate) fn into_item(self, now: T) -> Result<Item, StoreError> {
        let backing_off = self.backoff_until.is_some_and(|b| b > now);
        Ok(Item {
            state: item_state(&self.state, backing_off)?,
            process: self.process,
            key: self.key.0,
            priority: self.priority,
            ready_at: self.ready_at.time(),
            enqueued_at: self.enqueued_at.time(),
            failures: u32::try_from(self.failures).unwrap_or(0),
            backoff_until: self.backoff_until.map(Stamp::time),
            last_error: self.last_error,
            dirty: self.dirty_since.is_some(),
            lease_session: self.lease_session.map(SessionId),
            lease_token: self.lease_token.map(FencingToken),
            started_at: self.started_at.map(Stamp::time),
            first_enqueued_at: self.first_enqueued_at.map(Stamp::time),
            last_enqueued_at: self.last_enqueued_at.map(Stamp::time),
            enqueue_count: u64::try_from(self.enqueue_count).unwrap_or(0),
            last_outcome: self.last_outcome.as_deref().map(run_outcome).transpose()?,
            last_ended_at: self.last_ended_at.map(Stamp::time),
        })
    }
}

/// A running item with its process's backoff policy, as a completion reads
/// it: what [`settle`](super::settle::settle) needs.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RunningRow<T> {
    pub(crate) id: i64,
    priority: i32,
    failures: i32,
    enqueued_at: T,
    dirty_since: Option<T>,
    dirty_ready_at: Option<T>,
    dirty_priority: Option<i32>,
    backoff_initial_ms: Option<i64>,
    backoff_factor: Option<f64>,
    backoff_max_ms: Option<i64>,
    backoff_jitter: Option<f64>,
}

/// `SELECT <this> FROM drover_items i LEFT JOIN drover_processes p …` yields a
/// [`RunningRow`].
macro_rules! running_columns {
    () => {
        "i.id, i.priority, i.failures, i.enqueued_at, i.dirty_since, \
         i.dirty_ready_at, i.dirty_priority, p.backoff_initial_ms, p.backoff_factor, \
         p.backoff_max_ms, p.backoff_jitter"
    };
}
pub(crate) use running_columns;

impl<T: Stamp> Held for RunningRow<T> {
    fn id(&self) -> i64 {
        self.id
    }

    fn running(&self) -> Running {
        let dirty = self.dirty_since.map(|since| Dirty {
            since: since.time(),
            ready_at: self.dirty_ready_at.unwrap_or(since).time(),
            priority: self.dirty_priority.unwrap_or(self.priority),
        });
        Running {
            priority: self.priority,
            failures: u32::try_from(self.failures).unwrap_or(0),
            enqueued_at: self.enqueued_at.time(),
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

/// A `drover_runs` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RunRow<T> {
    id: i64,
    process: String,
    key: Lossy,
    outcome: String,
    attempt: Option<i32>,
    session: Option<i64>,
    token: Option<i64>,
    pending_since: Option<T>,
    started_at: Option<T>,
    ended_at: T,
    error: Option<String>,
    actor: Option<String>,
    trace_id: Option<String>,
}

/// `SELECT <this> FROM drover_runs` yields a [`RunRow`].
macro_rules! run_columns {
    () => {
        "id, process, key, outcome, attempt, session, token, pending_since, started_at, \
         ended_at, error, actor, trace_id"
    };
}
pub(crate) use run_columns;

impl<T: Stamp> RunRow<T> {
    /// The domain run.
    pub(crate) fn into_run(self) -> Result<Run, StoreError> {
        Ok(Run {
            id: self.id,
            outcome: run_outcome(&self.outcome)?,
            process: self.process,
            key: self.key.0,
            attempt: self.attempt.and_then(|a| u32::try_from(a).ok()),
            session: self.session.map(SessionId),
            token: self.token.map(FencingToken),
            pending_since: self.pending_since.map(Stamp::time),
            started_at: self.started_at.map(Stamp::time),
            ended_at: self.ended_at.time(),
            error: self.error,
            actor: self.actor,
            // A hand-written value that is not a trace id is no link.
            trace_id: self.trace_id.and_then(|t| TraceId::parse(&t).ok()),
        })
    }
}

/// Decodes every row, failing on the first that does not decode.
pub(crate) fn runs<T: Stamp>(rows: Vec<RunRow<T>>) -> Result<Vec<Run>, StoreError> {
    rows.into_iter().map(RunRow::into_run).collect()
}

/// An item row with its id, for the keyset of
/// [`item_triage`](crate::store::StoreEngine::item_triage).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PagedRow<T> {
    id: i64,
    #[sqlx(flatten)]
    item: ItemRow<T>,
}

impl<T: Stamp> PagedRow<T> {
    /// The keyset id and the domain item as seen at `now`.
    pub(crate) fn into_paged(self, now: T) -> Result<(i64, Item), StoreError> {
        Ok((self.id, self.item.into_item(now)?))
    }
}

/// A `drover_sessions` row as the workers page reads it, with its lease count.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SessionRow<T> {
    id: i64,
    component: String,
    ttl_ms: i64,
    started_at: T,
    heartbeat_at: T,
    deadline: T,
    host: Option<String>,
    pid: Option<i64>,
    version: Option<String>,
    lease_count: i64,
}

/// The columns of a [`SessionRow`] from `drover_sessions s`.
pub(crate) const SESSION_COLUMNS: &str = "s.id, s.component, s.ttl_ms, s.started_at, \
    s.heartbeat_at, s.deadline, s.host, s.pid, s.version, (SELECT count(*) FROM drover_items i \
    WHERE i.lease_session = s.id AND i.state = 'running') AS lease_count";

impl<T: Stamp> SessionRow<T> {
    /// The session's id.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// The domain session as seen at `now`, with its listed leases.
    pub(crate) fn into_info(self, now: T, leases: Vec<HeldLease>) -> SessionInfo {
        SessionInfo {
            id: SessionId(self.id),
            component: self.component,
            identity: WorkerIdentity {
                host: self.host,
                pid: self.pid.and_then(|p| u32::try_from(p).ok()),
                version: self.version,
            },
            ttl: std::time::Duration::from_millis(u64::try_from(self.ttl_ms).unwrap_or(0)),
            started_at: self.started_at.time(),
            heartbeat_at: self.heartbeat_at.time(),
            expired: self.deadline <= now,
            deadline: self.deadline.time(),
            lease_count: u64::try_from(self.lease_count).unwrap_or(0),
            leases,
        }
    }
}

/// Where an engine reads the leases a session holds, for [`session_page`].
pub(crate) trait HeldLeases<T> {
    /// The first `n` leases of `session`, oldest token first.
    fn held(
        &mut self,
        session: i64,
        n: u32,
    ) -> impl Future<Output = Result<Vec<HeldRow<T>>, StoreError>> + Send;
}

/// A page of sessions from their rows (read in id order with
/// [`read_limit`](super::pages::read_limit)), each with up to
/// `params.leases_per_session` of its leases read from `held` (not asked at
/// all when none are wanted): the workers page as both engines assemble it.
pub(crate) async fn session_page<T: Stamp>(
    rows: Vec<SessionRow<T>>,
    params: &SessionList,
    now: T,
    held: &mut impl HeldLeases<T>,
) -> Result<Page<SessionInfo, SessionId>, StoreError> {
    let rows = super::pages::cut(rows, params.limit, |r| SessionId(r.id()));
    let mut out = Vec::with_capacity(rows.items.len());
    for row in rows.items {
        let leases = if params.leases_per_session == 0 {
            Vec::new()
        } else {
            let rows = held.held(row.id(), params.leases_per_session).await?;
            rows.into_iter().map(Into::into).collect()
        };
        out.push(row.into_info(now, leases));
    }
    Ok(Page {
        items: out,
        next: rows.next,
    })
}

/// A running item as the workers page lists it under its session.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct HeldRow<T> {
    process: String,
    key: String,
    started_at: Option<T>,
    lease_token: i64,
}

impl<T: Stamp> From<HeldRow<T>> for HeldLease {
    fn from(r: HeldRow<T>) -> Self {
        Self {
            process: r.process,
            key: r.key,
            started_at: r.started_at.map(Stamp::time),
            token: FencingToken(r.lease_token),
        }
    }
}
