//! `recovery`: a worker process holding leases dies by `SIGKILL`; how long until
//! every one of its keys has run elsewhere, next to the session TTL.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::Figure;
use super::store::{
    BenchError, StoreBench, Tally, cleanup, counting_controller, fill, fresh_process, tick_progress,
};
use crate::store::StoreEngine as _;

/// Starts `drover work` (the binary at `drover`) on `keys` keys with a session
/// TTL of `ttl`, each run blocking, waits until it holds every key, kills it
/// with `SIGKILL`, and times how long a controller of this process (already
/// running, `workers` runs at once, the same TTL) takes to run them all.
pub async fn recovery(b: &StoreBench, drover: &Path, ttl: Duration) -> Result<Figure, BenchError> {
    let process = fresh_process("recovery");
    fill(b, &process, b.keys).await?;
    let mut child = spawn_worker(b, drover, &process, ttl)?;
    let held = wait_running(b, &process, &mut child).await;
    let tally = Arc::new(Tally::default());
    let survivor = counting_controller(
        b.store.clone(),
        &process,
        b.workers,
        &tally,
        b.keys,
        Some(ttl),
    )?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(survivor.run(shutdown.clone()));
    let result = match held {
        Ok(()) => time_recovery(b, &mut child, &tally, ttl).await,
        Err(e) => Err(e),
    };
    child.start_kill().ok();
    shutdown.cancel();
    running.await.map_err(std::io::Error::other)??;
    cleanup(&b.store, &process).await?;
    let recovered = result?;
    Ok(b.figure("recovery", b.keys)
        .with("ttl_s", format!("{:.2}", ttl.as_secs_f64()))
        .with("recovery_s", format!("{:.2}", recovered.as_secs_f64())))
}

/// `drover work PROCESS` whose command sleeps far longer than the scenario.
fn spawn_worker(
    b: &StoreBench,
    drover: &Path,
    process: &str,
    ttl: Duration,
) -> Result<Child, BenchError> {
    let ttl_ms = format!("{}ms", ttl.as_millis());
    let parallelism = b.keys.min(u64::from(u16::MAX)).to_string();
    let child = Command::new(drover)
        .args(["work", process, "--exec", "sh -c 'exec sleep 600' sh"])
        .args([
            "--parallelism",
            &parallelism,
            "--ttl",
            &ttl_ms,
            "--db",
            &b.url,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    Ok(child)
}

/// Waits until the child holds every key of `process`.
async fn wait_running(b: &StoreBench, process: &str, child: &mut Child) -> Result<(), BenchError> {
    b.phase("waiting for the worker to hold every key", b.keys);
    let limit = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = b.store.process_counts_all().await?;
        let running = counts
            .iter()
            .find(|c| c.process == process)
            .map_or(0, |c| c.running);
        b.progress.set_position(running);
        if running >= b.keys {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(BenchError::Child(std::io::Error::other(format!(
                "drover work exited: {status}"
            ))));
        }
        if Instant::now() > limit {
            return Err(BenchError::Timeout(
                "drover work never held every key".into(),
            ));
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Kills the child and waits until the survivor ran every key.
async fn time_recovery(
    b: &StoreBench,
    child: &mut Child,
    tally: &Arc<Tally>,
    ttl: Duration,
) -> Result<Duration, BenchError> {
    b.phase("recovering", b.keys);
    child.start_kill()?;
    let killed = Instant::now();
    child.wait().await?;
    let ticker = tick_progress(b.progress.clone(), Arc::clone(tally));
    let limit = ttl * 3 + Duration::from_secs(30);
    let reached = tokio::time::timeout(limit, tally.reached.notified()).await;
    ticker.abort();
    reached.map_err(|_| BenchError::Timeout(format!("keys not recovered within {limit:?}")))?;
    Ok(killed.elapsed())
}
