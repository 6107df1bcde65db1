//! The one lock around a queue's state, behind a trait so the model-checking
//! tests can substitute shuttle's mutex and explore every interleaving of the real
//! queue code.

use std::ops::DerefMut;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A mutual-exclusion lock over `T`.
pub(crate) trait Lock<T>: Send + Sync {
    /// The guard; the state is reachable only through it.
    type Guard<'a>: DerefMut<Target = T>
    where
        Self: 'a;

    /// Wraps `value`.
    fn new(value: T) -> Self;

    /// Waits for exclusive access.
    fn lock(&self) -> Self::Guard<'_>;

    /// Called right after the lock is released, where another task could run
    /// before this one goes on to wake or wait: a model checker switches tasks
    /// here to probe the window. Free (empty) in production.
    fn after_unlock(&self) {}
}

impl<T: Send> Lock<T> for Mutex<T> {
    type Guard<'a>
        = MutexGuard<'a, T>
    where
        T: 'a;

    fn new(value: T) -> Self {
        Mutex::new(value)
    }

    /// No code that can panic runs under the lock except the key's own `Hash`,
    /// `Eq` and `Clone`. Should one of those panic, the worker that hit it fails,
    /// and the others go on with the state as it was left rather than all
    /// panicking on a poisoned lock.
    fn lock(&self) -> Self::Guard<'_> {
        Mutex::lock(self).unwrap_or_else(PoisonError::into_inner)
    }
}
