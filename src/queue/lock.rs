//! The one lock around a queue's state, behind a trait so the model-checking
//! tests can substitute shuttle's mutex and explore every interleaving of the real
//! queue code.

use std::ops::DerefMut;

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

/// The production lock. parking_lot's rather than std's: with 4 to 16 tasks
/// sharing one queue on two cores, std's mutex sent contended tasks to sleep
/// in the kernel while the holder was a few instructions from releasing it,
/// and the queue moved 4 M keys/s; parking_lot spins briefly first and moves
/// 10 M (`drover bench queue`, A/B). Uncontended it is within a few percent.
/// It does not poison; the queue ignored std's poisoning anyway.
impl<T: Send> Lock<T> for parking_lot::Mutex<T> {
    type Guard<'a>
        = parking_lot::MutexGuard<'a, T>
    where
        T: 'a;

    fn new(value: T) -> Self {
        parking_lot::Mutex::new(value)
    }

    fn lock(&self) -> Self::Guard<'_> {
        parking_lot::Mutex::lock(self)
    }
}
