//! Fast retries, then slow ones: client-go's `ItemFastSlowRateLimiter`.

use std::hash::Hash;
use std::time::Duration;

use super::RateLimiter;
use super::failures::Failures;
use crate::backoff::clamp_delay;

/// Retries each key after `fast` for its first `max_fast_attempts` consecutive
/// failures, then after `slow` until it is forgotten.
///
/// Use it when failures are usually brief (a conflict, a cache not yet synced) and a
/// fixed slow retry is good enough after that; use
/// [`ItemExponential`](super::ItemExponential) when the wait should keep growing.
/// Keys are counted independently; counts saturate at `u32::MAX`.
///
/// ```
/// use std::time::Duration;
/// use drover::queue::rate_limit::{ItemFastSlow, RateLimiter};
///
/// let limiter = ItemFastSlow::new(Duration::from_millis(10), Duration::from_secs(5), 2);
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(10));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(10));
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(5));
/// ```
pub struct ItemFastSlow<K> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    failures: Failures<K>,
}

impl<K> ItemFastSlow<K> {
    /// A limiter answering `fast` for failures 1 to `max_fast_attempts` of a key and
    /// `slow` after. Both delays are clamped to
    /// [`MAX_DELAY`](crate::backoff::MAX_DELAY); `max_fast_attempts` 0 means always
    /// slow.
    #[must_use]
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        Self {
            fast: clamp_delay(fast),
            slow: clamp_delay(slow),
            max_fast_attempts,
            failures: Failures::default(),
        }
    }
}

impl<K> std::fmt::Debug for ItemFastSlow<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemFastSlow")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("failures", &self.failures)
            .finish()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync> RateLimiter<K> for ItemFastSlow<K> {
    fn when(&self, key: &K) -> Duration {
        if self.failures.record(key) <= self.max_fast_attempts {
            self.fast
        } else {
            self.slow
        }
    }

    fn forget(&self, key: &K) {
        self.failures.forget(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.count(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::MAX_DELAY;

    const FAST: Duration = Duration::from_millis(1);
    const SLOW: Duration = Duration::from_secs(1);

    #[test]
    fn fast_slow_switches_after_max_fast_attempts() {
        let l = ItemFastSlow::new(FAST, SLOW, 3);
        let delays: Vec<_> = (0..5).map(|_| l.when(&"a")).collect();
        assert_eq!(delays, [FAST, FAST, FAST, SLOW, SLOW]);
        assert_eq!(l.num_requeues(&"a"), 5);
    }

    #[test]
    fn zero_fast_attempts_is_always_slow() {
        let l = ItemFastSlow::new(FAST, SLOW, 0);
        assert_eq!(l.when(&"a"), SLOW);
    }

    #[test]
    fn keys_are_counted_independently() {
        let l = ItemFastSlow::new(FAST, SLOW, 1);
        assert_eq!(l.when(&"a"), FAST);
        assert_eq!(l.when(&"a"), SLOW);
        assert_eq!(l.when(&"b"), FAST);
        assert_eq!(l.num_requeues(&"b"), 1);
    }

    #[test]
    fn forget_returns_a_key_to_fast_delays() {
        let l = ItemFastSlow::new(FAST, SLOW, 1);
        l.when(&"a");
        l.when(&"a");
        l.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), FAST);
    }

    #[test]
    fn failure_counts_saturate_instead_of_wrapping_back_to_fast() {
        let l = ItemFastSlow::new(FAST, SLOW, u32::MAX - 1);
        l.failures.set(&"a", u32::MAX - 1);
        assert_eq!(l.when(&"a"), SLOW);
        assert_eq!(l.when(&"a"), SLOW);
        assert_eq!(l.num_requeues(&"a"), u32::MAX);
    }

    #[test]
    fn delays_are_clamped_to_max_delay() {
        let l = ItemFastSlow::new(Duration::MAX, Duration::MAX, 1);
        assert_eq!(l.when(&"a"), MAX_DELAY);
        assert_eq!(l.when(&"a"), MAX_DELAY);
    }
}
