//! Driving drover processes spawned from the built binary: signals, graceful
//! stops, and waiting on conditions only the database can show.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;

/// The `drover` binary under test: `DROVER_TEST_BIN` when set (a copy kept
/// apart from rebuilds, for a long measurement), else the one cargo built.
pub(crate) fn drover_bin() -> String {
    std::env::var("DROVER_TEST_BIN")
        .ok()
        .filter(|bin| !bin.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_drover").to_owned())
}

/// Sends `signal` to a running child.
pub(crate) fn signal(child: &Child, signal: Signal) {
    let pid = i32::try_from(child.id().expect("running")).expect("a pid fits i32");
    kill(Pid::from_raw(pid), signal).expect("signal the child");
}

/// Sends SIGTERM and waits for a graceful exit (status 0) within 30 s.
pub(crate) async fn stop(mut child: Child) {
    signal(&child, Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits within 30 s of SIGTERM")
        .expect("wait for the child");
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
}

/// Polls `check` until it holds (at most 30 s): another process's progress shows
/// only in the database, so there is no signal to wait on instead.
pub(crate) async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, Duration::from_secs(30), check).await;
}

/// [`eventually`] with a bound of its own, for slow work (thousands of
/// commands).
pub(crate) async fn eventually_within<F, Fut>(what: &str, within: Duration, check: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
