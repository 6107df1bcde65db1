//! [`WorkerBackend`]: the part of the store a worker needs, and nothing else, so
//! one control loop runs against a database ([`Store`]) or a drover server
//! ([`Client`](crate::client::Client)).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use super::TraceContext;
use super::fleet::Claimed;
use super::params::{
    LeaseClaim, LeaseComplete, LeaseRelease, SessionClose, SessionHeartbeat, SessionStart,
};
use super::settings::ProcessConfigure;
use super::types::{Lease, ReclaimReport, Session};
use super::{Store, StoreEngine, StoreError};

/// What a [`Controller`](crate::runner::Controller) needs from where its work
/// lives: sessions, claims (with a wait), batched completions and releases.
///
/// Operators' calls (items, history, processes) stay on [`StoreEngine`]; query
/// sources, which lock keys chosen by the user's own SQL, need a [`Store`].
/// Every implementation gives the [`StoreEngine`] guarantees for these calls:
/// one live lease per key, fencing checked on every completion and release
/// (`LeaseLost` / `SessionExpired` change nothing), deadlines on the database
/// clock, and [`StoreError::is_commit_unknown`] when a call may have been
/// applied without the caller hearing of it.
pub trait WorkerBackend: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// Whether [`session_reclaim`](Self::session_reclaim) does anything here:
    /// a database reclaims expired sessions itself, while over HTTP the server
    /// does it for every worker.
    const RECLAIMS: bool;

    /// Registers a worker; its deadline is now + ttl on the database clock.
    fn session_start(
        &self,
        params: SessionStart,
    ) -> impl Future<Output = Result<Session, StoreError>> + Send;

    /// Pushes the session's deadline to now + ttl; `SessionExpired` if it has
    /// passed already.
    fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> impl Future<Output = Result<DateTime<Utc>, StoreError>> + Send;

    /// Ends a session, handing its leases back; returns how many.
    fn session_close(
        &self,
        params: SessionClose,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Requeues the leases of expired sessions (see
    /// [`StoreEngine::session_reclaim`]); a no-op where [`RECLAIMS`](Self::RECLAIMS)
    /// is `false`.
    fn session_reclaim(&self) -> impl Future<Output = Result<ReclaimReport, StoreError>> + Send {
        async { Ok(ReclaimReport::default()) }
    }

    /// Leases up to `params.max` ready keys. When none is ready and `wait` is
    /// not zero, waits up to `wait` for a wake-up (an enqueue, a retry, a dirty
    /// completion, a resume) and claims once more; no leases means nothing
    /// became ready (or the process's fleet controls held the claim back:
    /// [`Claimed::gate`] says how long until the next rate token). Fewer than
    /// `max` may come back even when more are ready (a server caps one
    /// answer); claim again for the rest.
    fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> impl Future<Output = Result<Claimed, StoreError>> + Send;

    /// Records many runs' outcomes at once, each checked on its own (see
    /// [`StoreEngine::lease_complete_batch`]).
    fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;

    /// [`lease_complete_batch`](Self::lease_complete_batch), each request of
    /// which is given up after `within` (its outcomes then maybe written, as
    /// after any answer that never came), so that a request gone silent holds
    /// the runs waiting on it (and every outcome queued behind it) for a
    /// heartbeat interval, not the transport's whole timeout. A database's
    /// writes are bounded by its own lock and statement timeouts: the default
    /// ignores `within`.
    fn lease_complete_batch_within(
        &self,
        batch: &[LeaseComplete<'_>],
        within: Duration,
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send {
        let _ = within;
        self.lease_complete_batch(batch)
    }

    /// Gives a lease back without an outcome: pending at once, no failure.
    fn lease_release(
        &self,
        params: LeaseRelease<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Sets the process's backoff policy for every node.
    fn process_configure(
        &self,
        params: ProcessConfigure,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The wake-up signal of `process` when this backend can hear of new work
    /// without asking (a database: enqueues in this process, and on PostgreSQL
    /// on every node); `None` where waiting happens inside
    /// [`lease_claim_wait`](Self::lease_claim_wait) (a server's long-poll).
    fn subscribe(&self, process: &str) -> Option<Arc<Notify>> {
        let _ = process;
        None
    }

    /// Adds `context` to the next run of `lease`'s key, as an enqueue's
    /// context would be: a retry's span then links to the attempt that
    /// failed. The default does nothing, for a backend that cannot store a
    /// link; the database stores it and the HTTP client sends it to the
    /// server (`POST /v1/leases/trace-link`). Best effort: the runner gives
    /// it up after a heartbeat interval and writes the outcome anyway.
    fn item_trace_link(
        &self,
        lease: &Lease,
        context: &TraceContext,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (lease, context);
        async { Ok(()) }
    }

    /// The database itself, when the backend is one: handed to reconcilers
    /// ([`Task::store`](crate::runner::Task::store)) that keep their own state
    /// in it. `None` over HTTP.
    fn local_store(&self) -> Option<&Store> {
        None
    }
}

impl Store {
    /// [`lease_claim`](StoreEngine::lease_claim), waiting up to `wait` when
    /// nothing is ready: armed before the claim, a wake-up of the process (an
    /// enqueue through any store in this process, and on PostgreSQL through any
    /// node) ends the wait and the claim runs once more. Dropping the future
    /// while it waits is harmless; dropped during a claim statement, the claim
    /// is as good as one whose commit is unknown. When the process's rate
    /// limit held the claim back, the wait ends when the next token comes (if
    /// that is sooner), not at a wake-up, since none can come sooner.
    pub async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> Result<Claimed, StoreError> {
        if wait.is_zero() {
            return StoreEngine::lease_claim(self, params).await;
        }
        let notify = self.subscribe(&params.process);
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let claimed = StoreEngine::lease_claim(self, params.clone()).await?;
        if !claimed.leases.is_empty() {
            return Ok(claimed);
        }
        if let Some(token) = claimed.gate.next_token_in {
            if token >= wait {
                return Ok(claimed);
            }
            tokio::time::sleep(token).await;
        } else {
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(wait) => return Ok(claimed),
            }
        }
        StoreEngine::lease_claim(self, params).await
    }
}

impl WorkerBackend for Store {
    const RECLAIMS: bool = true;

    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        StoreEngine::session_start(self, params).await
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        StoreEngine::session_heartbeat(self, params).await
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        StoreEngine::session_close(self, params).await
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        StoreEngine::session_reclaim(self).await
    }

    async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> Result<Claimed, StoreError> {
        Store::lease_claim_wait(self, params, wait).await
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        StoreEngine::lease_complete_batch(self, batch).await
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        StoreEngine::lease_release(self, params).await
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        StoreEngine::process_configure(self, params).await
    }

    fn subscribe(&self, process: &str) -> Option<Arc<Notify>> {
        Some(Store::subscribe(self, process))
    }

    async fn item_trace_link(
        &self,
        lease: &Lease,
        context: &TraceContext,
    ) -> Result<(), StoreError> {
        Store::item_trace_link(self, lease, context).await
    }

    fn local_store(&self) -> Option<&Store> {
        Some(self)
    }
}
