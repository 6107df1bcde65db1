//! The longest delay of several limiters: client-go's `MaxOfRateLimiter`.

use std::time::Duration;

use super::RateLimiter;

/// Combines limiters: a key waits as long as the strictest of them asks.
///
/// Every limiter sees every call, so each records each failure even when another
/// one's delay wins, and [`forget`](RateLimiter::forget) reaches them all.
/// [`num_requeues`](RateLimiter::num_requeues) is the largest count any of them
/// keeps. With no limiters, nothing is ever delayed.
///
/// Use it to bound both each key and the whole queue, as
/// [`default_rate_limiter`](super::default_rate_limiter) does with an
/// [`ItemExponential`](super::ItemExponential) and a [`Bucket`](super::Bucket).
///
/// ```
/// use std::time::Duration;
/// use drover::queue::rate_limit::{ItemFastSlow, MaxOf, RateLimiter};
///
/// let limiter = MaxOf::default()
///     .with(ItemFastSlow::new(Duration::from_millis(1), Duration::from_secs(1), 1))
///     .with(ItemFastSlow::new(Duration::from_millis(5), Duration::from_millis(5), 0));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(1));
/// ```
pub struct MaxOf<K> {
    limiters: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K> MaxOf<K> {
    /// Combines `limiters`; an empty list never delays.
    #[must_use]
    pub fn new(limiters: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        Self { limiters }
    }

    /// Adds one more limiter. Order does not change any result.
    #[must_use]
    pub fn with(mut self, limiter: impl RateLimiter<K> + 'static) -> Self {
        self.limiters.push(Box::new(limiter));
        self
    }
}

impl<K> Default for MaxOf<K> {
    /// No limiters: every delay is 0 until [`with`](MaxOf::with) adds one.
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl<K> std::fmt::Debug for MaxOf<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaxOf")
            .field("limiters", &self.limiters)
            .finish()
    }
}

impl<K> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K) -> Duration {
        // `map` then `max` (not `any` or a short-circuit): every limiter must record
        // the failure.
        self.limiters
            .iter()
            .map(|limiter| limiter.when(key))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, key: &K) {
        for limiter in &self.limiters {
            limiter.forget(key);
        }
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(key))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backoff::Backoff;
    use crate::queue::rate_limit::{ItemExponential, ItemFastSlow};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn exponential() -> Arc<ItemExponential<&'static str>> {
        Arc::new(ItemExponential::new(
            Backoff::new(ms(1), 2.0, Duration::from_secs(1)).unwrap(),
        ))
    }

    fn fast_slow() -> Arc<ItemFastSlow<&'static str>> {
        Arc::new(ItemFastSlow::new(ms(5), ms(50), 2))
    }

    #[test]
    fn max_of_takes_the_longest_delay() {
        let limiter = MaxOf::default().with(exponential()).with(fast_slow());
        let delays: Vec<_> = (0..7).map(|_| limiter.when(&"a")).collect();
        // exponential: 1 2 4 8 16 32 64; fast/slow: 5 5 50 50 50 50 50.
        assert_eq!(
            delays,
            [ms(5), ms(5), ms(50), ms(50), ms(50), ms(50), ms(64)]
        );
    }

    #[test]
    fn max_of_records_the_failure_in_every_limiter() {
        let (exp, fs) = (exponential(), fast_slow());
        let limiter = MaxOf::new(vec![Box::new(exp.clone()), Box::new(fs.clone())]);
        for _ in 0..3 {
            limiter.when(&"a");
        }
        assert_eq!(exp.num_requeues(&"a"), 3);
        assert_eq!(fs.num_requeues(&"a"), 3);
    }

    #[test]
    fn max_of_forgets_in_every_limiter() {
        let (exp, fs) = (exponential(), fast_slow());
        let limiter = MaxOf::default().with(exp.clone()).with(fs.clone());
        limiter.when(&"a");
        limiter.when(&"b");
        limiter.forget(&"a");
        assert_eq!(exp.num_requeues(&"a"), 0);
        assert_eq!(fs.num_requeues(&"a"), 0);
        assert_eq!(limiter.num_requeues(&"b"), 1);
    }

    #[test]
    fn max_of_reports_the_largest_failure_count() {
        let (exp, fs) = (exponential(), fast_slow());
        let limiter = MaxOf::default().with(exp.clone()).with(fs.clone());
        limiter.when(&"a");
        fs.when(&"a");
        fs.when(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 3);
        exp.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 3);
    }

    #[test]
    fn empty_max_of_never_delays() {
        let limiter = MaxOf::<&str>::default();
        assert_eq!(limiter.when(&"a"), Duration::ZERO);
        assert_eq!(limiter.num_requeues(&"a"), 0);
    }
}
