//! The world's log: every event of a run in one total order, stamped with the
//! simulated time. The checkers read it; a failure prints its tail.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How a reconcile ended, in its own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// It returned this outcome (`done`, `requeue_after`, `transient`, `permanent`).
    Returned(&'static str),
    /// It saw its task cancelled (lease lost, timeout) and stopped.
    Cancelled,
    /// Its worker crashed: it stopped where it stood.
    Crashed,
    /// The runner dropped it before it returned.
    Dropped,
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum What {
    // The producer's and the operator's actions, as the model applied them.
    Enqueue {
        key: String,
        after: Duration,
        state: &'static str,
    },
    Pause,
    Resume,
    Limit(Option<u32>),
    /// A retention pass: the runs it deleted, and the idle keys it forgot.
    Prune {
        runs: u64,
        forgot: Vec<String>,
    },
    Admin {
        action: &'static str,
        key: String,
        result: &'static str,
    },
    // The store's view.
    SessionStart {
        worker: u32,
        session: i64,
        deadline: Duration,
    },
    Heartbeat {
        session: i64,
        result: &'static str,
    },
    SessionClose {
        session: i64,
        released: u64,
    },
    Reclaim {
        session: i64,
        keys: Vec<(String, i64)>,
    },
    Claim {
        worker: u32,
        session: i64,
        key: String,
        token: i64,
    },
    Complete {
        session: i64,
        key: String,
        token: i64,
        outcome: &'static str,
        result: &'static str,
    },
    Release {
        key: String,
        token: i64,
        result: &'static str,
    },
    // The world's faults.
    Fault {
        worker: u32,
        call: &'static str,
        fault: String,
    },
    Crash {
        worker: u32,
    },
    Partition {
        worker: u32,
        slow: Duration,
        down: Duration,
    },
    /// The worker's writes to items (outcomes, hand-backs) fail for `lasts`
    /// while its heartbeats pass.
    WriteOutage {
        worker: u32,
        lasts: Duration,
    },
    Start {
        worker: u32,
    },
    Quiet,
    // The reconcilers' own view.
    RunStart {
        worker: u32,
        key: String,
        token: i64,
    },
    RunEnd {
        worker: u32,
        key: String,
        token: i64,
        how: RunEnd,
    },
}

/// An event with its place in the order and its simulated time.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub seq: usize,
    pub at: Duration,
    pub what: What,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{:<6} {:>9.3}s  {:?}",
            self.seq,
            self.at.as_secs_f64(),
            self.what
        )
    }
}

/// Where the log's time comes from.
#[derive(Debug, Clone)]
enum Origin {
    /// The simulation's paused tokio clock, since this instant.
    Tokio(Instant),
    /// Milliseconds a driver sets by hand: the differential test moves the
    /// model's clock in step with the engines' test clocks.
    Manual(Arc<AtomicU64>),
}

/// The shared log; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Log {
    origin: Origin,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Log {
    pub(crate) fn new(origin: Instant) -> Self {
        Self {
            origin: Origin::Tokio(origin),
            events: Arc::default(),
        }
    }

    /// A log whose time is `ms` milliseconds, as its driver moves them.
    #[allow(dead_code)] // the differential test's, not the simulation's
    pub(crate) fn manual(ms: Arc<AtomicU64>) -> Self {
        Self {
            origin: Origin::Manual(ms),
            events: Arc::default(),
        }
    }

    /// Simulated time since the world began.
    pub(crate) fn now(&self) -> Duration {
        match &self.origin {
            Origin::Tokio(origin) => Instant::now().duration_since(*origin),
            Origin::Manual(ms) => Duration::from_millis(ms.load(Ordering::SeqCst)),
        }
    }

    pub(crate) fn push(&self, what: What) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = events.len();
        events.push(Event {
            seq,
            at: self.now(),
            what,
        });
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The last `n` events before (and including) `upto`, one per line, for a
/// failure's report.
pub(crate) fn tail(events: &[Event], upto: usize, n: usize) -> String {
    let end = (upto + 1).min(events.len());
    let start = end.saturating_sub(n);
    events[start..end]
        .iter()
        .map(|e| format!("  {e}\n"))
        .collect()
}
