//! The rate limiter a controller should start with.

use std::hash::Hash;

use super::{Bucket, ItemExponential, MaxOf};

/// client-go's `DefaultControllerRateLimiter`: each key backs off exponentially
/// (5 ms, ×2 per failure, at most 1000 s) and all retries together are held to
/// 10 per second after a burst of 100.
///
/// The per-key backoff keeps one broken object from spinning; the bucket keeps a
/// mass failure (a database outage) from retrying thousands of keys at once. Build
/// your own [`MaxOf`] when either bound does not suit your load.
///
/// ```
/// use std::time::Duration;
/// use drover::queue::rate_limit::{RateLimiter, default_rate_limiter};
///
/// let limiter = default_rate_limiter::<u64>();
/// assert_eq!(limiter.when(&1), Duration::from_millis(5));
/// ```
#[must_use]
pub fn default_rate_limiter<K>() -> MaxOf<K>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
{
    MaxOf::default().with(ItemExponential::default()).with(
        Bucket::new(10.0, 100).expect("10 per second is a finite rate above 0 and 100 is not 0"),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::rate_limit::RateLimiter;

    #[tokio::test(start_paused = true)]
    async fn default_backs_off_each_key_from_five_milliseconds() {
        let limiter = default_rate_limiter::<&str>();
        assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
        assert_eq!(limiter.when(&"a"), Duration::from_millis(10));
        assert_eq!(limiter.when(&"b"), Duration::from_millis(5));
        assert_eq!(limiter.num_requeues(&"a"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn default_holds_all_keys_to_ten_per_second_after_a_burst_of_100() {
        let limiter = default_rate_limiter::<u32>();
        for key in 0..100 {
            assert_eq!(limiter.when(&key), Duration::from_millis(5), "key {key}");
        }
        assert_eq!(limiter.when(&100), Duration::from_millis(100));
        assert_eq!(limiter.when(&101), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn default_caps_a_key_at_1000_seconds() {
        let limiter = default_rate_limiter::<&str>();
        for _ in 0..39 {
            limiter.when(&"a");
        }
        assert_eq!(limiter.when(&"a"), Duration::from_secs(1000));
    }
}
