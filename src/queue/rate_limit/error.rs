//! Why a rate limiter could not be built.

/// Why a rate limiter could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// The rate was zero, negative or not a finite number: no token would ever be
    /// added, or the rate is undefined.
    #[error("rate must be a finite number of tokens per second > 0, got {0}")]
    Qps(f64),
    /// The burst was zero: the bucket could never hold the token a call reserves.
    #[error("burst must be at least 1")]
    ZeroBurst,
}
