//! `enqueue`: keys enqueued per second, in batches, by concurrent producers.

use std::sync::Arc;

use tokio::time::Instant;

use super::Figure;
use super::store::{BenchError, ENQUEUE_BATCH, StoreBench, batches, cleanup, fresh_process, per_s};
use super::wal::WalMark;
use crate::store::{ItemEnqueue, StoreEngine as _};

/// Enqueues `keys` fresh keys in batches of [`ENQUEUE_BATCH`], `workers`
/// producers at once (each enqueue is one call, coalescing and history
/// included); keys per second.
pub async fn enqueue(b: &StoreBench) -> Result<Figure, BenchError> {
    let process = fresh_process("enqueue");
    // Makes the process known and opens connections before the clock starts.
    let warm = ItemEnqueue::new(&process, ["warm-up"]);
    b.store.item_enqueue(warm).await?;
    let batches = Arc::new(batches(b.keys));
    b.phase("enqueueing", b.keys);
    let wal = WalMark::now(&b.store).await?;
    let start = Instant::now();
    let producers: Vec<_> = (0..b.workers.max(1))
        .map(|first| {
            let (b, batches, process) = (b.clone(), Arc::clone(&batches), process.clone());
            tokio::spawn(async move {
                for batch in batches.iter().skip(first).step_by(b.workers.max(1)) {
                    let params = ItemEnqueue::new(&process, batch.iter().cloned());
                    b.store.item_enqueue(params).await?;
                    b.progress.inc(batch.len() as u64);
                }
                Ok::<_, BenchError>(())
            })
        })
        .collect();
    for producer in producers {
        producer.await.map_err(std::io::Error::other)??;
    }
    let elapsed = start.elapsed();
    let figure = b.figure("enqueue", b.keys).with("batch", ENQUEUE_BATCH);
    let figure = wal.per_key(&b.store, b.keys, figure).await?;
    cleanup(&b.store, &process).await?;
    Ok(figure.with("keys_per_s", per_s(b.keys, elapsed)))
}
