//! `burn-down` and `backlog`: draining enqueued keys through the full claim →
//! reconcile → complete path.

use super::Figure;
use super::store::{BenchError, StoreBench, cleanup, drain, fill, fresh_process, per_s};
use crate::store::{ItemList, StoreEngine as _};

/// How many keys `backlog` drains from the front of each backlog.
pub const BACKLOG_FRONT: u64 = 10_000;

/// Enqueues `keys` keys, then drains them all with `workers` no-op runs at
/// once and as many leases prefetched; keys per second.
pub async fn burn_down(b: &StoreBench) -> Result<Figure, BenchError> {
    let process = fresh_process("burn_down");
    fill(b, &process, b.keys).await?;
    let elapsed = drain(b, &process, b.keys).await?;
    let left = b
        .store
        .item_list(ItemList {
            process: process.clone(),
            state: None,
            after_key: None,
            limit: 1,
        })
        .await?
        .len();
    cleanup(&b.store, &process).await?;
    if left > 0 {
        return Err(BenchError::Timeout(format!(
            "{process} still has items after its burn-down"
        )));
    }
    Ok(b.figure("burn_down", b.keys)
        .with("prefetch", b.workers)
        .with("keys_per_s", per_s(b.keys, elapsed)))
}

/// Drains the first [`BACKLOG_FRONT`] keys (at most `keys`) of a backlog of
/// `keys` pending keys, and of a backlog of just those keys; the ratio of the
/// two rates shows whether claims stay index-bound as the backlog grows.
pub async fn backlog(b: &StoreBench) -> Result<Figure, BenchError> {
    let front = BACKLOG_FRONT.min(b.keys);
    let small = rate(b, front, front).await?;
    let large = rate(b, b.keys, front).await?;
    Ok(b.figure("backlog", b.keys)
        .with("prefetch", b.workers)
        .with("front", front)
        .with("small_keys_per_s", small)
        .with("large_keys_per_s", large)
        .with("ratio", format!("{:.2}", large / small.max(1.0))))
}

/// Keys per second draining `front` keys from a backlog of `size`.
async fn rate(b: &StoreBench, size: u64, front: u64) -> Result<f64, BenchError> {
    let process = fresh_process("backlog");
    fill(b, &process, size).await?;
    let elapsed = drain(b, &process, front).await;
    cleanup(&b.store, &process).await?;
    Ok(per_s(front, elapsed?))
}
