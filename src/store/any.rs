//! [`Store`]: the engine chosen by the database URL's scheme.
//!
//! `Store` has one arm per engine compiled in. A build with neither `sqlite`
//! nor `postgres` (the `client` feature alone) still has the type, so the
//! runner's signatures stay the same, but it can never hold a value:
//! [`Store::connect`] refuses every URL there.
// With no engine compiled in, `Engine` is empty: every dispatch is an empty
// match, so what follows it is unreachable and its parameters unused.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(unreachable_code, unused_variables)
)]

use chrono::{DateTime, Utc};

#[cfg(feature = "postgres")]
use super::PostgresStore;
#[cfg(feature = "sqlite")]
use super::SqliteStore;
use super::error::ENGINE_URLS;
use super::fleet::{Claimed, ProcessPause};
// The seam takes every operation's parameters and returns the domain types.
use super::params::*;
use super::rules::written::{Settlements, answers};
use super::settings::{ProcessConfigure, ProcessSettings};
use super::types::*;
use super::{Clock, StoreEngine, StoreError, StoreOptions, TableWatch, TraceContext};

/// A store on whichever engine the URL names. Cheap to clone; clones share the
/// connection pool and the clock.
///
/// Use it instead of a concrete engine whenever the database is configuration
/// (the CLI, the runner); use [`SqliteStore`] or [`PostgresStore`] directly only
/// for engine-specific features.
#[derive(Debug, Clone)]
pub struct Store {
    engine: Engine,
}

#[derive(Debug, Clone)]
enum Engine {
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

/// Calls the same method on whichever engine the store holds.
macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match $self.engine {
            #[cfg(feature = "sqlite")]
            Engine::Sqlite(ref $store) => $call,
            #[cfg(feature = "postgres")]
            Engine::Postgres(ref $store) => $call,
        }
    };
}

impl Store {
    /// Connects with default [`StoreOptions`] (migrating on connect):
    /// `sqlite://PATH` (created if missing), `sqlite::memory:`, or
    /// `postgres://USER@HOST:PORT/DB`. An unknown scheme or a malformed URL fails
    /// at once; an unreachable server within the connect timeout (5 s).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, &StoreOptions::default()).await
    }

    /// Connects with the given options.
    pub async fn connect_with(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        // Names threads on SQLite (whose names may not hold a NUL: a panic)
        // and connections on PostgreSQL.
        if options.application_name.contains('\0') {
            return Err(StoreError::InvalidArgument(
                "the application name holds a NUL byte; name the store without one".into(),
            ));
        }
        let Some((scheme, _)) = url.split_once(':') else {
            return Err(StoreError::InvalidUrl {
                url: url.to_owned(),
                reason: format!("expected {ENGINE_URLS}"),
            });
        };
        let engine = match scheme {
            #[cfg(feature = "sqlite")]
            "sqlite" => Engine::Sqlite(SqliteStore::connect(url, options).await?),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                Engine::Postgres(PostgresStore::connect(url, options).await?)
            }
            _ => {
                return Err(StoreError::UnsupportedScheme {
                    scheme: scheme.to_owned(),
                });
            }
        };
        Ok(Self { engine })
    }

    /// Applies any embedded migrations the database lacks (what `drover migrate`
    /// runs); a no-op on an up-to-date database.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.migrate().await)
    }

    /// The shift added to the database clock: zero unless a test advances it.
    #[must_use]
    pub fn clock(&self) -> &Clock {
        dispatch!(self, s => s.clock())
    }

    /// A SQL condition that lets a user's own candidate query skip keys that
    /// [`lease_lock`](StoreEngine::lease_lock) would refuse (leased, parked,
    /// backing off or delayed), written for this store's engine; see
    /// [`SqliteStore::candidate_filter`] and [`PostgresStore::candidate_filter`].
    /// `process` and `key` are SQL fragments (a placeholder such as `$1` or `?1`, a
    /// column such as `m.id`), never user input.
    #[must_use]
    pub fn candidate_filter(&self, process: &str, key: &str) -> String {
        dispatch!(self, s => s.candidate_filter(process, key))
    }

    /// The PostgreSQL pool, when the store is on PostgreSQL (see
    /// [`PostgresStore::pool`]).
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn postgres_pool(&self) -> Option<&sqlx::PgPool> {
        self.postgres().map(PostgresStore::pool)
    }

    /// The SQLite pool, when the store is on SQLite (see [`SqliteStore::pool`]).
    #[cfg(feature = "sqlite")]
    #[must_use]
    pub fn sqlite_pool(&self) -> Option<&sqlx::SqlitePool> {
        self.sqlite().map(SqliteStore::pool)
    }

    /// Whether `process` is paused: one row read. For the runner's query
    /// sources, whose claims (locks of their candidates) may try no key at
    /// all, and so hear nothing of a pause that keys they locked ahead must
    /// not start under.
    pub(crate) async fn process_paused(&self, process: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.process_paused(process).await)
    }

    /// The PostgreSQL engine, when the store is on PostgreSQL: for what only
    /// that engine has, such as enqueueing in the caller's transaction
    /// ([`PostgresStore::item_enqueue_in`]).
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn postgres(&self) -> Option<&PostgresStore> {
        match &self.engine {
            Engine::Postgres(s) => Some(s),
            #[cfg(feature = "sqlite")]
            Engine::Sqlite(_) => None,
        }
    }

    /// The SQLite engine, when the store is on SQLite: for what only that
    /// engine has, such as enqueueing in the caller's transaction
    /// ([`SqliteStore::item_enqueue_in`]).
    #[cfg(feature = "sqlite")]
    #[must_use]
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match &self.engine {
            Engine::Sqlite(s) => Some(s),
            #[cfg(feature = "postgres")]
            Engine::Postgres(_) => None,
        }
    }

    /// A snapshot of the connection pool, on either engine.
    #[must_use]
    pub fn pool_stats(&self) -> PoolStats {
        dispatch!(self, s => pool_stats(s.pool()))
    }

    /// Whether the store reaches PostgreSQL through a pooler in transaction
    /// mode (`?pool_mode=transaction`; see [`PostgresStore::subscribe`]).
    #[must_use]
    pub fn transaction_pooled(&self) -> bool {
        #[cfg(feature = "postgres")]
        if let Some(postgres) = self.postgres() {
            return postgres.pooled;
        }
        false
    }

    /// Wakes the claimers of the processes among `processes` that have a
    /// concurrency limit, after runs of theirs ended: a slot came free. In
    /// this OS process at once, and on PostgreSQL on every node (one
    /// notification statement, only for limited processes). A hint: claimers
    /// poll as well, so a failure here is only logged.
    async fn slots_freed(&self, processes: impl Iterator<Item = &str>) {
        for process in super::wakeup::limited_among(processes) {
            super::wakeup::notify(&process);
            #[cfg(feature = "postgres")]
            if let Some(postgres) = self.postgres()
                && let Err(e) = postgres.notify(&process).await
            {
                tracing::debug!(%process, error = %e, "cannot notify a freed slot");
            }
        }
    }

    /// The engine's name: `sqlite` or `postgres`.
    #[must_use]
    pub fn engine_name(&self) -> &'static str {
        match self.engine {
            #[cfg(feature = "sqlite")]
            Engine::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Engine::Postgres(_) => "postgres",
        }
    }

    /// Closes the connection pool.
    pub async fn close(&self) {
        dispatch!(self, s => s.close().await);
    }

    /// Watches a table (see [`TableWatch`]): installs triggers that enqueue
    /// the key of every inserted, updated (filtered by `columns`) and deleted
    /// row to the process, in the transaction that changed it. Returns the
    /// table's name as the store resolved it.
    ///
    /// # Errors
    ///
    /// [`StoreError::Watch`], with nothing installed, for a table or column
    /// that does not exist, a key column whose type cannot be a key, a table
    /// already watched or one of drover's own; [`StoreError::InvalidProcess`].
    pub async fn table_watch(&self, watch: &TableWatch) -> Result<String, StoreError> {
        dispatch!(self, s => s.table_watch(watch).await)
    }

    /// Stops watching `table` (named as for [`table_watch`](Self::table_watch),
    /// by its name now: a watch follows its table through a rename): drops
    /// its triggers. The table's resolved name, or `None` when it was not
    /// watched.
    pub async fn table_unwatch(&self, table: &str) -> Result<Option<String>, StoreError> {
        dispatch!(self, s => s.table_unwatch(table).await)
    }

    /// The watched tables, by their names now, each with the columns it names
    /// that the table no longer has ([`TableWatch::gone`]).
    pub async fn table_watches(&self) -> Result<Vec<TableWatch>, StoreError> {
        dispatch!(self, s => s.table_watches().await)
    }
}

/// The pool's figures, whichever the database.
#[cfg(feature = "_engine")]
fn pool_stats<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> PoolStats {
    PoolStats {
        size: pool.size(),
        idle: u32::try_from(pool.num_idle()).unwrap_or(u32::MAX),
        max: pool.options().get_max_connections(),
    }
}

/// Trace contexts (DESIGN.md rule 14): a link from a failed run to its
/// retry (what a run absorbed comes with its claim: [`Lease::trace_links`]).
impl Store {
    /// Adds `context` to the next run of `lease`'s key, as an enqueue's
    /// context would be: the runner links a retry to the attempt that failed
    /// this way. Only while `lease` holds the key (running, same session and
    /// token, the session alive), else [`StoreError::LeaseLost`] and nothing
    /// is linked: a worker
    /// whose lease was lost must not tie its attempt to the run after
    /// another worker's.
    pub async fn item_trace_link(
        &self,
        lease: &Lease,
        context: &TraceContext,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.item_trace_link(lease, context).await)
    }
}

impl Store {
    /// [`lease_complete_batch`](StoreEngine::lease_complete_batch), telling
    /// for each outcome answered `Ok` whether this call wrote it or an
    /// earlier try did (its answer lost): the server counts an outcome in its
    /// metrics once, however often its worker sends it.
    pub(crate) async fn lease_complete_written(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Settlements, StoreError> {
        let results = dispatch!(self, s => s.lease_complete_written(batch).await?);
        self.slots_freed(batch.iter().map(|c| c.lease.process.as_str()))
            .await;
        Ok(results)
    }
}

impl StoreEngine for Store {
    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        dispatch!(self, s => s.session_start(params).await)
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        dispatch!(self, s => s.session_heartbeat(params).await)
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        dispatch!(self, s => s.session_close(params).await)
    }

    async fn session_list(
        &self,
        params: SessionList,
    ) -> Result<Page<SessionInfo, SessionId>, StoreError> {
        dispatch!(self, s => s.session_list(params).await)
    }

    async fn session_owners(
        &self,
        sessions: &[crate::store::SessionId],
    ) -> Result<std::collections::HashMap<crate::store::SessionId, Option<String>>, StoreError>
    {
        dispatch!(self, s => s.session_owners(sessions).await)
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        dispatch!(self, s => s.session_reclaim().await)
    }

    async fn session_count_owned(&self, owner: &str) -> Result<u64, StoreError> {
        dispatch!(self, s => s.session_count_owned(owner).await)
    }

    async fn item_enqueue(&self, params: ItemEnqueue) -> Result<EnqueueReport, StoreError> {
        #[cfg(feature = "otel")]
        let params = match params.trace {
            Some(_) => params,
            None => params.trace(TraceContext::current()),
        };
        let process = params.process.clone();
        let report: EnqueueReport = dispatch!(self, s => s.item_enqueue(params).await?);
        super::wakeup::notify(&process);
        Ok(report)
    }

    async fn lease_claim(&self, params: LeaseClaim) -> Result<Claimed, StoreError> {
        let process = params.process.clone();
        let claimed: Claimed = dispatch!(self, s => s.lease_claim(params).await?);
        super::wakeup::set_limited(&process, claimed.gate.concurrency_limited);
        Ok(claimed)
    }

    async fn lease_complete(&self, params: LeaseComplete<'_>) -> Result<(), StoreError> {
        let results = answers(self.lease_complete_written(&[params]).await?);
        results.into_iter().next().unwrap_or(Ok(()))
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        Ok(answers(self.lease_complete_written(batch).await?))
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        dispatch!(self, s => s.lease_release(params).await?);
        self.slots_freed(std::iter::once(params.lease.process.as_str()))
            .await;
        Ok(())
    }

    async fn lease_lock(&self, params: LeaseLock) -> Result<Lease, StoreError> {
        dispatch!(self, s => s.lease_lock(params).await)
    }

    async fn item_list(&self, params: ItemList) -> Result<Vec<Item>, StoreError> {
        dispatch!(self, s => s.item_list(params).await)
    }

    async fn item_triage(&self, params: ItemTriage) -> Result<TriagePage, StoreError> {
        dispatch!(self, s => s.item_triage(params).await)
    }

    async fn item_get(&self, params: ItemGet) -> Result<Option<ItemDetail>, StoreError> {
        dispatch!(self, s => s.item_get(params).await)
    }

    async fn item_retry(&self, params: ItemRetry) -> Result<Option<Item>, StoreError> {
        let process = params.process.clone();
        let item: Option<Item> = dispatch!(self, s => s.item_retry(params).await?);
        super::wakeup::notify(&process);
        Ok(item)
    }

    async fn item_park(&self, params: ItemPark) -> Result<Option<Item>, StoreError> {
        dispatch!(self, s => s.item_park(params).await)
    }

    async fn item_delete(&self, params: ItemDelete) -> Result<bool, StoreError> {
        dispatch!(self, s => s.item_delete(params).await)
    }

    async fn error_groups(&self, params: ErrorGroups) -> Result<Vec<ErrorGroup>, StoreError> {
        dispatch!(self, s => s.error_groups(params).await)
    }

    async fn items_retry_where(&self, params: ItemsRetry) -> Result<u64, StoreError> {
        let process = params.filter.process.clone();
        let changed: u64 = dispatch!(self, s => s.items_retry_where(params).await?);
        if changed > 0 {
            super::wakeup::notify(&process);
        }
        Ok(changed)
    }

    async fn items_park_where(&self, params: ItemsPark) -> Result<u64, StoreError> {
        dispatch!(self, s => s.items_park_where(params).await)
    }

    async fn items_delete_where(&self, params: ItemsDelete) -> Result<u64, StoreError> {
        dispatch!(self, s => s.items_delete_where(params).await)
    }

    async fn history_activity(
        &self,
        params: HistoryActivity,
    ) -> Result<Page<ProcessActivity>, StoreError> {
        dispatch!(self, s => s.history_activity(params).await)
    }

    async fn run_list(&self, params: RunList) -> Result<Vec<Run>, StoreError> {
        dispatch!(self, s => s.run_list(params).await)
    }

    async fn retention_prune(&self, params: RetentionPrune) -> Result<PruneReport, StoreError> {
        dispatch!(self, s => s.retention_prune(params).await)
    }

    async fn prune_turn(&self, params: PruneTurn) -> Result<bool, StoreError> {
        dispatch!(self, s => s.prune_turn(params).await)
    }

    async fn resync_batch(&self, params: ResyncBatch) -> Result<ResyncReport, StoreError> {
        let process = params.process.clone();
        let report: ResyncReport = dispatch!(self, s => s.resync_batch(params).await?);
        if report.resynced > 0 {
            super::wakeup::notify(&process);
        }
        Ok(report)
    }

    async fn process_series(&self, params: ProcessSeries) -> Result<Series, StoreError> {
        dispatch!(self, s => s.process_series(params).await)
    }

    async fn depth_sample(&self, params: DepthSample) -> Result<u64, StoreError> {
        dispatch!(self, s => s.depth_sample(params).await)
    }

    async fn process_counts(&self, page: ProcessPage) -> Result<Page<ProcessCounts>, StoreError> {
        dispatch!(self, s => s.process_counts(page).await)
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        dispatch!(self, s => s.process_configure(params).await)
    }

    async fn process_pause(&self, params: ProcessPause) -> Result<bool, StoreError> {
        let process = params.process.clone();
        let changed: bool = dispatch!(self, s => s.process_pause(params).await?);
        super::wakeup::notify(&process);
        Ok(changed)
    }

    async fn process_settings(
        &self,
        page: ProcessPage,
    ) -> Result<Page<ProcessSettings>, StoreError> {
        dispatch!(self, s => s.process_settings(page).await)
    }

    async fn process_get(&self, process: &str) -> Result<Option<ProcessSettings>, StoreError> {
        dispatch!(self, s => s.process_get(process).await)
    }

    async fn clock_now(&self) -> Result<DateTime<Utc>, StoreError> {
        dispatch!(self, s => s.clock_now().await)
    }
}
