//! The in-memory queue against a bare tokio channel.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Figure;
use crate::queue::Queue;

/// The result of [`queue_cycle`]: add → get → done cycles per second through one
/// shared [`Queue`], next to send → recv cycles per second through bare
/// `tokio::sync::mpsc` channels (one per worker, so the channels never contend:
/// with several workers the ratio shows what sharing one queue costs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueCycle {
    /// Consumer tasks.
    pub workers: usize,
    /// Items moved per run.
    pub items: u64,
    /// Queue cycles per second (best run).
    pub ops_per_s: f64,
    /// Channel items per second (best run).
    pub mpsc_ops_per_s: f64,
}

impl QueueCycle {
    /// `ops_per_s / mpsc_ops_per_s`: how much of a bare channel's speed the full
    /// queue (coalescing, priorities, delays, backoff) keeps.
    #[must_use]
    pub fn ratio(&self) -> f64 {
        self.ops_per_s / self.mpsc_ops_per_s
    }

    /// The figure as a `BENCH` line.
    #[must_use]
    pub fn figure(&self) -> Figure {
        Figure::new("queue")
            .with("engine", "memory")
            .with("keys", self.items)
            .with("workers", self.workers)
            .with("ops_per_s", self.ops_per_s.round())
            .with("mpsc_ops_per_s", self.mpsc_ops_per_s.round())
            .with("ratio", format!("{:.2}", self.ratio()))
    }
}

/// Runs `items` distinct keys through `workers` tasks, each cycling its share
/// through the queue, then through its own channel; `runs` times each
/// (alternating, so both see the same machine state), keeping each side's best.
///
/// Must run on a multi-thread tokio runtime for the tasks to run in parallel.
pub async fn queue_cycle(workers: usize, items: u64, runs: usize) -> QueueCycle {
    let workers = workers.max(1);
    let (mut best_queue, mut best_mpsc) = (Duration::MAX, Duration::MAX);
    for _ in 0..runs.max(1) {
        best_queue = best_queue.min(run_queue(workers, items).await);
        best_mpsc = best_mpsc.min(run_mpsc(workers, items).await);
    }
    let per_s = |d: Duration| items as f64 / d.as_secs_f64().max(1e-9);
    QueueCycle {
        workers,
        items,
        ops_per_s: per_s(best_queue),
        mpsc_ops_per_s: per_s(best_mpsc),
    }
}

/// Each worker task runs `add → get → done` on its own share of the keys.
async fn run_queue(workers: usize, items: u64) -> Duration {
    let queue: Queue<u64> = Queue::new();
    let start = Instant::now();
    let tasks: Vec<_> = shares(workers, items)
        .map(|keys| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for key in keys {
                    queue.add(key);
                    // Each task adds before it gets, so a key is always ready.
                    let got = queue.get().await.expect("queue is running");
                    queue.done(&got);
                }
            })
        })
        .collect();
    join(tasks).await;
    start.elapsed()
}

/// Each worker task sends its share of the keys through its own channel and
/// receives each one back.
async fn run_mpsc(workers: usize, items: u64) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = shares(workers, items)
        .map(|keys| {
            tokio::spawn(async move {
                let (tx, mut rx) = mpsc::unbounded_channel::<u64>();
                for key in keys {
                    // Both ends live in this task.
                    tx.send(key).expect("receiver alive");
                    rx.recv().await.expect("sender alive");
                }
            })
        })
        .collect();
    join(tasks).await;
    start.elapsed()
}

/// Splits `0..items` into `workers` interleaved shares.
fn shares(
    workers: usize,
    items: u64,
) -> impl Iterator<Item = std::iter::StepBy<std::ops::Range<u64>>> {
    let step = workers;
    (0..workers as u64).map(move |first| (first..items).step_by(step))
}

async fn join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        // The tasks only panic on a bench bug; surface it.
        task.await.expect("bench task panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::queue_cycle;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_cycle_bench_runs_both_sides_and_prints_a_bench_line() {
        let figures = queue_cycle(3, 2_000, 1).await;
        assert!(figures.ops_per_s > 0.0 && figures.mpsc_ops_per_s > 0.0);
        assert!(
            figures
                .figure()
                .to_string()
                .starts_with("BENCH scenario=queue engine=memory keys=2000 workers=3 ")
        );
    }
}
