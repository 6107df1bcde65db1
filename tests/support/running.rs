//! A controller running in a test's background, and the token that stops it.

use drover::runner::{Controller, Reconciler};
use drover::store::WorkerBackend;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Runs `controller` on a task until the returned token is cancelled; the
/// task panics if the run ends with an error.
pub(crate) fn spawn<R: Reconciler, B: WorkerBackend>(
    controller: Controller<R, B>,
) -> (CancellationToken, JoinHandle<()>) {
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move { controller.run(stop).await.expect("controller runs") }
    });
    (stop, handle)
}
