//! The completer: one task that writes the outcomes of all of a controller's
//! runs, many per transaction.
//!
//! A commit, not the work, bounds a busy control loop: one per key caps it at
//! the database's commit rate. Runs hand their outcome to the completer and wait
//! for its answer; the completer takes whatever outcomes are queued (up to
//! [`MAX_BATCH`]) and writes them with one
//! [`lease_complete_batch`](crate::store::StoreEngine::lease_complete_batch), so
//! many runs share one commit. It never waits to fill a batch: when the database
//! is idle a lone outcome is written at once, and when it is busy the outcomes
//! that arrive during one write form the next batch (group commit).
//!
//! Fencing is unchanged: the store checks each lease on its own, and a lease
//! that was lost gets its own refusal while the rest of the batch commits.
//!
//! Batches are written one at a time, so one whose request goes silent holds
//! every outcome queued behind it. Over HTTP each request is given up after a
//! heartbeat interval (TTL/3,
//! [`lease_complete_batch_within`](WorkerBackend::lease_complete_batch_within)):
//! its outcomes fail as maybe written and their runs retry them, within the
//! one TTL they are retried for. It waited the client's request timeout
//! (30 s) before, past that TTL.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::store::{Lease, LeaseComplete, Outcome, StoreError, TraceId, WorkerBackend};

/// The most outcomes written in one transaction. Measured with 1,024 no-op
/// runs: 2,048 drained 5–15 % faster than 512 on both engines (fewer commits
/// and lease look-ups per key); a batch is only as large as what queued up
/// during the previous write, so a quiet loop still writes one at a time.
pub(crate) const MAX_BATCH: usize = 2048;

/// What became of one outcome.
#[derive(Debug)]
pub(crate) enum Written {
    /// Committed.
    Done,
    /// Refused for this lease alone (`LeaseLost`, `SessionExpired`): nothing was
    /// written and retrying cannot help.
    Refused(StoreError),
    /// The whole batch failed; nothing (or, after `CommitUnknown`, possibly
    /// everything) was written. The run may retry.
    Failed(Arc<StoreError>),
}

struct Job {
    lease: Lease,
    outcome: Outcome,
    trace_id: Option<TraceId>,
    reply: oneshot::Sender<Written>,
}

/// A handle runs write their outcomes through. Cheap to clone.
#[derive(Debug)]
pub(crate) struct Completer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("lease", &self.lease).finish()
    }
}

impl Completer {
    /// Starts the writer task on `backend`, each of whose requests is given
    /// up after `within`; it runs until `stop` fires (see [`write_loop`]) or
    /// every handle is dropped.
    pub(crate) fn start<B: WorkerBackend>(
        backend: B,
        within: Duration,
        tracker: &tokio_util::task::TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tracker.spawn(write_loop(backend, within, queue, stop));
        Self { jobs }
    }

    /// Writes `outcome` for `lease` (and the run's `trace_id`, when traced)
    /// in the next batch and waits for the answer.
    pub(crate) async fn complete(
        &self,
        lease: &Lease,
        outcome: &Outcome,
        trace_id: Option<TraceId>,
    ) -> Written {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            lease: lease.clone(),
            outcome: outcome.clone(),
            trace_id,
            reply,
        };
        if self.jobs.send(job).is_err() {
            return Written::Failed(Arc::new(StoreError::InvalidArgument(
                "the completer has stopped".into(),
            )));
        }
        answer.await.unwrap_or_else(|_| {
            Written::Failed(Arc::new(StoreError::InvalidArgument(
                "the completer dropped the outcome".into(),
            )))
        })
    }
}

/// Takes every queued job (up to [`MAX_BATCH`]) and writes them in one batch,
/// until `stop` fires. The controller stops it once every run has ended, so a
/// job still queued or being written then has nobody waiting for it (its run
/// gave up at the shutdown deadline): it is dropped, not written, and a
/// database that does not answer cannot hold shutdown up. The session's close
/// or expiry hands such a key back.
async fn write_loop<B: WorkerBackend>(
    backend: B,
    within: Duration,
    mut queue: mpsc::UnboundedReceiver<Job>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let first = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            job = queue.recv() => job,
        };
        let Some(first) = first else { return };
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = write(&backend, within, &mut batch) => {}
        }
    }
}

/// Writes `batch` (emptying it), each request bounded by `within`, and
/// answers each job.
async fn write<B: WorkerBackend>(backend: &B, within: Duration, batch: &mut Vec<Job>) {
    let params: Vec<LeaseComplete<'_>> = batch
        .iter()
        .map(|job| LeaseComplete {
            lease: &job.lease,
            outcome: &job.outcome,
            trace_id: job.trace_id,
        })
        .collect();
    let result = backend.lease_complete_batch_within(&params, within).await;
    drop(params);
    match result {
        Ok(results) => {
            for (job, result) in batch.drain(..).zip(results) {
                let written = match result {
                    Ok(()) => Written::Done,
                    Err(e) if e.is_lease_rejection() => Written::Refused(e),
                    Err(e) => Written::Failed(Arc::new(e)),
                };
                job.reply.send(written).ok();
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for job in batch.drain(..) {
                job.reply.send(Written::Failed(Arc::clone(&e))).ok();
            }
        }
    }
}
