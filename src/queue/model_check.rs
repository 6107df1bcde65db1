//! Model checking of the queue's core with shuttle: the real `Shared` code (add,
//! async get with its wake-up protocol, done, shut_down) runs under shuttle's
//! mutex and scheduler, which explore thousands of interleavings of the racing
//! tasks — in particular an add that lands while the key is being processed, and
//! a `get` that is about to sleep just as a key arrives.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use shuttle::sync::atomic::{AtomicBool, AtomicUsize};
use shuttle::sync::{Mutex, MutexGuard};

use super::AddOpts;
use super::lock::Lock;
use super::rate_limit::MaxOf;
use super::state::State;
use super::workqueue::Shared;

impl<T: Send> Lock<T> for Mutex<T> {
    type Guard<'a>
        = MutexGuard<'a, T>
    where
        T: 'a;

    fn new(value: T) -> Self {
        Mutex::new(value)
    }

    fn lock(&self) -> Self::Guard<'_> {
        Mutex::lock(self).unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn after_unlock(&self) {
        shuttle::thread::yield_now();
    }
}

type ModelQueue = Shared<u8, Mutex<State<u8>>>;

/// What the workers and the adder observed.
#[derive(Default)]
struct Observed {
    held: AtomicBool,
    starts: AtomicUsize,
    /// The most hand-outs that had started before some add began: a run must
    /// start after that add.
    starts_before_an_add: AtomicUsize,
}

/// One key, added once up front; `workers` tasks get → done until the queue
/// closes; an adder adds the key `adds` more times, racing with them; then the
/// queue shuts down.
fn scenario(workers: usize, adds: usize) {
    let queue = Arc::new(ModelQueue::new(None, Arc::new(MaxOf::default()), None));
    let seen = Arc::new(Observed::default());
    queue.add(7, AddOpts::default());
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (queue, seen) = (Arc::clone(&queue), Arc::clone(&seen));
            shuttle::future::spawn(async move {
                while let Some(key) = queue.get().await {
                    assert!(
                        !seen.held.swap(true, SeqCst),
                        "key handed out twice at once"
                    );
                    seen.starts.fetch_add(1, SeqCst);
                    seen.held.store(false, SeqCst);
                    queue.done(&key);
                }
            })
        })
        .collect();
    let adder = {
        let (queue, seen) = (Arc::clone(&queue), Arc::clone(&seen));
        shuttle::future::spawn(async move {
            for _ in 0..adds {
                let before = seen.starts.load(SeqCst);
                seen.starts_before_an_add.fetch_max(before, SeqCst);
                queue.add(7, AddOpts::default());
            }
        })
    };
    shuttle::future::block_on(async move {
        adder.await.expect("adder finished");
        queue.shut_down();
        for task in tasks {
            task.await.expect("worker finished");
        }
        let starts = seen.starts.load(SeqCst);
        let needed = seen.starts_before_an_add.load(SeqCst) + 1;
        assert!(
            starts >= needed,
            "an add was lost: {starts} runs, needed {needed}"
        );
        assert!(
            starts <= 1 + adds,
            "more runs ({starts}) than adds ({})",
            1 + adds
        );
    });
}

#[test]
fn add_while_processing_is_never_lost_nor_handed_out_twice_random() {
    shuttle::check_random(|| scenario(2, 2), 3_000);
}

#[test]
fn add_while_processing_is_never_lost_nor_handed_out_twice_pct() {
    shuttle::check_pct(|| scenario(2, 3), 3_000, 3);
}

#[test]
fn waiting_workers_never_sleep_through_a_shutdown() {
    shuttle::check_random(|| scenario(3, 0), 3_000);
}
