//! What users implement: a [`Reconciler`] turns one key's current state into the
//! desired one and says what should happen next.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::error::BoxError;
use crate::store::{FencingToken, Lease, Store};

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Converged: forget the key until it is enqueued again.
    Done,
    /// Converged for now; look again after this long (a periodic resync). An
    /// enqueue in the meantime runs it sooner.
    RequeueAfter(Duration),
}

/// One run of one key, handed to [`Reconciler::reconcile`].
///
/// The run owns a lease on `(process, key)`: no other worker, in this process or
/// any other sharing the database, runs the key until this run ends.
#[derive(Debug, Clone)]
pub struct Task {
    lease: Lease,
    cancel: CancellationToken,
    store: Option<Store>,
}

impl Task {
    pub(crate) fn new(lease: Lease, cancel: CancellationToken, store: Option<Store>) -> Self {
        Self {
            lease,
            cancel,
            store,
        }
    }

    /// The key to reconcile.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.lease.key
    }

    /// The process (control loop) the key belongs to.
    #[must_use]
    pub fn process(&self) -> &str {
        &self.lease.process
    }

    /// 1 for a first try, n + 1 after n consecutive failures.
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    /// The fencing token of the lease this run holds: strictly greater than the
    /// token of any earlier run of any key.
    ///
    /// No lease system can stop a worker that is paused (SIGSTOP, a frozen VM, a
    /// long GC pause) from resuming this run after its lease was given to
    /// another worker. Pass the token along with every write to a downstream
    /// system that can keep the highest token it has seen per key and refuse a
    /// write carrying a lower one: then the stale run is refused there too.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.lease.token
    }

    /// The lease this run holds, with its fencing token (see
    /// [`fencing_token`](Self::fencing_token)).
    #[must_use]
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The store, for reconcilers that keep their own state in the same
    /// database; `None` when the controller works through a drover server
    /// ([`Client`](crate::client::Client)).
    #[must_use]
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Completes when the run must stop: its lease was lost (session expired),
    /// it ran past the controller's timeout, or shutdown's deadline passed.
    /// Whatever the reconcile returns after that is not written (a timeout's
    /// is: a transient failure). A reconciler doing long work should `select!`
    /// on this: it then has [`STOP_GRACE`](super::STOP_GRACE) to stop what it
    /// started (kill a child process and wait for it) before its future is
    /// dropped.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Whether the run must stop (see [`cancelled`](Self::cancelled)).
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// A control loop's logic: bring one key's object to its desired state.
///
/// Errors are classified by [`classify`](super::classify): wrap with
/// [`permanent`](super::permanent) to park the key until its next enqueue;
/// anything else is retried with the process's backoff. A panic counts as a
/// transient failure and the worker lives on.
///
/// Closures `Fn(Task) -> impl Future<Output = Result<Action, E>>` implement it.
pub trait Reconciler: Send + Sync + 'static {
    /// Reconciles `task.key()`.
    fn reconcile(&self, task: Task) -> impl Future<Output = Result<Action, BoxError>> + Send;
}

impl<F, Fut, E> Reconciler for F
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send,
    E: Into<BoxError>,
{
    fn reconcile(&self, task: Task) -> impl Future<Output = Result<Action, BoxError>> + Send {
        let run = self(task);
        async move { run.await.map_err(Into::into) }
    }
}
