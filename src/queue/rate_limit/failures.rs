//! Per-key failure counts, shared by the per-item limiters.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A saturating failure count per key; a key without failures takes no space.
pub(super) struct Failures<K> {
    counts: Mutex<HashMap<K, u32>>,
}

impl<K> Default for Failures<K> {
    fn default() -> Self {
        Self {
            counts: Mutex::new(HashMap::new()),
        }
    }
}

impl<K> std::fmt::Debug for Failures<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failures")
            .field("keys", &self.lock().len())
            .finish()
    }
}

impl<K> Failures<K> {
    /// Every update is a single insert or remove, so a panic elsewhere while the
    /// lock was held cannot leave the map half-updated: a poisoned lock is safe to
    /// keep using.
    fn lock(&self) -> MutexGuard<'_, HashMap<K, u32>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Clone + Eq + Hash> Failures<K> {
    /// Adds one failure of `key` (saturating at `u32::MAX`) and returns the new count.
    pub(super) fn record(&self, key: &K) -> u32 {
        let mut counts = self.lock();
        if let Some(count) = counts.get_mut(key) {
            *count = count.saturating_add(1);
            return *count;
        }
        counts.insert(key.clone(), 1);
        1
    }

    /// Drops `key`'s count.
    pub(super) fn forget(&self, key: &K) {
        self.lock().remove(key);
    }

    /// `key`'s count; 0 if it has none.
    pub(super) fn count(&self, key: &K) -> u32 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// Sets `key`'s count directly, to test behaviour near `u32::MAX`.
    #[cfg(test)]
    pub(super) fn set(&self, key: &K, count: u32) {
        self.lock().insert(key.clone(), count);
    }
}
