//! Stress: OS threads add a few keys as fast as they can while worker tasks on a
//! multi-threaded runtime process them. Every hand-out is recorded; no key may be
//! held twice at once, and every add must be followed by a hand-out that started
//! after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use drover::queue::Queue;

const KEYS: usize = 4;
const ADDERS: usize = 3;
const ADDS_PER_ADDER: usize = 1_000;
const ROUNDS: usize = 200;
const WORKERS: usize = 8;

#[derive(Default)]
struct KeyLog {
    held: AtomicBool,
    starts: AtomicUsize,
    /// The most hand-outs of this key that had started before some add of it.
    starts_before_an_add: AtomicUsize,
    adds: AtomicUsize,
}

/// One round on a fresh queue: adders race workers, then the queue drains and
/// every key's log is checked. Returns how many adds were coalesced.
fn round(rt: &tokio::runtime::Runtime) -> usize {
    let queue: Queue<usize> = Queue::new();
    let log: Arc<Vec<KeyLog>> = Arc::new((0..KEYS).map(|_| KeyLog::default()).collect());
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| rt.spawn(work(queue.clone(), Arc::clone(&log))))
        .collect();
    let adders: Vec<_> = (0..ADDERS)
        .map(|adder| {
            let (queue, log) = (queue.clone(), Arc::clone(&log));
            std::thread::spawn(move || {
                for i in 0..ADDS_PER_ADDER {
                    let key = (i + adder) % KEYS;
                    let entry = &log[key];
                    entry
                        .starts_before_an_add
                        .fetch_max(entry.starts.load(SeqCst), SeqCst);
                    entry.adds.fetch_add(1, SeqCst);
                    queue.add(key);
                }
            })
        })
        .collect();
    for adder in adders {
        adder.join().unwrap();
    }
    rt.block_on(async {
        queue.shut_down_with_drain().await;
        for worker in workers {
            worker.await.unwrap();
        }
    });
    let mut coalesced = 0;
    for (key, entry) in log.iter().enumerate() {
        let (starts, adds) = (entry.starts.load(SeqCst), entry.adds.load(SeqCst));
        let needed = entry.starts_before_an_add.load(SeqCst) + 1;
        assert!(
            starts >= needed,
            "key {key}: an add was lost ({starts} runs, needed {needed})"
        );
        assert!(starts <= adds, "key {key}: {starts} runs for {adds} adds");
        coalesced += adds - starts;
    }
    coalesced
}

async fn work(queue: Queue<usize>, log: Arc<Vec<KeyLog>>) {
    while let Some(key) = queue.get().await {
        let entry = &log[key];
        assert!(
            !entry.held.swap(true, SeqCst),
            "key {key} held twice at once"
        );
        entry.starts.fetch_add(1, SeqCst);
        // Hold the key across a few scheduling points, so adds land while it is
        // processing.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        entry.held.store(false, SeqCst);
        queue.done(&key);
    }
}

#[test]
fn no_key_is_held_twice_and_every_add_is_followed_by_a_hand_out() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let coalesced: usize = (0..ROUNDS).map(|_| round(&rt)).sum();
    assert!(
        coalesced > 0,
        "the stress never coalesced an add; it tests nothing"
    );
}
