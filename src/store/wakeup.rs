//! In-process wake-ups: an enqueue through any [`Store`] in this process wakes
//! the controllers of its process at once, on either engine.
//!
//! The registry is keyed by process name only, not by database: a controller
//! woken by an enqueue to another database with the same process name finds
//! nothing and waits again. A wake-up is a hint, never a guarantee; controllers
//! poll as well.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use tokio::sync::Notify;

use super::Store;

type Registry = Mutex<HashMap<String, Weak<Notify>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// Wakes every waiter subscribed to `process` in this process.
pub(crate) fn notify(process: &str) {
    let registry = registry().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(notify) = registry.get(process).and_then(Weak::upgrade) {
        notify.notify_waiters();
    }
}

/// Whether anything in this process holds `process`'s signal (a
/// controller, a waiting claim, a server's line): the store keeps
/// listening for other nodes' wake-ups of that process only while one does.
#[cfg(any(feature = "postgres", test))]
pub(crate) fn waited_on(process: &str) -> bool {
    let registry = registry().lock().unwrap_or_else(PoisonError::into_inner);
    registry
        .get(process)
        .is_some_and(|notify| notify.strong_count() > 0)
}

/// The processes a write made keys pending and ready in at once (a lease
/// given back, a session closed, an expired session reclaimed): their idle
/// claimers are woken once it commits, as for an enqueue. Before, they heard
/// of such keys only at their poll.
#[cfg(feature = "_engine")]
#[derive(Debug, Default)]
#[must_use = "wake the processes once the write commits"]
pub(crate) struct Requeued(std::collections::BTreeSet<String>);

#[cfg(feature = "_engine")]
impl Requeued {
    /// The processes of `names` (repeats counted once).
    pub(crate) fn of(names: impl IntoIterator<Item = String>) -> Self {
        Self(names.into_iter().collect())
    }

    /// The processes, each once.
    #[cfg(feature = "postgres")]
    pub(crate) fn processes(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// Wakes each process's waiters in this process (call after the commit).
    pub(crate) fn wake(self) {
        for process in &self.0 {
            notify(process);
        }
    }
}

/// Processes whose last claim through this OS process was held back by
/// their concurrency limit: their runs' endings wake claimers, since a slot
/// came free. A limit that does not bind costs no wake-ups.
fn limited() -> &'static Mutex<HashSet<String>> {
    static LIMITED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    LIMITED.get_or_init(Mutex::default)
}

/// Records whether a claim of `process` was just held back by its
/// concurrency limit.
pub(crate) fn set_limited(process: &str, limited: bool) {
    let mut set = self::limited()
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if limited {
        if !set.contains(process) {
            set.insert(process.to_owned());
        }
    } else if !set.is_empty() {
        set.remove(process);
    }
}

/// The distinct processes among `processes` whose claimers wait for a slot
/// (empty at the cost of one lock when none does).
pub(crate) fn limited_among<'a>(processes: impl Iterator<Item = &'a str>) -> Vec<String> {
    let set = limited().lock().unwrap_or_else(PoisonError::into_inner);
    if set.is_empty() {
        return Vec::new();
    }
    let mut found: Vec<String> = Vec::new();
    for process in processes {
        if set.contains(process) && !found.iter().any(|p| p == process) {
            found.push(process.to_owned());
        }
    }
    found
}

impl Store {
    /// The signal an enqueue of `process` through any store of this process fires
    /// (`notify_waiters`). Idle workers wait on it next to their poll timer.
    #[must_use]
    pub fn wakeup(&self, process: &str) -> Arc<Notify> {
        let mut registry = registry().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(notify) = registry.get(process).and_then(Weak::upgrade) {
            return notify;
        }
        registry.retain(|_, weak| weak.strong_count() > 0);
        let notify = Arc::new(Notify::new());
        registry.insert(process.to_owned(), Arc::downgrade(&notify));
        notify
    }

    /// The wake-up signal of `process` (see [`wakeup`](Self::wakeup)), fired
    /// also by enqueues on other nodes where the engine can hear them: on
    /// PostgreSQL the store `LISTEN`s on the process's channel (one
    /// connection per store, reconnected after errors) for as long as the
    /// signal is held, by the caller or anything else in this process;
    /// SQLite has no other nodes to hear. Hold the signal for as long as you
    /// wait on it. Must be called inside a Tokio runtime.
    #[must_use]
    pub fn subscribe(&self, process: &str) -> Arc<Notify> {
        // The signal first: a store short of channels lets go of those whose
        // signal nobody holds, and this one is held from here on.
        let signal = self.wakeup(process);
        #[cfg(feature = "postgres")]
        if let Some(postgres) = self.postgres() {
            postgres.subscribe(process);
        }
        signal
    }
}
