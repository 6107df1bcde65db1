//! Rate limiters: how long a failed key waits before the queue hands it out again.
//!
//! A port of client-go's `workqueue` rate limiters. The queue calls
//! [`RateLimiter::when`] each time a key is requeued after a failure, waits the
//! returned delay, and calls [`RateLimiter::forget`] once the key succeeds.
//!
//! Pick one by what you want to bound:
//!
//! - [`ItemExponential`]: each key backs off on its own, exponentially. Use it to
//!   keep one broken object from spinning.
//! - [`ItemFastSlow`]: each key retries quickly a few times, then slowly. Use it when
//!   failures are usually brief and a fixed slow retry is enough after that.
//! - [`Bucket`]: one token bucket shared by all keys. Use it to cap the overall retry
//!   rate, whatever the number of failing keys.
//! - [`MaxOf`]: the longest delay of several limiters, each of which still records
//!   every failure. Use it to combine a per-key and a global bound.
//! - [`default_rate_limiter`]: client-go's `DefaultControllerRateLimiter`, the right
//!   start for a controller.
//!
//! Every delay a limiter returns is at most [`MAX_DELAY`](crate::backoff::MAX_DELAY),
//! so adding it to an `Instant` never overflows.
//!
//! ```
//! use std::time::Duration;
//! use drover::queue::rate_limit::{RateLimiter, default_rate_limiter};
//!
//! let limiter = default_rate_limiter::<String>();
//! let key = "pod/web-0".to_owned();
//! assert_eq!(limiter.when(&key), Duration::from_millis(5));
//! assert_eq!(limiter.when(&key), Duration::from_millis(10));
//! assert_eq!(limiter.num_requeues(&key), 2);
//! limiter.forget(&key);
//! assert_eq!(limiter.num_requeues(&key), 0);
//! ```

use std::sync::Arc;
use std::time::Duration;

mod bucket;
mod default;
mod error;
mod exponential;
mod failures;
mod fast_slow;
mod max_of;

pub use bucket::Bucket;
pub use default::default_rate_limiter;
pub use error::RateLimitError;
pub use exponential::ItemExponential;
pub use fast_slow::ItemFastSlow;
pub use max_of::MaxOf;

/// Decides how long a key must wait before its next retry.
///
/// Implementations are shared between the queue's workers, so every method takes
/// `&self` and is safe to call from many threads at once. A returned delay never
/// exceeds [`MAX_DELAY`](crate::backoff::MAX_DELAY).
pub trait RateLimiter<K>: Send + Sync + std::fmt::Debug {
    /// Records one more failure of `key` and returns how long it must wait.
    fn when(&self, key: &K) -> Duration;
    /// Forgets `key`'s failures (it succeeded).
    fn forget(&self, key: &K);
    /// How many failures of `key` are recorded.
    fn num_requeues(&self, key: &K) -> u32;
}

/// A boxed or shared limiter is a limiter: each call goes to the one inside.
macro_rules! delegate_to_inner {
    ($($pointer:ident),*) => {$(
        impl<K, R: RateLimiter<K> + ?Sized> RateLimiter<K> for $pointer<R> {
            fn when(&self, key: &K) -> Duration {
                (**self).when(key)
            }

            fn forget(&self, key: &K) {
                (**self).forget(key);
            }

            fn num_requeues(&self, key: &K) -> u32 {
                (**self).num_requeues(key)
            }
        }
    )*};
}

delegate_to_inner!(Box, Arc);
