//! SIGINT/SIGTERM handling shared by the long-running commands.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Cancels `shutdown` on the first SIGINT or SIGTERM (graceful shutdown), and
/// exits the process at once on the second.
pub(crate) async fn shutdown_on_signals(shutdown: CancellationToken) {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("warning: cannot install signal handlers; stop drover with SIGKILL");
        return;
    };
    for count in 0.. {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        if count > 0 {
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        }
        eprintln!("shutting down gracefully (signal again to exit now)");
        shutdown.cancel();
    }
}
