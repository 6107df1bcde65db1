//! One token bucket for all keys: client-go's `BucketRateLimiter`.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{RateLimitError, RateLimiter};
use crate::backoff::{MAX_DELAY, clamp_delay};

/// A token bucket shared by all keys: `burst` tokens, refilled at `qps` per second.
///
/// Every [`when`](RateLimiter::when) *reserves* a token and returns how long until
/// that token exists: 0 while the bucket holds tokens, then `1/qps`, `2/qps`, … for
/// calls made in the same instant. Reserving (rather than refusing) is what lets the
/// queue schedule every retry at once and still never exceed `qps` retries per
/// second after the first `burst`. The bucket never saves more than `burst` tokens,
/// however long it stays idle.
///
/// It ignores keys: [`forget`](RateLimiter::forget) does nothing and
/// [`num_requeues`](RateLimiter::num_requeues) is always 0, as in client-go. Use it
/// inside [`MaxOf`](super::MaxOf) with a per-key limiter such as
/// [`ItemExponential`](super::ItemExponential), which then counts the failures.
///
/// The bucket is a GCRA ("theoretical arrival time") reservation on
/// [`tokio::time::Instant`], so it follows a paused test clock. It is written here
/// rather than taken from `governor` because `governor` only checks whether a call
/// may go now; it cannot reserve a future slot and report its delay.
///
/// A reservation backlog is capped at [`MAX_DELAY`]: once delays reach it, further
/// calls also get `MAX_DELAY` and do not push the backlog further.
///
/// ```
/// use std::time::Duration;
/// use drover::queue::rate_limit::{Bucket, RateLimiter};
///
/// let bucket = Bucket::new(10.0, 2)?;
/// let delays: Vec<_> = (0..4).map(|key| bucket.when(&key)).collect();
/// assert_eq!(delays[..2], [Duration::ZERO, Duration::ZERO]);
/// assert!(delays[3] > delays[2] && delays[2] > Duration::ZERO);
/// # Ok::<(), drover::queue::rate_limit::RateLimitError>(())
/// ```
#[derive(Debug)]
pub struct Bucket {
    qps: f64,
    burst: u32,
    /// Time to refill one token: `1/qps`, at most [`MAX_DELAY`].
    interval: Duration,
    /// How far the theoretical arrival time may run ahead of now with the call still
    /// allowed at once: `burst × interval`.
    window: Duration,
    origin: Instant,
    /// The theoretical arrival time, as an offset from `origin`: when the bucket will
    /// be full again. Offsets keep every step saturating `Duration` arithmetic.
    tat: Mutex<Duration>,
}

impl Bucket {
    /// A full bucket of `burst` tokens refilled at `qps` tokens per second.
    ///
    /// Rejects a `qps` that is not a finite number above 0 and a `burst` of 0. A rate
    /// so low that one token takes longer than [`MAX_DELAY`] is treated as one token
    /// per `MAX_DELAY`.
    pub fn new(qps: f64, burst: u32) -> Result<Self, RateLimitError> {
        if !qps.is_finite() || qps <= 0.0 {
            return Err(RateLimitError::Qps(qps));
        }
        if burst == 0 {
            return Err(RateLimitError::ZeroBurst);
        }
        let interval = Duration::try_from_secs_f64(qps.recip()).map_or(MAX_DELAY, clamp_delay);
        Ok(Self {
            qps,
            burst,
            interval,
            window: interval.saturating_mul(burst),
            origin: Instant::now(),
            tat: Mutex::new(Duration::ZERO),
        })
    }

    /// The refill rate, in tokens per second.
    #[must_use]
    pub fn qps(&self) -> f64 {
        self.qps
    }

    /// The most tokens the bucket holds.
    #[must_use]
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Takes the next token and returns how long until it is available.
    fn reserve(&self) -> Duration {
        let now = Instant::now().saturating_duration_since(self.origin);
        // The guarded value is a plain offset replaced in one assignment, so a
        // poisoned lock still holds a consistent value.
        let mut tat = self.tat.lock().unwrap_or_else(PoisonError::into_inner);
        let next = (*tat).max(now).saturating_add(self.interval);
        let delay = next.saturating_sub(now).saturating_sub(self.window);
        let backlog_cap = now.saturating_add(self.window).saturating_add(MAX_DELAY);
        *tat = next.min(backlog_cap);
        clamp_delay(delay)
    }
}

impl<K> RateLimiter<K> for Bucket {
    fn when(&self, _key: &K) -> Duration {
        self.reserve()
    }

    fn forget(&self, _key: &K) {}

    fn num_requeues(&self, _key: &K) -> u32 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn delays(bucket: &Bucket, n: usize) -> Vec<Duration> {
        (0..n).map(|i| bucket.when(&i)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_spaces_by_rate() {
        let bucket = Bucket::new(10.0, 3).unwrap();
        assert_eq!(
            delays(&bucket, 6),
            [ms(0), ms(0), ms(0), ms(100), ms(200), ms(300)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_refills_as_time_passes() {
        let bucket = Bucket::new(10.0, 2).unwrap();
        assert_eq!(delays(&bucket, 2), [ms(0), ms(0)]);
        tokio::time::advance(ms(100)).await;
        assert_eq!(delays(&bucket, 2), [ms(0), ms(100)], "one token refilled");
        // The bucket owed one token; 250 ms refill 2.5, leaving 1.5 tokens.
        tokio::time::advance(ms(250)).await;
        assert_eq!(delays(&bucket, 3), [ms(0), ms(50), ms(150)]);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_never_saves_more_than_burst() {
        let bucket = Bucket::new(10.0, 2).unwrap();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(delays(&bucket, 3), [ms(0), ms(0), ms(100)]);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_is_shared_by_all_keys_and_counts_none() {
        let bucket = Bucket::new(10.0, 1).unwrap();
        assert_eq!(bucket.when(&"a"), ms(0));
        assert_eq!(bucket.when(&"b"), ms(100));
        RateLimiter::<&str>::forget(&bucket, &"b");
        assert_eq!(bucket.when(&"b"), ms(200), "forget must not return a token");
        assert_eq!(RateLimiter::<&str>::num_requeues(&bucket, &"b"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_backlog_is_capped_at_max_delay() {
        // One token per ~11.6 days: from the 17th queued call on, the wait passes MAX_DELAY.
        let bucket = Bucket::new(1e-6, 1).unwrap();
        let all = delays(&bucket, 40);
        assert_eq!(all[1], Duration::from_secs(1_000_000));
        assert!(all[..16].windows(2).all(|w| w[0] < w[1]), "{all:?}");
        assert!(all[16..].iter().all(|d| *d == MAX_DELAY), "{all:?}");
        tokio::time::advance(MAX_DELAY).await;
        assert_eq!(bucket.when(&0), Duration::from_secs(1_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn extreme_rates_do_not_overflow() {
        let slowest = Bucket::new(f64::MIN_POSITIVE, u32::MAX).unwrap();
        assert_eq!(slowest.when(&0), Duration::ZERO);
        let tiny = Bucket::new(f64::MIN_POSITIVE, 1).unwrap();
        assert_eq!(delays(&tiny, 3), [ms(0), MAX_DELAY, MAX_DELAY]);
        let fastest = Bucket::new(f64::MAX, 1).unwrap();
        assert_eq!(delays(&fastest, 3), [ms(0), ms(0), ms(0)]);
    }

    #[test]
    fn bucket_rejects_impossible_rates_and_an_empty_burst() {
        for qps in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = Bucket::new(qps, 1).unwrap_err();
            assert!(matches!(err, RateLimitError::Qps(q) if q.to_bits() == qps.to_bits()));
        }
        assert_eq!(Bucket::new(10.0, 0).unwrap_err(), RateLimitError::ZeroBurst);
        assert_eq!(Bucket::new(10.0, 1).unwrap().burst(), 1);
    }
}
