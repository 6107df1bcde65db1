//! SIGINT/SIGTERM handling shared by the long-running commands.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::say::errln;

/// Installs SIGINT and SIGTERM handlers now (call it before announcing readiness,
/// so a signal sent right after the banner is not fatal) and returns the task to
/// spawn: it cancels `shutdown` on the first signal (graceful shutdown) and exits
/// the process at once on the second.
pub(crate) fn shutdown_on_signals(shutdown: CancellationToken) -> impl Future<Output = ()> {
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut int), Ok(mut term)) = handlers else {
            errln!("warning: cannot install signal handlers; stop drover with SIGKILL");
            return;
        };
        for count in 0.. {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            if count > 0 {
                errln!("second signal: exiting now");
                super::streams::flush_within(std::time::Duration::from_millis(100));
                std::process::exit(130);
            }
            // Cancelled before anything is written: stderr may be gone.
            shutdown.cancel();
            errln!("shutting down gracefully (signal again to exit now)");
        }
    }
}
