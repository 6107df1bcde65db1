//! One run of one key: reconcile it with its panics caught (panic isolation),
//! bound it by the timeout and the cancellation token, and write its outcome
//! through the lease.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, Span};

use super::completer::{Completer, Written};
use super::config::Settings;
use super::error::outcome_of;
use super::finished::Finished;
use super::lapse::STOP_GRACE;
use super::reconciler::{Reconciler, Task};
use super::trace;
use super::write_span::{OutcomeWrite, WriteEnd};
use crate::metrics::RunnerMetrics;
use crate::store::{Lease, LeaseRelease, Outcome, TraceId, WorkerBackend};

/// How many outcomes may wait for the completer at once, across a controller's
/// runs: two full batches, one being written and one filling.
pub(crate) const OUTCOMES_IN_WRITING: usize = 2 * super::completer::MAX_BATCH;

/// How long handing a lease back may take before it is left to its session
/// (whose close or expiry hands it back): part of what a shutdown may take
/// past its deadline.
const RELEASE_WITHIN: Duration = Duration::from_millis(300);

/// What a controller's runs share.
pub(crate) struct Run<R, B> {
    pub(crate) backend: B,
    pub(crate) reconciler: Arc<R>,
    pub(crate) settings: Settings,
    pub(crate) metrics: RunnerMetrics,
    /// Writes outcomes, many runs per transaction.
    pub(crate) completer: Completer,
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
        mut lease: Lease,
        token: CancellationToken,
        permit: OwnedSemaphorePermit,
    ) {
        let span = trace::run_span(&lease);
        if span.is_disabled() {
            return self.execute_in(lease, token, permit, &span).await;
        }
        trace::link_enqueues(&span, &mut lease);
        // Boxed: a traced run's instrumented future stays out of every run's.
        Box::pin(async move {
            let run = self.execute_in(lease, token, permit, &span);
            run.instrument(span.clone()).await;
        })
        .await;
    }

    /// [`execute`](Self::execute) under the run's `span` (disabled when
    /// nothing records it).
    async fn execute_in(
        self: Arc<Self>,
        lease: Lease,
        token: CancellationToken,
        permit: OwnedSemaphorePermit,
        span: &Span,
    ) {
        let queue = &self.metrics.queue;
        if let Ok(waited) = (lease.started_at - lease.enqueued_at).to_std() {
            queue.queue_duration.observe(waited.as_secs_f64());
        }
        self.metrics.in_flight.start(lease.token.0);
        let started = Instant::now();
        let ended = self.reconcile(&lease, &token).await;
        self.metrics.in_flight.end(lease.token.0);
        queue.work_duration.observe(started.elapsed().as_secs_f64());
        match ended {
            Ended::Outcome(outcome) => {
                trace::record_outcome(span, &outcome);
                if !span.is_disabled() && matches!(outcome, Outcome::Transient(_)) {
                    // Best effort, and never longer than the run may last, nor
                    // than a heartbeat interval: a server that does not answer
                    // held the run (its slot, the worker's shutdown, and its
                    // outcome, the key staying `running`) for the client's
                    // whole request timeout (30 s).
                    let link = Box::pin(trace::link_retry(span, &self.backend, &lease));
                    tokio::select! {
                        biased;
                        () = token.cancelled() => {}
                        () = link => {}
                        () = sleep(self.settings.heartbeat_every()) => {
                            tracing::debug!(key = %lease.key, "linking the retry to this attempt timed out");
                        }
                    }
                }
                if let Some(finished) = &self.finished {
                    finished.record(&lease.key);
                }
                let mut write = OutcomeWrite::begin(span);
                // The semaphore is never closed, so acquiring cannot fail.
                let writing = Arc::clone(&self.writing).acquire_owned().await;
                drop(permit);
                let trace_id = trace::trace_id(span);
                let end = self
                    .complete(&lease, outcome, trace_id, &token, &mut write)
                    .await;
                drop(writing);
                write.end(span, &lease, end);
                return;
            }
            Ended::Released => {
                trace::record_ended(span, "canceled");
                self.metrics.outcome("canceled");
                self.release(&lease).await;
            }
            Ended::Lost => {
                trace::record_ended(span, "lost");
                self.metrics.outcome("lost");
                tracing::warn!(key = %lease.key, "session lost during the run; its result is discarded");
            }
        }
        drop(permit);
    }

    async fn reconcile(&self, lease: &Lease, token: &CancellationToken) -> Ended {
        if token.is_cancelled() {
            // The session was given up (or shutdown forced) while the lease
            // came in, e.g. a long-poll answered late: the work never starts.
            return if self.force.is_cancelled() {
                Ended::Released
            } else {
                Ended::Lost
            };
        }
        let limit = self.settings.timeout;
        // With a timeout, the task gets its own token, so the timeout cancels
        // this run alone; without one, only the session's token can stop it.
        let cancel = match limit {
            Some(_) => token.child_token(),
            None => token.clone(),
        };
        let store = self.backend.local_store().cloned();
        let task = Task::new(lease.clone(), cancel.clone(), store);
        // Polled here, in the run's own task, with a panic caught as the
        // run's failure: a task of its own per run cost a spawn and a wake-up
        // per key, and could outlive its run (a reconcile that blocks its
        // thread past the grace kept running while its key was leased again).
        // Here a run ends only when its reconcile has returned or been
        // dropped. The reconcile is called inside the caught future, not
        // before it: a reconciler may panic before it returns its future (a
        // closure's code ahead of its `async move`), and that panic, uncaught,
        // ended the run's task with its lease neither completed nor released,
        // the key running under a live session with no run.
        //
        // In an `Option`, so that a reconcile stopped where it stands is
        // dropped here, with a panic of its destructors (a guard's) caught
        // too: uncaught, it ended the run's task with nothing written, as a
        // panic ahead of the future did.
        let work =
            AssertUnwindSafe(async move { self.reconciler.reconcile(task).await }).catch_unwind();
        let mut work = pin!(Some(work));
        let result = tokio::select! {
            result = work.as_mut().as_pin_mut().expect("polled before it is dropped") => result,
            () = token.cancelled() => {
                stop_reconcile(work.as_mut(), &cancel, &lease.key).await;
                return if self.force.is_cancelled() { Ended::Released } else { Ended::Lost };
            }
            () = sleep_for(limit) => {
                stop_reconcile(work.as_mut(), &cancel, &lease.key).await;
                let limit = limit.unwrap_or_default();
                return Ended::Outcome(Outcome::Transient(format!("timed out after {limit:?}")));
            }
        };
        Ended::Outcome(match result {
            Ok(result) => outcome_of(result),
            Err(panic) => Outcome::Transient(panic_message(&*panic)),
        })
    }

    /// Writes the outcome through the completer (sharing a commit with other
    /// runs). A failed write is retried with a backoff (20 ms doubling up to
    /// TTL/3) for one TTL at most (over HTTP each try is bounded by TTL/3,
    /// see [`Completer`]); then the outcome is dropped and the lease
    /// handed back, so the key runs again (at-least-once) rather than staying
    /// leased under a live session. The run stops waiting when its token
    /// fires: its session was lost (another node reclaims the key), or the
    /// shutdown deadline passed (closing the session hands the key back).
    /// Each failed try is noted in `write`.
    async fn complete(
        &self,
        lease: &Lease,
        outcome: Outcome,
        trace_id: Option<TraceId>,
        token: &CancellationToken,
        write: &mut OutcomeWrite,
    ) -> WriteEnd {
        let name = outcome.name();
        if matches!(outcome, Outcome::Transient(_)) {
            self.metrics.queue.retries.inc();
        }
        let give_up = Instant::now() + self.settings.ttl;
        let mut delay = Duration::from_millis(20);
        loop {
            let written = tokio::select! {
                biased;
                () = token.cancelled() => return self.unwritten(lease),
                written = self.completer.complete(lease, &outcome, trace_id) => written,
            };
            match written {
                Written::Done => {
                    self.metrics.outcome(name);
                    return WriteEnd::Written;
                }
                Written::Refused(e) => {
                    self.metrics.outcome("lost");
                    tracing::warn!(key = %lease.key, error = %e, "outcome refused: the lease was lost");
                    write.failed(&e);
                    return WriteEnd::Refused;
                }
                Written::Failed(e) if Instant::now() + delay > give_up => {
                    self.metrics.outcome("lost");
                    tracing::error!(key = %lease.key, error = %e, "cannot write the outcome; dropping it and handing the key back to run again");
                    write.failed(&e);
                    self.hand_back(lease, token).await;
                    return WriteEnd::GivenUp;
                }
                Written::Failed(e) => {
                    tracing::warn!(key = %lease.key, error = %e, "cannot write the outcome; retrying");
                    write.failed(&e);
                }
            }
            tokio::select! {
                biased;
                () = token.cancelled() => return self.unwritten(lease),
                () = sleep(delay) => {}
            }
            delay = (delay * 2).min(self.settings.heartbeat_every());
        }
    }

    /// Hands back the lease of an outcome that could not be written, retrying
    /// (20 ms doubling up to TTL/3, each try bounded by TTL/3) until the lease
    /// is released or refused (lost: nothing to hand back), or the run's token
    /// fires (its session was lost, and the database reclaims the key; or the
    /// shutdown deadline passed, and closing the session hands it back). Given
    /// up after one failed try, the lease would stay with a session that lives
    /// on, and the key would never run again while this worker does (rule 3;
    /// the simulation's seed 469 found it).
    async fn hand_back(&self, lease: &Lease, token: &CancellationToken) {
        let every = self.settings.heartbeat_every();
        let mut delay = Duration::from_millis(20);
        loop {
            // Boxed, as in `release`.
            let release = Box::pin(self.backend.lease_release(LeaseRelease { lease }));
            let released = tokio::select! {
                biased;
                () = token.cancelled() => return,
                released = timeout(every, release) => released,
            };
            match released {
                Ok(Ok(())) => return,
                Ok(Err(e)) if e.is_lease_rejection() => return,
                Ok(Err(e)) => {
                    tracing::warn!(key = %lease.key, error = %e, "cannot hand the lease back; retrying");
                }
                Err(_) => {
                    tracing::warn!(key = %lease.key, "handing the lease back timed out; retrying");
                }
            }
            tokio::select! {
                biased;
                () = token.cancelled() => return,
                () = sleep(delay) => {}
            }
            delay = (delay * 2).min(every);
        }
    }

    /// Counts an outcome its run stopped writing when its token fired.
    fn unwritten(&self, lease: &Lease) -> WriteEnd {
        if self.force.is_cancelled() {
            self.metrics.outcome("canceled");
            tracing::warn!(key = %lease.key, "the shutdown deadline passed before the outcome was written; the key runs again");
        } else {
            self.metrics.outcome("lost");
        }
        WriteEnd::Stopped
    }

    /// Hands the lease back (the key is pending again) unless that takes
    /// longer than [`RELEASE_WITHIN`]: the lease then stays with the session,
    /// whose close or expiry hands it back.
    async fn release(&self, lease: &Lease) {
        // Boxed: a backend's call is kilobytes (the HTTP client's most), and
        // inline it would make every run's future that large, which
        // `controller::start` then copies into the heap once per run (6 % of
        // a SQLite burn-down's instructions) for a path few runs take.
        let release = Box::pin(self.backend.lease_release(LeaseRelease { lease }));
        match timeout(RELEASE_WITHIN, release).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(key = %lease.key, error = %e, "cannot release the lease; it goes back with its session");
            }
            Err(_) => {
                tracing::warn!(key = %lease.key, "releasing the lease timed out; it goes back with its session");
            }
        }
    }
}

/// Stops a reconcile that must end: cancels its task and lets it return on
/// its own for [`STOP_GRACE`] (a reconciler watching
/// [`Task::cancelled`](super::Task::cancelled) kills and reaps what it
/// started), then drops it where it stands, which runs its drop guards; a
/// panic of theirs is caught and logged, since the run's outcome is decided
/// already. A reconcile that blocks its thread cannot be stopped by either,
/// and holds its run (and its key's lease) until it returns.
async fn stop_reconcile<F: Future>(
    mut work: Pin<&mut Option<F>>,
    cancel: &CancellationToken,
    key: &str,
) {
    cancel.cancel();
    if let Some(running) = work.as_mut().as_pin_mut()
        && timeout(STOP_GRACE, running).await.is_err()
    {
        tracing::warn!(
            key,
            "a cancelled reconcile did not return within {STOP_GRACE:?}; dropping it"
        );
    }
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| work.set(None))) {
        tracing::error!(key, error = %panic_message(&*panic), "a stopped reconcile panicked as it was dropped");
    }
}

async fn sleep_for(limit: Option<Duration>) {
    match limit {
        Some(limit) => sleep(limit).await,
        None => std::future::pending().await,
    }
}

/// The panic's message, for the history.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string payload".to_owned());
    format!("reconcile panicked: {text}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{Action, BoxError};
    use crate::store::Store;

    struct Noop;

    impl Reconciler for Noop {
        async fn reconcile(&self, _task: Task) -> Result<Action, BoxError> {
            Ok(Action::Done)
        }
    }

    /// The size of what `f` returns: for an async fn, its future.
    fn output_size<A, L, T, P, F>(_f: fn(A, L, T, P) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every run's future is moved into the heap once as its task is spawned,
    /// so its size is paid per key. A backend call awaited inline (one for
    /// every engine and the HTTP client, as large as the largest) made it
    /// about 4 KB (debug build), and its copy 6 % of a SQLite burn-down's
    /// instructions (callgrind).
    #[test]
    fn a_runs_future_holds_no_backend_call_inline() {
        let size = output_size(Run::<Noop, Store>::execute);
        assert!(size <= 2048, "a run's future is {size} bytes");
    }
}
