//! [`StoreEngine`]: the database seam. Every engine implements it with its own SQL;
//! the runner, the server and the CLI only ever talk to this trait.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::fleet::{Claimed, ProcessPause};
// The seam takes every operation's parameters and returns the domain types.
use super::params::*;
use super::settings::{ProcessConfigure, ProcessSettings};
use super::types::*;

/// The durable contract of DESIGN.md's "Semantics", one method per operation.
///
/// Guarantees every engine gives (and the contract suite, `tests/store_*.rs`, checks on each):
///
/// - a (process, key) is held by at most one live lease; a completion, release or
///   heartbeat from a session that lost it is rejected with
///   [`StoreError::LeaseLost`] or [`StoreError::SessionExpired`] and changes nothing;
/// - an enqueue never creates a second entry for a key: a pending key keeps the
///   earlier ready time and the higher priority, a running key is marked dirty and
///   runs exactly once more after its run ends;
/// - every rejected operation changes nothing; every accepted one is atomic;
/// - all times come from the database clock, never from the caller's.
pub trait StoreEngine: Send + Sync {
    /// Registers a worker; its deadline is now + ttl on the database clock.
    fn session_start(
        &self,
        params: SessionStart,
    ) -> impl Future<Output = Result<Session, StoreError>> + Send;

    /// Pushes the session's deadline to now + ttl and returns it;
    /// [`StoreError::SessionExpired`] if the deadline already passed (even if no
    /// one reclaimed it yet): the worker must stop its work and start over.
    fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> impl Future<Output = Result<DateTime<Utc>, StoreError>> + Send;

    /// Ends a session: its leases go back to pending (a `canceled` run each, no
    /// failure counted) and the session is deleted. Returns how many leases it
    /// gave back. Closing an unknown session is not an error.
    fn session_close(
        &self,
        params: SessionClose,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Turns the leases of every session past its deadline (and any lease whose
    /// session no longer exists) back into pending items with an `expired` run,
    /// and deletes those sessions. Any node may call it at any time.
    ///
    /// Expiry is decided once, under the session row's lock: a heartbeat that
    /// renewed the session first keeps it and every lease it holds, and a
    /// heartbeat that comes after the reclaim is refused with
    /// [`StoreError::SessionExpired`]; the two never both win.
    fn session_reclaim(&self) -> impl Future<Output = Result<ReclaimReport, StoreError>> + Send;

    /// Who may act on each of `sessions` through a server (see
    /// [`SessionStart::owner`]), in one read however many are asked: a
    /// session that does not exist is left out, one started without an owner
    /// maps to `None`. A session's owner never changes, so a server may keep
    /// the answer. One read, because a caller may name thousands of sessions
    /// in one completion batch.
    fn session_owners(
        &self,
        sessions: &[super::types::SessionId],
    ) -> impl Future<
        Output = Result<std::collections::HashMap<SessionId, Option<String>>, StoreError>,
    > + Send;

    /// How many sessions `owner` started that have not expired (their
    /// deadline, on the database clock, has not passed), so a server can cap
    /// what one token holds (DESIGN.md rule 13). One read.
    fn session_count_owned(
        &self,
        owner: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// One page of the sessions, live or expired and not yet reclaimed,
    /// oldest (lowest id) first, each with who runs it and the leases it
    /// holds: what the workers page shows. A range of the sessions' key, so
    /// every page costs the same; a session started or reclaimed between two
    /// pages may show or not, as in any live listing.
    fn session_list(
        &self,
        params: SessionList,
    ) -> impl Future<Output = Result<Page<SessionInfo, SessionId>, StoreError>> + Send;

    /// Enqueues keys with coalescing (DESIGN.md rule 2); all keys are validated
    /// first, so a bad key means nothing is written.
    fn item_enqueue(
        &self,
        params: ItemEnqueue,
    ) -> impl Future<Output = Result<EnqueueReport, StoreError>> + Send;

    /// Leases up to `max` ready keys of a process: highest priority first, then
    /// earliest ready time, then FIFO. Parallel claimers never receive the same
    /// key; no leases means nothing is ready, or the process's fleet controls
    /// hold the claim back ([`Claimed::gate`] says which).
    ///
    /// A paused process is never claimed from. With a concurrency limit L, the
    /// process's running keys (on every node) never exceed L after the claim;
    /// with a rate limit, each lease takes a token of the process's bucket in
    /// the same transaction, and when the bucket ran dry the gate tells when
    /// the next token comes. A process with none of these claims as before,
    /// without locking its process row (on PostgreSQL, from the claim after
    /// the one that found its limits removed).
    fn lease_claim(
        &self,
        params: LeaseClaim,
    ) -> impl Future<Output = Result<Claimed, StoreError>> + Send;

    /// Records a run's outcome (DESIGN.md rule 4), checked against the session and
    /// the fencing token: the item's next state and the run's one history row.
    /// A retry of a completion that an earlier call recorded (its answer lost)
    /// is answered `Ok` and writes nothing, whatever became of the session
    /// since: the same outcome under the same token is already there. On
    /// PostgreSQL an outcome whose key's row another transaction holds past
    /// 100 ms (a caller's transaction that enqueued the running key) is
    /// answered [`StoreError::KeyBusy`], nothing written: send it again.
    fn lease_complete(
        &self,
        params: LeaseComplete<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records many runs' outcomes in one transaction (one commit instead of one
    /// per key, which is what bounds throughput on both engines). Each lease is
    /// checked on its own: the result has one entry per input, in order, with
    /// `LeaseLost` / `SessionExpired` for leases that changed nothing (a
    /// lease twice in one batch is settled once and refused after; a retry
    /// of an earlier call's recorded outcome is `Ok`, as in
    /// [`lease_complete`](Self::lease_complete)), and `KeyBusy` (PostgreSQL)
    /// for one whose key's row another transaction holds: it changed nothing
    /// and is sent again, while the rest of the batch is written without
    /// waiting for that transaction. The outer error means nothing was
    /// written.
    fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;

    /// Gives a lease back without an outcome (cancellation, shutdown): the item is
    /// pending at once, no failure is counted, the run ends `canceled`.
    fn lease_release(
        &self,
        params: LeaseRelease<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Leases one key chosen by the caller (query-driven loops), creating its item
    /// if needed (an idle key is taken like a new one). Refused with [`StoreError::AlreadyLeased`],
    /// [`StoreError::InBackoff`] (backing off, or delayed: its ready time has
    /// not come) or [`StoreError::Parked`]; and, as a claim would be, with
    /// [`StoreError::Held`] when the process is paused, at its concurrency
    /// limit or out of rate tokens (the lock counts against both limits).
    fn lease_lock(
        &self,
        params: LeaseLock,
    ) -> impl Future<Output = Result<Lease, StoreError>> + Send;

    /// Lists a process's items in key order, optionally in one state, a page at a
    /// time.
    fn item_list(
        &self,
        params: ItemList,
    ) -> impl Future<Output = Result<Vec<Item>, StoreError>> + Send;

    /// A page of a process's items in the order an operator needs them:
    /// parked, then backing off (soonest retry first), then pending in claim
    /// order (highest priority, longest waiting), then running, then idle;
    /// optionally one state only and keys with a prefix (then in key order
    /// within each state). Paged by keyset cursor: each page costs the same
    /// however deep it is. A key that changes state between two pages may
    /// show twice or not at all, as in any live listing.
    fn item_triage(
        &self,
        params: ItemTriage,
    ) -> impl Future<Output = Result<TriagePage, StoreError>> + Send;

    /// One item (idle ones included) with its newest runs; `None` if the key
    /// is not known.
    fn item_get(
        &self,
        params: ItemGet,
    ) -> impl Future<Output = Result<Option<ItemDetail>, StoreError>> + Send;

    /// An operator's "retry now": a pending, backing-off, parked or idle item
    /// becomes pending at once (its backoff cut short; its failure count kept,
    /// so a further failure backs off as before), with a `retried` row. `None` if
    /// the key has no item; [`StoreError::AlreadyLeased`] (changing nothing) if it
    /// is running, since only its lease holder may end that run.
    fn item_retry(
        &self,
        params: ItemRetry,
    ) -> impl Future<Output = Result<Option<Item>, StoreError>> + Send;

    /// An operator's "park": a pending, backing-off or idle item is parked with
    /// `reason` as its last error (a `parked` row), so it never runs until the
    /// next enqueue or retry. Parking a parked item only replaces the reason.
    /// `None` if the key has no item; [`StoreError::AlreadyLeased`] if running.
    fn item_park(
        &self,
        params: ItemPark,
    ) -> impl Future<Output = Result<Option<Item>, StoreError>> + Send;

    /// An operator's "delete" (the informer's delete event): the key is
    /// forgotten, its item gone; its runs stay (with a `deleted` row) until
    /// retention removes them. A later enqueue starts it afresh.
    /// `false` if the key had no item; [`StoreError::AlreadyLeased`] if running.
    fn item_delete(
        &self,
        params: ItemDelete,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The distinct last errors of the process's failing keys (parked, or
    /// pending and still backing off), grouped by their
    /// [`error_signature`](super::error_signature), most keys first: what
    /// keeps failing, and how often. Each group's signature, passed to an
    /// [`ItemFilter`](super::ItemFilter), acts on exactly its keys.
    fn error_groups(
        &self,
        params: ErrorGroups,
    ) -> impl Future<Output = Result<Vec<ErrorGroup>, StoreError>> + Send;

    /// [`item_retry`](Self::item_retry) for every key the filter matches that
    /// is not running: in batches of `params.batch` keys in key order, each
    /// batch one transaction whose keys change in one statement, each changed
    /// key with a `retried` row by `params.actor`; wakes the process's
    /// workers. How many keys changed. Refused with
    /// [`StoreError::InvalidArgument`] for a filter with no condition or for
    /// running keys; batches done before an error stay done.
    fn items_retry_where(
        &self,
        params: ItemsRetry,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// [`item_park`](Self::item_park) for every key the filter matches that is
    /// not running, in batches as [`items_retry_where`](Self::items_retry_where)
    /// does, each changed key with a `parked` row carrying the reason.
    fn items_park_where(
        &self,
        params: ItemsPark,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// [`item_delete`](Self::item_delete) for every key the filter matches
    /// that is not running, in batches as
    /// [`items_retry_where`](Self::items_retry_where) does, each deleted key
    /// with a `deleted` row.
    fn items_delete_where(
        &self,
        params: ItemsDelete,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Per known process of one page (in name order, as
    /// [`process_counts`](Self::process_counts) pages them), how many runs
    /// ended (converged / failed) within the window: recent throughput and
    /// failure rate, from the history.
    fn history_activity(
        &self,
        params: HistoryActivity,
    ) -> impl Future<Output = Result<Page<ProcessActivity>, StoreError>> + Send;

    /// A page of history (runs and operator actions), newest first.
    fn run_list(
        &self,
        params: RunList,
    ) -> impl Future<Output = Result<Vec<Run>, StoreError>> + Send;

    /// One small batch of a process's retention ([`Retention`](super::Retention)):
    /// deletes runs past the period, then caps runs per key and forgets idle
    /// keys along a walk that goes on from `params.cursor`. Each step is its
    /// own short transaction.
    fn retention_prune(
        &self,
        params: RetentionPrune,
    ) -> impl Future<Output = Result<PruneReport, StoreError>> + Send;

    /// Takes `params.process`'s turn to prune for `params.holder` when nobody
    /// holds it or the holder's turn has run out, or renews it when
    /// `params.holder` already holds it; either way it is held until now +
    /// `params.hold` on the database clock. `false`: another pruner holds it
    /// (or the process is gone), so this one leaves the process alone. Every
    /// node runs a pruner, and this keeps a fleet to one walk of each
    /// process's history per interval instead of one per node.
    fn prune_turn(
        &self,
        params: PruneTurn,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// One small batch of a process's resync ([`Resync`](super::Resync)): if
    /// a pass is under way or due (or `params.start`), reads the next window
    /// of idle keys along a walk shared by every node, makes the due ones
    /// pending at the resync priority, and moves the walk on; one short
    /// transaction. Only idle keys change: a pending key keeps its ready time
    /// and priority, and running, parked and backing-off keys are left alone,
    /// so a resync never runs a key twice at once and is never a retry. Wakes
    /// the process's workers when it resynced a key.
    fn resync_batch(
        &self,
        params: ResyncBatch,
    ) -> impl Future<Output = Result<ResyncReport, StoreError>> + Send;
    /// Runs per minute by outcome over the window (from the runs table) and
    /// the sampled queue depth over it (from [`depth_sample`](Self::depth_sample)):
    /// the process page's charts.
    fn process_series(
        &self,
        params: ProcessSeries,
    ) -> impl Future<Output = Result<Series, StoreError>> + Send;

    /// Records every process's current counts as a depth sample (unless one
    /// younger than `min_gap` exists) and deletes samples older than `keep`.
    /// `drover serve` calls it about once a minute. How many samples it wrote.
    fn depth_sample(
        &self,
        params: DepthSample,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts per known process and state, with the oldest ready item's age,
    /// for one page of processes in name order: a range of the process
    /// index, so a database with many processes is read a bounded number at
    /// a time. Idle keys are not counted: counting them would read every
    /// known key.
    fn process_counts(
        &self,
        page: ProcessPage,
    ) -> impl Future<Output = Result<Page<ProcessCounts>, StoreError>> + Send;

    /// [`process_counts`](Self::process_counts) of every known process, in
    /// name order, read a page of 1,000 at a time: for the callers that need
    /// them all (`/metrics`, `drover status`). Each page is its own read, so
    /// the pages are not one snapshot.
    fn process_counts_all(
        &self,
    ) -> impl Future<Output = Result<Vec<ProcessCounts>, StoreError>> + Send {
        super::rules::pages::every_process(|page| self.process_counts(page))
    }

    /// Changes a process's settings (creating the process if unknown); the
    /// settings not given keep their values. They apply from then on, on every
    /// node.
    fn process_configure(
        &self,
        params: ProcessConfigure,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Pauses or resumes a process for every node (creating it if unknown):
    /// while paused no claim or lock takes its keys; runs already going finish
    /// normally, and enqueues are kept. A change writes a history row (key
    /// `""`, outcome `paused` / `resumed`, `params.actor`); pausing a paused
    /// process changes nothing and writes none. Whether it changed anything.
    fn process_pause(
        &self,
        params: ProcessPause,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// One page of known processes with their settings, in name order: a
    /// range of the process index (DESIGN.md rule 13), so a caller that
    /// shows some processes (the dashboard's overview) reads only those. On
    /// SQLite, a name that is not UTF-8 (which only SQL can have written) is
    /// left out: no call can name it, and it failed the whole list.
    fn process_settings(
        &self,
        page: ProcessPage,
    ) -> impl Future<Output = Result<Page<ProcessSettings>, StoreError>> + Send;

    /// One process's settings, `None` if the process is unknown: a read by
    /// name, for a caller about one process (its settings over the API, its
    /// dashboard page), whatever the number of processes.
    fn process_get(
        &self,
        process: &str,
    ) -> impl Future<Output = Result<Option<ProcessSettings>, StoreError>> + Send;

    /// Every known process with its settings, in name order, read a page of
    /// 1,000 at a time ([`process_settings`](Self::process_settings)): for
    /// the callers that act on each process (retention, resync, `drover
    /// process list`). Each page is its own read, so the pages are not one
    /// snapshot.
    fn process_list(
        &self,
    ) -> impl Future<Output = Result<Vec<ProcessSettings>, StoreError>> + Send {
        super::rules::pages::every_process(|page| self.process_settings(page))
    }

    /// The database clock (shifted by [`Clock`](super::Clock)'s test offset).
    fn clock_now(&self) -> impl Future<Output = Result<DateTime<Utc>, StoreError>> + Send;
}
