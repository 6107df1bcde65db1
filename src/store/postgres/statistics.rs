//! Fresh planner statistics after bulk enqueues.
//!
//! A burst of enqueues into an idle process (a million keys after an outage)
//! leaves PostgreSQL believing the process has almost no rows until
//! autovacuum's next `ANALYZE`, up to a minute later. With that belief the
//! planner served the claim from the `(process, key)` unique index plus a sort,
//! reading every pending row on each claim (700 ms per claim of 1,000 keys with
//! a million pending, against 25 ms). So the store counts the rows its own
//! enqueues insert and, past [`THRESHOLD`], runs `ANALYZE drover_items` in the
//! background (a sample of 30,000 rows, off the enqueue's path; one at a time).
//!
//! A smaller burst does the same harm to a process the statistics do not
//! know yet: 30,000 keys of a new process, below the threshold, were claimed
//! at 2,000–2,300 keys/s, each claim's update reading every row of the
//! process and comparing its key with each of the 1,024 claimed ones (half a
//! second per claim). So each process's own rows count too: its first
//! [`FIRST_BURST`] start an analysis, and each time its count doubles after
//! that, so a process that grows steadily costs a logarithmic number of
//! them, and one that stays small none after its first. An analysis asked
//! for while one runs is not dropped: the running one starts again when it
//! ends, so a burst committed after its sample began is still seen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use sqlx::{Executor as _, PgPool};

/// Rows enqueued since the last analysis that trigger the next.
const THRESHOLD: u64 = 50_000;

/// A process's inserted rows that trigger its first analysis: from about
/// this many rows, a claim that reads the whole process costs more than the
/// analysis (a few milliseconds, off the enqueue's path).
const FIRST_BURST: u64 = 1_000;

/// The processes whose rows are counted one by one, at most: past it, new
/// processes count only towards [`THRESHOLD`], so the map stays small
/// whatever names callers use.
const TRACKED: usize = 4_096;

/// Shared by a store's clones: rows inserted since the last `ANALYZE`, each
/// process's inserted rows and the count at which it asks for the next,
/// whether one is running and whether another was asked for meanwhile.
#[derive(Debug, Default)]
pub(super) struct Statistics {
    inserted: AtomicU64,
    processes: Mutex<HashMap<String, Growth>>,
    running: AtomicBool,
    /// Asked for while one was running: the running one analyses again once
    /// it is done, so rows committed after it began its sample are seen.
    again: AtomicBool,
}

/// One process's inserted rows, and the count that asks for an analysis.
#[derive(Debug)]
struct Growth {
    inserted: u64,
    next: u64,
}

impl Statistics {
    /// Counts `rows` new items of `process`; starts an `ANALYZE` when enough
    /// have come in, in all or in the process.
    pub(super) fn inserted(self: &Arc<Self>, pool: &PgPool, process: &str, rows: u64) {
        let total = self.inserted.fetch_add(rows, Relaxed) + rows >= THRESHOLD;
        if !(self.grown(process, rows) || total) {
            return;
        }
        if self.running.swap(true, SeqCst) {
            self.again.store(true, SeqCst);
            return;
        }
        self.inserted.store(0, Relaxed);
        let (this, pool) = (Arc::clone(self), pool.clone());
        tokio::spawn(async move {
            loop {
                // A simple query (no prepared statement), so it runs as it
                // is through a transaction-pooling PgBouncer too.
                if let Err(e) = pool.execute("ANALYZE drover_items").await {
                    tracing::debug!(error = %e, "ANALYZE after a bulk enqueue failed; autovacuum will do it");
                }
                if this.again.swap(false, SeqCst) {
                    continue;
                }
                this.running.store(false, SeqCst);
                // Asked for between the check above and the store: whoever
                // asked saw this one running and left it to analyse again.
                if !this.again.swap(false, SeqCst) || this.running.swap(true, SeqCst) {
                    break;
                }
            }
        });
    }

    /// Adds `rows` to `process`'s count; `true` when it reached the count
    /// that asks for an analysis (which then doubles).
    fn grown(&self, process: &str, rows: u64) -> bool {
        let mut processes = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(growth) = processes.get_mut(process) {
            return growth.add(rows);
        }
        if processes.len() >= TRACKED || rows == 0 {
            return false;
        }
        let mut growth = Growth {
            inserted: 0,
            next: FIRST_BURST,
        };
        let due = growth.add(rows);
        processes.insert(process.to_owned(), growth);
        due
    }
}

impl Growth {
    /// Adds `rows`; `true` when the count reached `next`, which then doubles.
    fn add(&mut self, rows: u64) -> bool {
        self.inserted += rows;
        if self.inserted < self.next {
            return false;
        }
        self.next = self.inserted.saturating_mul(2);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{FIRST_BURST, Statistics, TRACKED};

    #[test]
    fn a_process_asks_for_an_analysis_at_its_first_burst_and_each_time_it_doubles() {
        let statistics = Statistics::default();
        assert!(!statistics.grown("p", FIRST_BURST - 1));
        assert!(statistics.grown("p", 1), "the first burst");
        assert!(!statistics.grown("p", FIRST_BURST - 1));
        assert!(statistics.grown("p", 1), "doubled");
        assert!(!statistics.grown("p", 2 * FIRST_BURST - 1));
        assert!(statistics.grown("p", 1), "doubled again");
        // One large enqueue asks once, then doubles from there.
        assert!(statistics.grown("q", 100 * FIRST_BURST));
        assert!(!statistics.grown("q", 99 * FIRST_BURST));
        assert!(statistics.grown("q", FIRST_BURST));
    }

    #[test]
    fn no_more_than_the_tracked_processes_are_counted_one_by_one() {
        let statistics = Statistics::default();
        for n in 0..TRACKED {
            assert!(!statistics.grown(&format!("p{n}"), 1));
        }
        assert!(!statistics.grown("one more", FIRST_BURST), "not tracked");
        assert!(statistics.grown("p0", FIRST_BURST), "tracked");
        assert_eq!(
            statistics.processes.lock().expect("not poisoned").len(),
            TRACKED
        );
    }
}
