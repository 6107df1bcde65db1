//! `burn-down` and `backlog`: draining enqueued keys through the full claim →
//! reconcile → complete path.

use super::Figure;
use super::store::{
    BenchError, StoreBench, cleanup, drain, fill, fresh_process, idle_keys, per_s, settle,
};
use super::wal::WalMark;
use crate::store::{LimitChanges, ProcessConfigure, StoreEngine as _};

/// How many keys `backlog` drains from the front of each backlog.
pub const BACKLOG_FRONT: u64 = 10_000;

/// Enqueues `keys` keys, then drains them all with `workers` no-op runs at
/// once and as many leases prefetched; keys per second.
pub async fn burn_down(b: &StoreBench) -> Result<Figure, BenchError> {
    burn_down_limited(b, LimitChanges::default()).await
}

/// [`burn_down`] with the process's fleet limits set first (a concurrency
/// limit, a rate limit): what the limits cost when they do not bind, next to
/// the unlimited figure. The figure names the limits it ran under.
pub async fn burn_down_limited(b: &StoreBench, limits: LimitChanges) -> Result<Figure, BenchError> {
    let process = fresh_process("burn_down");
    if limits != LimitChanges::default() {
        let mut configure = ProcessConfigure::new(process.clone());
        configure.limits = limits;
        b.store.process_configure(configure).await?;
    }
    fill(b, &process, b.keys).await?;
    let wal = WalMark::now(&b.store).await?;
    let elapsed = drain(b, &process, b.keys).await?;
    let figure = b.figure("burn_down", b.keys).with("prefetch", b.workers);
    let mut figure = wal.per_key(&b.store, b.keys, figure).await?;
    let left = b
        .counts_of(&process)
        .await?
        .map_or(0, |c| c.pending + c.backoff + c.running + c.parked);
    cleanup(&b.store, &process).await?;
    if left > 0 {
        return Err(BenchError::Timeout(format!(
            "{process} still has {left} keys to run after its burn-down"
        )));
    }
    if let Some(Some(n)) = limits.concurrency {
        figure = figure.with("concurrency", n);
    }
    if let Some(Some(rate)) = limits.rate {
        figure = figure.with("rate_per_s", rate);
    }
    Ok(figure.with("keys_per_s", per_s(b.keys, elapsed)))
}

/// Drains the first [`BACKLOG_FRONT`] keys (at most `keys`) of a backlog of
/// `keys` pending keys (with `idle` idle keys beside them), and of a backlog of
/// just those keys; the ratio of the two rates shows whether claims stay
/// index-bound as the backlog, and the set of known keys, grow.
pub async fn backlog(b: &StoreBench) -> Result<Figure, BenchError> {
    let front = BACKLOG_FRONT.min(b.keys);
    let small = rate(b, front, front, 0).await?;
    let large = rate(b, b.keys, front, b.idle).await?;
    Ok(b.figure("backlog", b.keys)
        .with("idle", b.idle)
        .with("prefetch", b.workers)
        .with("front", front)
        .with("small_keys_per_s", small)
        .with("large_keys_per_s", large)
        .with("ratio", format!("{:.2}", large / small.max(1.0))))
}

/// Keys per second draining `front` keys from a backlog of `size`, beside
/// `idle` idle keys.
async fn rate(b: &StoreBench, size: u64, front: u64, idle: u64) -> Result<f64, BenchError> {
    let process = fresh_process("backlog");
    fill(b, &process, size).await?;
    if idle > 0 {
        b.phase("making keys idle", 1);
        idle_keys(&b.store, &process, idle).await?;
    }
    settle(&b.store).await?;
    let elapsed = drain(b, &process, front).await;
    cleanup(&b.store, &process).await?;
    Ok(per_s(front, elapsed?))
}
