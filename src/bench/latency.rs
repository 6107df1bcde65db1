//! `latency`: idle workers, keys enqueued one at a time at a steady rate; how long
//! from the enqueue call until the reconcile starts.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval};
use tokio_util::sync::CancellationToken;

use super::Figure;
use super::store::{BenchError, StoreBench, cleanup, fresh_process, key};
use crate::runner::{Action, Controller, Task};
use crate::store::{ItemEnqueue, StoreEngine as _};

/// Enqueue times by key, and the latencies measured so far.
#[derive(Debug, Default)]
struct Clock {
    sent: Mutex<HashMap<String, Instant>>,
    seen: Mutex<Vec<Duration>>,
    all_seen: tokio::sync::Notify,
}

impl Clock {
    fn send(&self, key: &str) {
        let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent.insert(key.to_owned(), Instant::now());
    }

    /// Records `key`'s latency (once: a key only runs once here).
    fn start(&self, key: &str, total: usize) {
        let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(at) = sent.get(key).copied() else {
            return; // the warm-up key
        };
        drop(sent);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.push(at.elapsed());
        if seen.len() == total {
            self.all_seen.notify_one();
        }
    }
}

/// With `workers` idle runs waiting, enqueues `keys` keys one per call at `rate`
/// keys per second; the enqueue → reconcile-start latency's p50, p99 and max.
pub async fn latency(b: &StoreBench, rate: u32) -> Result<Figure, BenchError> {
    let process = fresh_process("latency");
    let total = usize::try_from(b.keys).unwrap_or(usize::MAX);
    let clock = Arc::new(Clock::default());
    let seen = Arc::clone(&clock);
    let warmed = Arc::new(tokio::sync::Notify::new());
    let warm = Arc::clone(&warmed);
    let reconciler = move |task: Task| {
        seen.start(task.key(), total);
        warm.notify_one();
        async { Ok::<_, Infallible>(Action::Done) }
    };
    let controller = Controller::builder(b.store.clone(), &process, reconciler)
        .component("drover bench")
        .parallelism(b.workers)
        .build()?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    // One key first, so the session is up and the connections are open.
    b.store
        .item_enqueue(ItemEnqueue::new(&process, ["warm-up"]))
        .await?;
    warmed.notified().await;
    send(b, &process, rate, &clock).await?;
    let limit = Duration::from_secs(30);
    let all = tokio::time::timeout(limit, clock.all_seen.notified()).await;
    shutdown.cancel();
    running.await.map_err(std::io::Error::other)??;
    cleanup(&b.store, &process).await?;
    all.map_err(|_| BenchError::Timeout(format!("keys still not started {limit:?} later")))?;
    let mut seen = clock
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    seen.sort_unstable();
    let ms = |q: usize| {
        format!(
            "{:.2}",
            seen[(seen.len() - 1) * q / 100].as_secs_f64() * 1e3
        )
    };
    Ok(b.figure("latency", b.keys)
        .with("rate", rate)
        .with("p50_ms", ms(50))
        .with("p99_ms", ms(99))
        .with("max_ms", ms(100)))
}

/// Enqueues the keys one per call, one every `1 / rate` seconds.
async fn send(b: &StoreBench, process: &str, rate: u32, clock: &Clock) -> Result<(), BenchError> {
    b.phase("enqueueing one by one", b.keys);
    let mut tick = interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for i in 0..b.keys {
        tick.tick().await;
        let key = key(i);
        clock.send(&key);
        b.store
            .item_enqueue(ItemEnqueue::new(process, [key]))
            .await?;
        b.progress.inc(1);
    }
    Ok(())
}
