//! One run of one key: reconcile it in a task of its own (panic isolation), bound
//! it by the timeout and the cancellation token, and write its outcome through
//! the lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::completer::{Completer, Written};
use super::config::Settings;
use super::error::outcome_of;
use super::finished::Finished;
use super::metrics::RunnerMetrics;
use super::reconciler::{Reconciler, Task};
use crate::store::{Lease, LeaseRelease, Outcome, WorkerBackend};

/// How many outcomes may wait for the completer at once, across a controller's
/// runs: two full batches, one being written and one filling.
pub(crate) const OUTCOMES_IN_WRITING: usize = 2 * super::completer::MAX_BATCH;

/// What a controller's runs share.
pub(crate) struct Run<R, B> {
    pub(crate) backend: B,
    pub(crate) reconciler: Arc<R>,
    pub(crate) settings: Settings,
    pub(crate) metrics: RunnerMetrics,
    /// Writes outcomes, many runs per transaction.
    pub(crate) completer: Completer<B>,
    /// Outcomes reconciled but not yet written ([`OUTCOMES_IN_WRITING`] at
    /// most): a run gives its slot back as soon as its reconcile returns, so
    /// the next key starts while the outcome waits for the completer's commit,
    /// and this bound is what pushes back when the database falls behind.
    pub(crate) writing: Arc<Semaphore>,
    /// Keys whose reconcile returned, for a query source's next locks.
    pub(crate) finished: Option<Finished>,
    /// Cancelled when shutdown's deadline passes.
    pub(crate) force: CancellationToken,
}

/// How a run ended before its outcome was written.
enum Ended {
    Outcome(Outcome),
    /// Cancelled by the shutdown deadline: release the lease.
    Released,
    /// The session was lost: write nothing.
    Lost,
}

impl<R: Reconciler, B: WorkerBackend> Run<R, B> {
    /// Runs `lease`'s key; `permit` holds its slot until the reconcile returns
    /// (and, when [`OUTCOMES_IN_WRITING`] outcomes already wait, until one of
    /// them is written). The key stays leased until its outcome is written, so
    /// it cannot run twice meanwhile.
    pub(crate) async fn execute(
        self: Arc<Self>,
        lease: Lease,
        token: CancellationToken,
        permit: OwnedSemaphorePermit,
    ) {
        let queue = &self.metrics.queue;
        if let Ok(waited) = (lease.started_at - lease.enqueued_at).to_std() {
            queue.queue_duration.observe(waited.as_secs_f64());
        }
        self.metrics.in_flight.start(lease.token);
        let started = Instant::now();
        let ended = self.reconcile(&lease, &token).await;
        self.metrics.in_flight.end(lease.token);
        queue.work_duration.observe(started.elapsed().as_secs_f64());
        match ended {
            Ended::Outcome(outcome) => {
                if let Some(finished) = &self.finished {
                    finished.record(&lease.key);
                }
                // The semaphore is never closed, so acquiring cannot fail.
                let writing = Arc::clone(&self.writing).acquire_owned().await;
                drop(permit);
                self.complete(&lease, outcome, &token).await;
                drop(writing);
                return;
            }
            Ended::Released => {
                self.metrics.outcome("canceled");
                let release = self.backend.lease_release(LeaseRelease { lease: &lease });
                if let Err(e) = release.await {
                    tracing::warn!(key = %lease.key, error = %e, "cannot release the lease; it will expire");
                }
            }
            Ended::Lost => {
                self.metrics.outcome("lost");
                tracing::warn!(key = %lease.key, "session lost during the run; its result is discarded");
            }
        }
        drop(permit);
    }

    async fn reconcile(&self, lease: &Lease, token: &CancellationToken) -> Ended {
        let store = self.backend.local_store().cloned();
        let task = Task::new(lease.clone(), token.clone(), store);
        let reconciler = Arc::clone(&self.reconciler);
        let mut handle = tokio::spawn(async move { reconciler.reconcile(task).await });
        let limit = self.settings.timeout;
        let result = tokio::select! {
            result = &mut handle => result,
            () = token.cancelled() => {
                handle.abort();
                return if self.force.is_cancelled() { Ended::Released } else { Ended::Lost };
            }
            () = sleep_for(limit) => {
                handle.abort();
                let limit = limit.unwrap_or_default();
                return Ended::Outcome(Outcome::Transient(format!("timed out after {limit:?}")));
            }
        };
        Ended::Outcome(match result {
            Ok(result) => outcome_of(result),
            Err(join) => Outcome::Transient(panic_message(join)),
        })
    }

    /// Writes the outcome through the completer (sharing a commit with other
    /// runs), retrying database errors while the session lives: if
    /// the database stays away, the session expires and another node reclaims the
    /// key, so nothing is lost either way.
    async fn complete(&self, lease: &Lease, outcome: Outcome, token: &CancellationToken) {
        let name = outcome.name();
        if matches!(outcome, Outcome::Transient(_)) {
            self.metrics.queue.retries.inc();
        }
        let mut delay = Duration::from_millis(20);
        loop {
            if token.is_cancelled() && !self.force.is_cancelled() {
                self.metrics.outcome("lost");
                return;
            }
            match self.completer.complete(lease, &outcome).await {
                Written::Done => {
                    self.metrics.outcome(name);
                    return;
                }
                Written::Refused(e) => {
                    self.metrics.outcome("lost");
                    tracing::warn!(key = %lease.key, error = %e, "outcome refused: the lease was lost");
                    return;
                }
                Written::Failed(e) => {
                    tracing::warn!(key = %lease.key, error = %e, "cannot write the outcome; retrying");
                }
            }
            tokio::select! {
                () = token.cancelled() => {}
                () = sleep(delay) => {}
            }
            delay = (delay * 2).min(self.settings.heartbeat_every());
        }
    }
}

async fn sleep_for(limit: Option<Duration>) {
    match limit {
        Some(limit) => sleep(limit).await,
        None => std::future::pending().await,
    }
}

/// The panic's message, for the history.
fn panic_message(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return "reconcile was aborted".to_owned();
    }
    let payload = join.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string payload".to_owned());
    format!("reconcile panicked: {text}")
}
