//! [`StoreEngine`]: the database seam. Every engine implements it with its own SQL;
//! the runner, the server and the CLI only ever talk to this trait.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::params::{
    HistoryActivity, HistoryList, HistoryPrune, ItemDelete, ItemEnqueue, ItemGet, ItemList,
    ItemPark, ItemRetry, LeaseClaim, LeaseComplete, LeaseLock, LeaseRelease, ProcessConfigure,
    SessionClose, SessionHeartbeat, SessionStart,
};
use super::types::{
    EnqueueReport, HistoryEvent, Item, ItemDetail, Lease, ProcessActivity, ProcessCounts,
    ReclaimReport, Session,
};

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

    /// Ends a session: its leases go back to pending (history `canceled`, no
    /// failure counted) and the session is deleted. Returns how many leases it
    /// gave back. Closing an unknown session is not an error.
    fn session_close(
        &self,
        params: SessionClose,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Turns the leases of every session past its deadline (and any lease whose
    /// session no longer exists) back into pending items with an `expired` event,
    /// and deletes those sessions. Any node may call it at any time.
    ///
    /// Expiry is decided once, under the session row's lock: a heartbeat that
    /// renewed the session first keeps it and every lease it holds, and a
    /// heartbeat that comes after the reclaim is refused with
    /// [`StoreError::SessionExpired`]; the two never both win.
    fn session_reclaim(&self) -> impl Future<Output = Result<ReclaimReport, StoreError>> + Send;

    /// Enqueues keys with coalescing (DESIGN.md rule 2); all keys are validated
    /// first, so a bad key means nothing is written.
    fn item_enqueue(
        &self,
        params: ItemEnqueue,
    ) -> impl Future<Output = Result<EnqueueReport, StoreError>> + Send;

    /// Leases up to `max` ready keys of a process: highest priority first, then
    /// earliest ready time, then FIFO. Parallel claimers never receive the same
    /// key; an empty result means nothing is ready.
    fn lease_claim(
        &self,
        params: LeaseClaim,
    ) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send;

    /// Records a run's outcome (DESIGN.md rule 4), checked against the session and
    /// the fencing token.
    fn lease_complete(
        &self,
        params: LeaseComplete<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records many runs' outcomes in one transaction (one commit instead of one
    /// per key, which is what bounds throughput on both engines). Each lease is
    /// checked on its own: the result has one entry per input, in order, with
    /// `LeaseLost` / `SessionExpired` for leases that changed nothing. The outer
    /// error means nothing was written.
    fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;

    /// Gives a lease back without an outcome (cancellation, shutdown): the item is
    /// pending at once, no failure is counted, history says `canceled`.
    fn lease_release(
        &self,
        params: LeaseRelease<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Leases one key chosen by the caller (query-driven loops), creating its item
    /// if needed. Refused with [`StoreError::AlreadyLeased`],
    /// [`StoreError::InBackoff`] (backing off, or delayed: its ready time has
    /// not come) or [`StoreError::Parked`].
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

    /// One item with its newest history; `None` if the key has no item.
    fn item_get(
        &self,
        params: ItemGet,
    ) -> impl Future<Output = Result<Option<ItemDetail>, StoreError>> + Send;

    /// An operator's "retry now": a pending, backing-off or parked item becomes
    /// pending at once (its backoff cut short; its failure count kept, so a
    /// further failure backs off as before), with a `retried` event. `None` if
    /// the key has no item; [`StoreError::AlreadyLeased`] (changing nothing) if it
    /// is running, since only its lease holder may end that run.
    fn item_retry(
        &self,
        params: ItemRetry,
    ) -> impl Future<Output = Result<Option<Item>, StoreError>> + Send;

    /// An operator's "park": a pending or backing-off item is parked with
    /// `reason` as its last error (a `parked` event), so it never runs until the
    /// next enqueue or retry. Parking a parked item only replaces the reason.
    /// `None` if the key has no item; [`StoreError::AlreadyLeased`] if running.
    fn item_park(
        &self,
        params: ItemPark,
    ) -> impl Future<Output = Result<Option<Item>, StoreError>> + Send;

    /// An operator's "delete": the item's row is gone (its history stays, with a
    /// `deleted` event); a later enqueue starts it afresh with no failures.
    /// `false` if the key had no item; [`StoreError::AlreadyLeased`] if running.
    fn item_delete(
        &self,
        params: ItemDelete,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Per known process, how many runs ended (finished / failed) within the
    /// window: recent throughput and failure rate, from the history.
    fn history_activity(
        &self,
        params: HistoryActivity,
    ) -> impl Future<Output = Result<Vec<ProcessActivity>, StoreError>> + Send;

    /// History events, newest first.
    fn history_list(
        &self,
        params: HistoryList,
    ) -> impl Future<Output = Result<Vec<HistoryEvent>, StoreError>> + Send;

    /// Deletes events older than the retention; returns how many.
    fn history_prune(
        &self,
        params: HistoryPrune,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts per known process and state, with the oldest ready item's age.
    fn process_counts(&self)
    -> impl Future<Output = Result<Vec<ProcessCounts>, StoreError>> + Send;

    /// Sets a process's backoff policy (creating the process if unknown). It applies
    /// to every failure recorded from then on, by every node.
    fn process_configure(
        &self,
        params: ProcessConfigure,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The database clock (shifted by [`Clock`](super::Clock)'s test offset).
    fn clock_now(&self) -> impl Future<Output = Result<DateTime<Utc>, StoreError>> + Send;
}
