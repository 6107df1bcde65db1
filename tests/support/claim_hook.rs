//! [`Hooked`]: a backend that forwards every call to another and shows each
//! claim's answer to a hook, which may replace it. Tests that count short
//! claims (`wakeups.rs`) or lose a claim's answer (`runner_abandon.rs`) differ
//! only in that hook.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use drover::store::{
    Claimed, LeaseClaim, LeaseComplete, LeaseRelease, ProcessConfigure, ReclaimReport, Session,
    SessionClose, SessionHeartbeat, SessionStart, Store, StoreError, WorkerBackend,
};
use tokio::sync::Notify;

/// What a [`Hooked`] backend does with each claim's answer.
pub(crate) trait OnClaim: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// The answer the controller gets for a claim of `asked` keys that the
    /// inner backend answered with `claimed`.
    fn on_claim(
        &self,
        asked: u32,
        claimed: Result<Claimed, StoreError>,
    ) -> Result<Claimed, StoreError>;
}

/// `inner`, with each claim's answer passed through `hook`.
#[derive(Debug, Clone)]
pub(crate) struct Hooked<B, H> {
    /// Where every call goes.
    pub(crate) inner: B,
    /// What sees each claim's answer.
    pub(crate) hook: H,
}

impl<B: WorkerBackend, H: OnClaim> WorkerBackend for Hooked<B, H> {
    const RECLAIMS: bool = B::RECLAIMS;

    async fn session_start(&self, params: SessionStart) -> Result<Session, StoreError> {
        self.inner.session_start(params).await
    }

    async fn session_heartbeat(
        &self,
        params: SessionHeartbeat,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.inner.session_heartbeat(params).await
    }

    async fn session_close(&self, params: SessionClose) -> Result<u64, StoreError> {
        self.inner.session_close(params).await
    }

    async fn session_reclaim(&self) -> Result<ReclaimReport, StoreError> {
        self.inner.session_reclaim().await
    }

    async fn lease_claim_wait(
        &self,
        params: LeaseClaim,
        wait: Duration,
    ) -> Result<Claimed, StoreError> {
        let asked = params.max;
        let claimed = self.inner.lease_claim_wait(params, wait).await;
        self.hook.on_claim(asked, claimed)
    }

    async fn lease_complete_batch(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        self.inner.lease_complete_batch(batch).await
    }

    async fn lease_release(&self, params: LeaseRelease<'_>) -> Result<(), StoreError> {
        self.inner.lease_release(params).await
    }

    async fn process_configure(&self, params: ProcessConfigure) -> Result<(), StoreError> {
        self.inner.process_configure(params).await
    }

    fn subscribe(&self, process: &str) -> Option<Arc<Notify>> {
        self.inner.subscribe(process)
    }

    fn local_store(&self) -> Option<&Store> {
        self.inner.local_store()
    }
}
