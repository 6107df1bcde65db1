//! [`SqliteStore`] and its [`StoreEngine`] implementation, which delegates each
//! operation to the file named for its noun.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::SqlitePool;

use super::checkpoint::Checkpoints;
use super::claims::Claims;
use super::completions::Completions;
use super::error::Db as _;
use super::rows::to_time;
use super::writer::Writer;
use super::{
    admin, counts, enqueue, gate, groups, inspect, leases, processes, runs, series, sessions,
};
use crate::store::fleet::{Claimed, ProcessPause};
// The seam takes every operation's parameters and returns the domain types.
use crate::store::params::*;
use crate::store::rules::groups::act_where;
use crate::store::rules::parts::complete_in_parts;
use crate::store::rules::written::{Settlements, answers};
use crate::store::rules::{resync, retention};
use crate::store::settings::{ProcessConfigure, ProcessSettings};
use crate::store::types::*;
use crate::store::{Clock, StoreEngine, StoreError};

pub(crate) use super::writer::Tx;

/// The SQLite engine. Cheap to clone; clones share the pool and the clock.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Reads, and the pool handed to reconcilers.
    pub(super) pool: SqlitePool,
    /// The one connection every write transaction of this store uses.
    ///
    /// SQLite admits one writer at a time; with writes spread over the pool,
    /// the claim loop and the completer met on the file lock and the loser slept
    /// in SQLite's busy handler (1, 2, 5, 10 ms…) while the lock was long free.
    /// Queueing for this connection instead hands the lock over the moment it
    /// is released, in arrival order. Other processes on the same file still
    /// meet this one on the busy timeout.
    pub(super) writer: Writer,
    /// The common claims waiting to go together in the writer's next
    /// transaction ([`claims`](super::claims)).
    pub(super) claims: Arc<Claims>,
    /// The common completion batches waiting likewise
    /// ([`completions`](super::completions)).
    pub(super) completions: Arc<Completions>,
    /// The WAL checkpoint task of a file database, stopped with the last clone.
    pub(super) _checkpoints: Option<Checkpoints>,
    pub(super) clock: Clock,
    /// Whether the store's own enqueue inserts into the view `drover_enqueue`
    /// (one key per row) instead of its set-based upsert; see
    /// [`StoreOptions::sqlite_enqueue_through_view`](crate::store::StoreOptions::sqlite_enqueue_through_view).
    pub(super) enqueue_through_view: bool,
}

impl SqliteStore {
    /// [`lease_complete_batch`](StoreEngine::lease_complete_batch), telling
    /// which outcomes an earlier try wrote (see `Store::lease_complete_written`).
    pub(crate) async fn lease_complete_written(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Settlements, StoreError> {
        complete_in_parts(self, batch).await
    }

    /// The connection pool, for reconcilers that keep their own tables in the
    /// same database file (one file to back up, one transaction if they wish).
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The test clock shift this store adds to the database clock.
    #[must_use]
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Closes the pool and the write connection, waiting for connections to
    /// be returned.
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    /// A SQL condition for a user's own candidate query (the BMDB `getMachines`
    /// shape) that is true when `lease_lock` would accept the key: new or idle,
    /// or pending and not backing off and not delayed (its ready time, from
    /// a `RequeueAfter` or an enqueue's `after`, has come). `process` and `key` are spliced in
    /// as SQL — pass placeholders or column names, never user input:
    ///
    /// ```text
    /// SELECT m.id FROM machines m
    /// WHERE m.needs_provisioning AND <candidate_filter("?1", "m.id")>
    /// ```
    #[must_use]
    pub fn candidate_filter(&self, process: &str, key: &str) -> String {
        format!(
            concat!(
                "NOT EXISTS (SELECT 1 FROM drover_items drover_i \
                 WHERE drover_i.process = {process} AND drover_i.key = {key} \
                 AND drover_i.state <> 'idle' AND (drover_i.state <> 'pending' \
                 OR MAX(drover_i.ready_at, COALESCE(drover_i.backoff_until, 0)) > ",
                clock_ms!(),
                " + {offset}))"
            ),
            process = process,
            key = key,
            offset = self.clock.offset_ms()
        )
    }

    /// The database clock in milliseconds, shifted by the test offset.
    pub(super) async fn now_ms<'c, E>(&self, conn: E) -> Result<i64, StoreError>
    where
        E: sqlx::SqliteExecutor<'c>,
    {
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", clock_ms!(), " + ?1"))
            .bind(self.clock.offset_ms())
            .fetch_one(conn)
            .await
            .db()?;
        Ok(now)
    }

    /// Starts a write transaction and reads the clock inside it.
    pub(super) async fn write(&self) -> Result<(Tx, i64), StoreError> {
        let mut tx = self.begin().await?;
        let now = self.now_ms(&mut *tx).await?;
        Ok((tx, now))
    }

    /// Starts a write transaction, for a caller that reads the clock in its
    /// own first statement ([`clock_ms`]): under load every statement is a
    /// wait for the connection's thread and then for the runtime.
    pub(super) async fn begin(&self) -> Result<Tx, StoreError> {
        self.writer.begin().await.db()
    }

    /// The writer, with no statement sent: the caller's first statement
    /// starts with [`begin_immediate!`] (see [`Writer::lock`](super::writer::Writer::lock)).
    pub(super) async fn lock(&self) -> Result<Tx, StoreError> {
        self.writer.lock().await.db()
    }
}

/// The head of a write transaction's first statement when it is opened by
/// [`SqliteStore::lock`]: `BEGIN IMMEDIATE` takes SQLite's write lock at once,
/// so the transaction can never fail half-way on a lock upgrade.
macro_rules! begin_immediate {
    () => {
        "BEGIN IMMEDIATE;\n"
    };
}
pub(super) use begin_immediate;

/// The database clock in milliseconds, as SQL; add the store's test offset
/// ([`Clock::offset_ms`]) to it.
macro_rules! clock_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}
pub(super) use clock_ms;

impl StoreEngine for SqliteStore {
    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        sessions::start(self, params).await
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        sessions::heartbeat(self, params.session).await
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        sessions::close(self, params.session).await
    }

    async fn session_list(
        &self,
        params: SessionList,
    ) -> Result<Page<SessionInfo, SessionId>, StoreError> {
        sessions::list(self, params).await
    }

    async fn session_owners(
        &self,
        sessions: &[crate::store::SessionId],
    ) -> Result<std::collections::HashMap<crate::store::SessionId, Option<String>>, StoreError>
    {
        sessions::owners(self, sessions).await
    }

    async fn session_count_owned(&self, owner: &str) -> Result<u64, StoreError> {
        sessions::count_owned(self, owner).await
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        sessions::reclaim(self).await
    }

    async fn item_enqueue(&self, params: ItemEnqueue) -> Result<EnqueueReport, StoreError> {
        enqueue::enqueue(self, params).await
    }

    async fn lease_claim(&self, params: LeaseClaim) -> Result<Claimed, StoreError> {
        leases::claim(self, params).await
    }

    async fn lease_complete(&self, params: LeaseComplete<'_>) -> Result<(), StoreError> {
        let answers = answers(self.lease_complete_written(&[params]).await?);
        answers.into_iter().next().unwrap_or(Ok(()))
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        Ok(answers(self.lease_complete_written(batch).await?))
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        leases::release(self, params).await
    }

    async fn lease_lock(&self, params: LeaseLock) -> Result<Lease, StoreError> {
        leases::lock(self, params).await
    }

    async fn item_list(&self, params: ItemList) -> Result<Vec<Item>, StoreError> {
        inspect::item_list(self, params).await
    }

    async fn item_triage(&self, params: ItemTriage) -> Result<TriagePage, StoreError> {
        crate::store::rules::triage::page(self, &inspect::TRIAGE, params).await
    }

    async fn item_get(&self, params: ItemGet) -> Result<Option<ItemDetail>, StoreError> {
        inspect::item_get(self, params).await
    }

    async fn item_retry(&self, params: ItemRetry) -> Result<Option<Item>, StoreError> {
        admin::retry(self, params).await
    }

    async fn item_park(&self, params: ItemPark) -> Result<Option<Item>, StoreError> {
        admin::park(self, params).await
    }

    async fn item_delete(&self, params: ItemDelete) -> Result<bool, StoreError> {
        admin::delete(self, params).await
    }

    async fn error_groups(&self, params: ErrorGroups) -> Result<Vec<ErrorGroup>, StoreError> {
        groups::error_groups(self, params).await
    }

    async fn items_retry_where(&self, params: ItemsRetry) -> Result<u64, StoreError> {
        act_where(self, params.into()).await
    }

    async fn items_park_where(&self, params: ItemsPark) -> Result<u64, StoreError> {
        act_where(self, params.into()).await
    }

    async fn items_delete_where(&self, params: ItemsDelete) -> Result<u64, StoreError> {
        act_where(self, params.into()).await
    }

    async fn history_activity(
        &self,
        params: HistoryActivity,
    ) -> Result<Page<ProcessActivity>, StoreError> {
        admin::activity(self, params).await
    }

    async fn run_list(&self, params: RunList) -> Result<Vec<Run>, StoreError> {
        runs::list(self, params).await
    }

    async fn retention_prune(&self, params: RetentionPrune) -> Result<PruneReport, StoreError> {
        retention::prune(self, params).await
    }

    async fn prune_turn(&self, params: PruneTurn) -> Result<bool, StoreError> {
        runs::prune_turn(self, &params).await
    }

    async fn resync_batch(&self, params: ResyncBatch) -> Result<ResyncReport, StoreError> {
        resync::batch(self, &params).await
    }

    async fn process_series(&self, params: ProcessSeries) -> Result<Series, StoreError> {
        series::process_series(self, params).await
    }

    async fn depth_sample(&self, params: DepthSample) -> Result<u64, StoreError> {
        series::depth_sample(self, params).await
    }

    async fn process_counts(&self, page: ProcessPage) -> Result<Page<ProcessCounts>, StoreError> {
        counts::process_counts(self, page).await
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        processes::configure(self, params).await
    }

    async fn process_pause(&self, params: ProcessPause) -> Result<bool, StoreError> {
        gate::pause(self, params).await
    }

    async fn process_settings(
        &self,
        page: ProcessPage,
    ) -> Result<Page<ProcessSettings>, StoreError> {
        processes::page(self, page).await
    }

    async fn process_get(&self, process: &str) -> Result<Option<ProcessSettings>, StoreError> {
        processes::get(self, process).await
    }

    async fn clock_now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(to_time(self.now_ms(&self.pool).await?))
    }
}
