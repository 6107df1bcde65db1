//! Per-key exponential backoff: client-go's `ItemExponentialFailureRateLimiter`.

use std::hash::Hash;
use std::time::Duration;

use super::RateLimiter;
use super::failures::Failures;
use crate::backoff::{Backoff, clamp_delay};

/// Backs each key off on its own: its n-th consecutive failure waits
/// [`Backoff::delay(n)`](Backoff::delay).
///
/// Keys do not influence one another, so a thousand keys failing at once all retry
/// after the initial delay; wrap this in [`MaxOf`](super::MaxOf) with a
/// [`Bucket`](super::Bucket) to bound the overall rate too. Use
/// [`ItemFastSlow`](super::ItemFastSlow) instead when you want two fixed delays
/// rather than a growing one.
///
/// Failure counts saturate at `u32::MAX` (where the delay is the backoff's max) and
/// are dropped by [`forget`](RateLimiter::forget), so memory grows only with the
/// number of keys currently failing.
///
/// ```
/// use std::time::Duration;
/// use drover::backoff::Backoff;
/// use drover::queue::rate_limit::{ItemExponential, RateLimiter};
///
/// let backoff = Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(3))?;
/// let limiter = ItemExponential::new(backoff);
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(1));
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(2));
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(3));
/// assert_eq!(limiter.when(&"b"), Duration::from_secs(1));
/// # Ok::<(), drover::backoff::BackoffError>(())
/// ```
pub struct ItemExponential<K> {
    backoff: Backoff,
    failures: Failures<K>,
}

impl<K> ItemExponential<K> {
    /// A limiter whose delays follow `backoff`, jitter included.
    #[must_use]
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            failures: Failures::default(),
        }
    }

    /// The policy the delays follow.
    #[must_use]
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }
}

impl<K> Default for ItemExponential<K> {
    /// client-go's default: 5 ms initial, ×2 per failure, 1000 s max, no jitter.
    fn default() -> Self {
        let backoff = Backoff::new(Duration::from_millis(5), 2.0, Duration::from_secs(1000))
            .expect("factor 2 is >= 1 and 1000 s is above 5 ms");
        Self::new(backoff)
    }
}

impl<K> std::fmt::Debug for ItemExponential<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemExponential")
            .field("backoff", &self.backoff)
            .field("failures", &self.failures)
            .finish()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync> RateLimiter<K> for ItemExponential<K> {
    fn when(&self, key: &K) -> Duration {
        clamp_delay(self.backoff.delay(self.failures.record(key)))
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limiter(initial: u64, max: u64) -> ItemExponential<&'static str> {
        ItemExponential::new(Backoff::new(ms(initial), 2.0, ms(max)).unwrap())
    }

    #[test]
    fn exponential_doubles_then_caps() {
        let l = limiter(1, 10);
        let delays: Vec<_> = (0..6).map(|_| l.when(&"a")).collect();
        assert_eq!(delays, [ms(1), ms(2), ms(4), ms(8), ms(10), ms(10)]);
    }

    #[test]
    fn each_key_backs_off_on_its_own() {
        let l = limiter(1, 1000);
        l.when(&"a");
        l.when(&"a");
        l.when(&"a");
        assert_eq!(l.when(&"b"), ms(1));
        assert_eq!(l.num_requeues(&"a"), 3);
        assert_eq!(l.num_requeues(&"b"), 1);
        assert_eq!(l.num_requeues(&"never-failed"), 0);
    }

    #[test]
    fn forget_resets_failures() {
        let l = limiter(1, 1000);
        l.when(&"a");
        l.when(&"a");
        l.when(&"b");
        l.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), ms(1));
        assert_eq!(l.num_requeues(&"b"), 1, "forgetting a must not touch b");
    }

    #[test]
    fn default_follows_client_go() {
        let l = ItemExponential::<u32>::default();
        assert_eq!(l.when(&7), ms(5));
        assert_eq!(l.when(&7), ms(10));
        assert_eq!(l.when(&7), ms(20));
        assert_eq!(l.backoff().max(), Duration::from_secs(1000));
        for _ in 0..40 {
            l.when(&7);
        }
        assert_eq!(l.when(&7), Duration::from_secs(1000));
    }

    #[test]
    fn failure_counts_saturate_instead_of_overflowing() {
        let l = limiter(1, 1000);
        l.failures.set(&"a", u32::MAX - 1);
        assert_eq!(l.when(&"a"), ms(1000));
        assert_eq!(l.num_requeues(&"a"), u32::MAX);
        assert_eq!(l.when(&"a"), ms(1000));
        assert_eq!(l.num_requeues(&"a"), u32::MAX);
    }
}
