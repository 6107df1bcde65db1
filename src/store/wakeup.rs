//! In-process wake-ups: an enqueue through any [`Store`] in this process wakes
//! the controllers of its process at once, on either engine.
//!
//! The registry is keyed by process name only, not by database: a controller
//! woken by an enqueue to another database with the same process name finds
//! nothing and waits again. A wake-up is a hint, never a guarantee; controllers
//! poll as well.

use std::collections::HashMap;
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
    /// PostgreSQL the store `LISTEN`s on the process's channel from now on (one
    /// connection per store, reconnected after errors); SQLite has no other
    /// nodes to hear. Must be called inside a Tokio runtime.
    #[must_use]
    pub fn subscribe(&self, process: &str) -> Arc<Notify> {
        #[cfg(feature = "postgres")]
        if let Some(postgres) = self.postgres() {
            postgres.subscribe(process);
        }
        self.wakeup(process)
    }
}
