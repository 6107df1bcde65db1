//! [`PostgresStore`] and its [`StoreEngine`] implementation, which delegates each
//! operation to the file named for its noun, retrying lost races.

use crate::store::exec::Exec as _;
use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::claims::Claims;
use super::completions::{self, Completions};
use super::counts::Folds;
use super::error::Db as _;
use super::failover::Failover;
use super::gated::GatedProcesses;
use super::listen::Listener;
use super::retry::{bounded, retry, watched};
use super::statistics::Statistics;
use super::{
    admin, counts, enqueue, gate, groups, inspect, leases, processes, runs, series, sessions,
};
use crate::store::fleet::{Claimed, ProcessPause};
// The seam takes every operation's parameters and returns the domain types.
use crate::store::params::*;
use crate::store::rules::groups::act_where;
use crate::store::rules::written::{Settlements, answers};
use crate::store::rules::{resync, retention};
use crate::store::settings::{ProcessConfigure, ProcessSettings};
use crate::store::types::*;
use crate::store::{Clock, StoreEngine, StoreError};

pub(crate) use super::tx::Tx;

/// The database clock, shifted by the test offset bound as the parameter `$1`.
///
/// `clock_timestamp()`, the time the statement reads it, not `now()`, the
/// transaction's start: a writer reads the clock again after the statements
/// that may wait on row locks, so a delay or a backoff it stores is measured
/// from when it is written, not shortened by the wait.
pub(super) const NOW: &str = "SELECT clock_timestamp() + $1::float8 * interval '1 millisecond'";

/// How long a transaction may wait for a connection before the store looks
/// for another host (see [`PostgresStore::connecting`]).
const SLOW_BEGIN: Duration = Duration::from_millis(300);

/// The PostgreSQL engine. Cheap to clone; clones share the pool and the clock.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pub(super) pool: PgPool,
    pub(super) clock: Clock,
    /// Keeps the planner's statistics fresh after bulk enqueues.
    pub(super) statistics: Arc<Statistics>,
    /// The claims waiting to run together in the next statement.
    pub(super) claims: Arc<Claims>,
    /// The batches of outcomes waiting to be written together in the next
    /// transaction.
    pub(super) completions: Arc<Completions>,
    /// Folds the item counts' deltas in behind limited claims.
    pub(super) folds: Arc<Folds>,
    /// The `LISTEN` task, started by the first [`subscribe`](Self::subscribe).
    pub(super) listener: Arc<OnceLock<Listener>>,
    /// Whether the server is reached through a pooler in transaction mode
    /// (see [`Tx`]).
    pub(crate) pooled: bool,
    /// Where `LISTEN` connects: the store's own pool directly connected; a
    /// direct connection's pool (`StoreOptions::listen_url`) through a
    /// pooler, or none (waiters then poll).
    pub(super) listen: Option<PgPool>,
    /// The URL's hosts and which pooled connections may be reused.
    pub(super) failover: Arc<Failover>,
    /// The host the pool's connect options point at.
    pub(super) at: Arc<AtomicUsize>,
    /// The processes whose claims go straight to `drover_claim_gated`.
    pub(super) gated: Arc<GatedProcesses>,
    /// What a caller's transaction ([`Store::begin`](crate::store::Store::begin))
    /// starts with: `BEGIN` and its own idle timeout
    /// ([`StoreOptions::caller_idle_timeout`](crate::store::StoreOptions::caller_idle_timeout)).
    pub(super) caller_begin: Arc<str>,
    /// Whether this store's write transactions give up a lock wait of more
    /// than [`STALL`](crate::store::grouped::STALL): the clone a completion
    /// group of several callers writes through (see
    /// [`stepping_aside`](Self::stepping_aside)).
    pub(super) steps_aside: bool,
}

impl PostgresStore {
    /// [`lease_complete_batch`](StoreEngine::lease_complete_batch), telling
    /// which outcomes an earlier try wrote (see `Store::lease_complete_written`).
    pub(crate) async fn lease_complete_written(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Settlements, StoreError> {
        completions::complete(self, batch).await
    }

    /// The connection pool, for reconcilers that keep their own tables in the
    /// same database, and for `LISTEN`ing on [`notify_channel`](Self::notify_channel).
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The test clock shift this store adds to the database clock.
    #[must_use]
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Closes the pool, waiting for connections to be returned, and stops
    /// listening for notifications.
    pub async fn close(&self) {
        if let Some(listener) = self.listener.get() {
            listener.stop();
        }
        self.pool.close().await;
    }

    /// Makes notifications of `process` from every node (enqueues, retries,
    /// dirty completions, keys given back) fire this process's wake-up signal, through one
    /// `LISTEN` connection per store started on first use. Through a pooler
    /// in transaction mode, which cannot keep a `LISTEN` (the server behind
    /// the connection changes), it listens on the direct connection given as
    /// [`StoreOptions::listen_url`](crate::store::StoreOptions::listen_url),
    /// and without one does nothing: waiters poll. A store listens on at
    /// most 1,024 processes at once; to make room it stops listening on
    /// those whose wake-up signal ([`Store::wakeup`](crate::store::Store::wakeup))
    /// nobody in this process holds, so call it through
    /// [`Store::subscribe`](crate::store::Store::subscribe), which holds the
    /// signal for you. Must be called inside a Tokio runtime.
    pub fn subscribe(&self, process: &str) {
        let Some(listen) = &self.listen else { return };
        self.listener
            .get_or_init(|| Listener::start(listen.clone(), self.failover.subscribe()))
            .subscribe(process);
    }

    /// The channel an enqueue to `process` notifies (`LISTEN` on it to wake up
    /// instead of polling): `drover_` + the name when it is a short lower-case
    /// identifier, otherwise `drover_` + a stable hash of it (PostgreSQL channel
    /// names are at most 63 bytes). Notifications are only a hint: poll too.
    #[must_use]
    pub fn notify_channel(process: &str) -> String {
        let plain = process.len() <= 48
            && process
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if plain {
            return format!("drover_{process}");
        }
        // FNV-1a: stable across Rust versions and platforms, unlike std's hasher.
        let hash = process.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("drover_{hash:016x}")
    }

    /// Queues a notification on `process`'s channel in `tx`: PostgreSQL sends
    /// it when `tx` commits, so listeners on every node claim at once instead
    /// of at their next poll.
    pub(super) async fn notify_ready(tx: &mut Tx, process: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(Self::notify_channel(process))
            .exec(&mut *tx)
            .await?;
        Ok(())
    }

    /// [`notify_ready`](Self::notify_ready) for each of `processes`, in one
    /// statement (a batch's or a reclaim's keys may span many processes:
    /// one round trip, not one each); none for none.
    pub(super) async fn notify_ready_all<'a>(
        tx: &mut Tx,
        processes: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), StoreError> {
        let channels: Vec<String> = processes.into_iter().map(Self::notify_channel).collect();
        if channels.is_empty() {
            return Ok(());
        }
        sqlx::query("SELECT pg_notify(c, '') FROM unnest($1::text[]) AS c")
            .bind(channels)
            .exec(&mut *tx)
            .await?;
        Ok(())
    }

    /// Notifies `process`'s channel at once (outside any transaction).
    pub(crate) async fn notify(&self, process: &str) -> Result<(), StoreError> {
        let mut tx = self.read().await?;
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(Self::notify_channel(process))
            .exec(&mut tx)
            .await?;
        tx.commit().await.db()
    }

    /// A SQL condition for a user's own candidate query (the BMDB `getMachines`
    /// shape) that is true when `lease_lock` would accept the key: new or idle,
    /// or pending and not backing off and not delayed (its ready time, from
    /// a `RequeueAfter` or an enqueue's `after`, has come). `process` and `key` are spliced in
    /// as SQL — pass placeholders or column names, never user input:
    ///
    /// ```text
    /// SELECT m.id FROM machines m
    /// WHERE m.needs_provisioning AND <candidate_filter("$1", "m.id")>
    /// ```
    #[must_use]
    pub fn candidate_filter(&self, process: &str, key: &str) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM drover_items drover_i \
             WHERE drover_i.process = {process} AND drover_i.key = {key} \
             AND drover_i.state <> 'idle' AND (drover_i.state <> 'pending' \
             OR GREATEST(drover_i.ready_at, drover_i.backoff_until) > {now}))",
            now = format_args!(
                "clock_timestamp() + {} * interval '1 millisecond'",
                self.clock.offset_ms()
            )
        )
    }

    /// The database clock, shifted by the test offset.
    pub(super) async fn now<'c, E>(&self, conn: E) -> Result<DateTime<Utc>, StoreError>
    where
        E: sqlx::PgExecutor<'c>,
    {
        sqlx::query_scalar(NOW)
            .bind(self.clock.offset_ms())
            .fetch_one(conn)
            .await
            .db()
    }

    /// Starts a transaction (see [`connecting`](Self::connecting)), for a
    /// writer that reads no clock or reads it after taking its locks.
    pub(super) async fn begin(&self) -> Result<Tx, StoreError> {
        if self.steps_aside {
            return self
                .connecting(Tx::begin_stepping_aside(&self.pool, self.pooled))
                .await
                .db();
        }
        self.connecting(Tx::begin(&self.pool, self.pooled))
            .await
            .db()
    }

    /// This store, its write transactions giving up a lock wait of more
    /// than [`STALL`](crate::store::grouped::STALL) with `Busy`, nothing
    /// written, and not retrying it. A completion group of several callers
    /// writes so: one caller's transaction that keeps a row of the group
    /// locked while the caller waits for its own completion in that group
    /// (an enqueue into a running key, then a completion, before its commit)
    /// would otherwise wait for the group while the group waits for it,
    /// until the caller's idle timeout ended its transaction. Stepped aside,
    /// each request runs on its own, as before the grouping.
    pub(super) fn stepping_aside(&self) -> Self {
        Self {
            steps_aside: true,
            ..self.clone()
        }
    }

    /// Starts a transaction and reads the clock inside it.
    pub(super) async fn write(&self) -> Result<(Tx, DateTime<Utc>), StoreError> {
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        Ok((tx, now))
    }

    /// A connection for reads (a transaction through a pooler, see [`Tx`]);
    /// end it with `commit`.
    pub(super) async fn read(&self) -> Result<Tx, StoreError> {
        self.connecting(Tx::read(&self.pool, self.pooled))
            .await
            .db()
    }

    /// Awaits `begin` (a transaction's start, which takes a pooled
    /// connection); one that waits longer than [`SLOW_BEGIN`] (the pool
    /// cannot connect: a dead primary refuses, and the pool retries it)
    /// starts a search for the host that now accepts writes, when the URL
    /// names several.
    pub(super) async fn connecting<T>(&self, begin: impl Future<Output = T>) -> T {
        self.failover.follow(&self.pool, &self.at);
        let begin = std::pin::pin!(begin);
        let mut begin = begin;
        tokio::select! {
            done = &mut begin => done,
            () = tokio::time::sleep(SLOW_BEGIN) => {
                self.failover.search(&self.pool, &self.at);
                begin.await
            }
        }
    }

    /// The database clock, read on its own.
    pub(super) async fn clock_read(&self) -> Result<DateTime<Utc>, StoreError> {
        let mut tx = self.read().await?;
        let now = self.now(&mut tx).await?;
        tx.commit().await.db()?;
        Ok(now)
    }
}

impl StoreEngine for PostgresStore {
    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        bounded(self, retry(self, || sessions::start(self, &params))).await
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        bounded(
            self,
            retry(self, || sessions::heartbeat(self, params.session)),
        )
        .await
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        bounded(self, retry(self, || sessions::close(self, params.session))).await
    }

    async fn session_list(
        &self,
        params: SessionList,
    ) -> Result<Page<SessionInfo, SessionId>, StoreError> {
        watched(self, sessions::list(self, params)).await
    }

    async fn session_owners(
        &self,
        sessions: &[crate::store::SessionId],
    ) -> Result<std::collections::HashMap<crate::store::SessionId, Option<String>>, StoreError>
    {
        watched(self, sessions::owners(self, sessions)).await
    }

    async fn session_count_owned(&self, owner: &str) -> Result<u64, StoreError> {
        watched(self, sessions::count_owned(self, owner)).await
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        let report = bounded(self, retry(self, || sessions::reclaim(self))).await?;
        // Housekeeping every live node already runs every few seconds: keeps
        // the item counts' deltas short even when nobody reads the counts.
        bounded(self, retry(self, || counts::fold(self))).await?;
        Ok(report)
    }

    async fn item_enqueue(&self, params: ItemEnqueue) -> Result<EnqueueReport, StoreError> {
        retry(self, || enqueue::enqueue(self, &params)).await
    }

    async fn lease_claim(&self, params: LeaseClaim) -> Result<Claimed, StoreError> {
        retry(self, || leases::claim(self, &params)).await
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
        bounded(self, retry(self, || leases::release(self, params))).await
    }

    async fn lease_lock(&self, params: LeaseLock) -> Result<Lease, StoreError> {
        bounded(self, retry(self, || leases::lock(self, &params))).await
    }

    async fn item_list(&self, params: ItemList) -> Result<Vec<Item>, StoreError> {
        watched(self, inspect::item_list(self, &params)).await
    }

    async fn item_triage(&self, params: ItemTriage) -> Result<TriagePage, StoreError> {
        watched(
            self,
            crate::store::rules::triage::page(self, &inspect::TRIAGE, params),
        )
        .await
    }

    async fn item_get(&self, params: ItemGet) -> Result<Option<ItemDetail>, StoreError> {
        watched(self, inspect::item_get(self, &params)).await
    }

    async fn item_retry(&self, params: ItemRetry) -> Result<Option<Item>, StoreError> {
        retry(self, || admin::retry(self, &params)).await
    }

    async fn item_park(&self, params: ItemPark) -> Result<Option<Item>, StoreError> {
        retry(self, || admin::park(self, &params)).await
    }

    async fn item_delete(&self, params: ItemDelete) -> Result<bool, StoreError> {
        retry(self, || admin::delete(self, &params)).await
    }

    async fn error_groups(&self, params: ErrorGroups) -> Result<Vec<ErrorGroup>, StoreError> {
        watched(self, groups::error_groups(self, &params)).await
    }

    async fn items_retry_where(&self, params: ItemsRetry) -> Result<u64, StoreError> {
        watched(self, act_where(self, params.into())).await
    }

    async fn items_park_where(&self, params: ItemsPark) -> Result<u64, StoreError> {
        watched(self, act_where(self, params.into())).await
    }

    async fn items_delete_where(&self, params: ItemsDelete) -> Result<u64, StoreError> {
        watched(self, act_where(self, params.into())).await
    }

    async fn history_activity(
        &self,
        params: HistoryActivity,
    ) -> Result<Page<ProcessActivity>, StoreError> {
        watched(self, admin::activity(self, params)).await
    }

    async fn run_list(&self, params: RunList) -> Result<Vec<Run>, StoreError> {
        watched(self, runs::list(self, &params)).await
    }

    async fn retention_prune(&self, params: RetentionPrune) -> Result<PruneReport, StoreError> {
        retry(self, || retention::prune(self, params.clone())).await
    }

    async fn prune_turn(&self, params: PruneTurn) -> Result<bool, StoreError> {
        retry(self, || runs::prune_turn(self, &params)).await
    }

    async fn resync_batch(&self, params: ResyncBatch) -> Result<ResyncReport, StoreError> {
        retry(self, || resync::batch(self, &params)).await
    }

    async fn process_series(&self, params: ProcessSeries) -> Result<Series, StoreError> {
        watched(self, series::process_series(self, params)).await
    }

    async fn depth_sample(&self, params: DepthSample) -> Result<u64, StoreError> {
        watched(self, series::depth_sample(self, params)).await
    }

    async fn process_counts(&self, page: ProcessPage) -> Result<Page<ProcessCounts>, StoreError> {
        watched(self, counts::process_counts(self, page)).await
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        retry(self, || processes::configure(self, &params)).await
    }

    async fn process_pause(&self, params: ProcessPause) -> Result<bool, StoreError> {
        retry(self, || gate::pause(self, &params)).await
    }

    async fn process_settings(
        &self,
        page: ProcessPage,
    ) -> Result<Page<ProcessSettings>, StoreError> {
        watched(self, processes::page(self, page)).await
    }

    async fn process_get(&self, process: &str) -> Result<Option<ProcessSettings>, StoreError> {
        watched(self, processes::get(self, process)).await
    }

    async fn clock_now(&self) -> Result<DateTime<Utc>, StoreError> {
        watched(self, self.clock_read()).await
    }
}
