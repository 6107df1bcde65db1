//! `cargo bench --bench queue`: the in-memory queue's add → get → done cycles per
//! second next to a bare tokio mpsc channel, for one worker and several.
//!
//! Criterion reports the statistics; the `BENCH …` lines at the end are the
//! machine-readable figures (target: ratio ≥ 0.5 with one worker).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group};
use drover::bench::queue_cycle;

const WORKERS: [usize; 3] = [1, 4, 16];
const ITEMS: u64 = 200_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the bench")
}

fn cycles(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("queue_cycle");
    group.throughput(Throughput::Elements(1));
    for workers in WORKERS {
        group.bench_function(format!("queue/{workers}"), |b| {
            b.iter_custom(|iters| {
                let figures = rt.block_on(queue_cycle(workers, iters, 1));
                Duration::from_secs_f64(iters as f64 / figures.ops_per_s)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, cycles);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let rt = runtime();
    for workers in WORKERS {
        println!("{}", rt.block_on(queue_cycle(workers, ITEMS, 5)).figure());
    }
}
