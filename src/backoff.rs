//! Exponential backoff: the one formula behind every retry delay in drover.
//!
//! The in-memory queue's per-item rate limiter and the durable store both compute
//! `delay = min(max, initial × factor^(failures − 1))` with this type, so a key backs
//! off the same way whether it lives in memory or in a database.

use std::time::Duration;

use rand::RngExt as _;

/// The longest delay drover ever computes: about six months.
///
/// Larger values are clamped to it, so adding a delay to an `Instant` or a database
/// timestamp can never overflow, whatever a caller or configuration asks for.
pub const MAX_DELAY: Duration = Duration::from_secs(180 * 24 * 60 * 60);

/// Clamps a caller-supplied duration to [`MAX_DELAY`].
///
/// Every public entry point that accepts a delay passes it through here, so a
/// `Duration::MAX` from a caller means "as late as drover schedules anything",
/// never a panic.
#[must_use]
pub fn clamp_delay(delay: Duration) -> Duration {
    delay.min(MAX_DELAY)
}

/// Why a [`Backoff`] could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BackoffError {
    /// The factor was below 1 or not a finite number: delays would shrink or be
    /// undefined.
    #[error("backoff factor must be a finite number >= 1, got {0}")]
    Factor(f64),
    /// The jitter was negative, above 1 or not a finite number.
    #[error("backoff jitter must be between 0 and 1, got {0}")]
    Jitter(f64),
    /// The maximum was below the initial delay.
    #[error("backoff max ({max:?}) must be at least the initial delay ({initial:?})")]
    MaxBelowInitial {
        /// The initial delay asked for.
        initial: Duration,
        /// The maximum asked for.
        max: Duration,
    },
}

/// An exponential backoff policy: `initial`, multiplied by `factor` per failure,
/// capped at `max`, optionally spread by `jitter`.
///
/// The computation is overflow-safe for any failure count: once the exponential
/// passes `max` (or stops being a finite number) the result is `max`.
///
/// ```
/// use std::time::Duration;
/// use drover::backoff::Backoff;
///
/// let b = Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(360))?;
/// assert_eq!(b.delay(1), Duration::from_secs(1));
/// assert_eq!(b.delay(4), Duration::from_secs(8));
/// assert_eq!(b.delay(u32::MAX), Duration::from_secs(360));
/// # Ok::<(), drover::backoff::BackoffError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    initial: Duration,
    factor: f64,
    max: Duration,
    jitter: f64,
}

impl Default for Backoff {
    /// DESIGN.md's defaults, from the seeds: 1 s initial, ×2, 360 s max, no jitter.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            factor: 2.0,
            max: Duration::from_secs(360),
            jitter: 0.0,
        }
    }
}

impl Backoff {
    /// A policy without jitter. `initial` and `max` are clamped to [`MAX_DELAY`];
    /// a factor below 1 or a `max` below `initial` is rejected.
    pub fn new(initial: Duration, factor: f64, max: Duration) -> Result<Self, BackoffError> {
        let (initial, max) = (clamp_delay(initial), clamp_delay(max));
        if !factor.is_finite() || factor < 1.0 {
            return Err(BackoffError::Factor(factor));
        }
        if max < initial {
            return Err(BackoffError::MaxBelowInitial { initial, max });
        }
        Ok(Self {
            initial,
            factor,
            max,
            jitter: 0.0,
        })
    }

    /// The same policy with jitter: each delay is multiplied by a random number in
    /// `[1, 1 + jitter)` and still capped at `max`. Jitter spreads retries of many
    /// keys that failed together (a database outage) so they do not return in a
    /// thundering herd; 0 (the default) keeps delays exact and testable.
    pub fn with_jitter(self, jitter: f64) -> Result<Self, BackoffError> {
        if !jitter.is_finite() || !(0.0..=1.0).contains(&jitter) {
            return Err(BackoffError::Jitter(jitter));
        }
        Ok(Self { jitter, ..self })
    }

    /// The delay after the first failure.
    #[must_use]
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The growth per further failure.
    #[must_use]
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// The cap on every delay.
    #[must_use]
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The jitter fraction (0 = none).
    #[must_use]
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// The delay to wait after the `failures`-th consecutive failure (1-based; 0 is
    /// treated as 1): `min(max, initial × factor^(failures − 1))`, then jittered.
    ///
    /// A zero initial delay stays zero however many failures: once the power
    /// overflows to infinity, `0 × ∞` is NaN, which read as "past `max`" made
    /// the 1,025th failure of a retry-at-once policy wait the whole `max`.
    #[must_use]
    pub fn delay(&self, failures: u32) -> Duration {
        if self.initial.is_zero() {
            return Duration::ZERO;
        }
        let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
        let secs = self.initial.as_secs_f64() * self.factor.powi(exponent);
        let base = if secs.is_finite() && secs < self.max.as_secs_f64() {
            Duration::from_secs_f64(secs)
        } else {
            self.max
        };
        if self.jitter == 0.0 {
            return base;
        }
        let spread = rand::rng().random_range(0.0..self.jitter);
        base.mul_f64(1.0 + spread).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn delay_grows_by_factor_and_caps_at_max() {
        let b = Backoff::new(secs(1), 2.0, secs(360)).unwrap();
        let delays: Vec<_> = (1..=10).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 360]);
    }

    #[test]
    fn huge_failure_counts_do_not_overflow() {
        let b = Backoff::new(Duration::from_millis(5), 10.0, secs(1000)).unwrap();
        assert_eq!(b.delay(u32::MAX), secs(1000));
        assert_eq!(b.delay(400), secs(1000));
    }

    #[test]
    fn a_zero_initial_delay_stays_zero_past_the_overflow_of_the_power() {
        let b = Backoff::new(Duration::ZERO, 2.0, secs(360)).unwrap();
        for failures in [1, 1024, 1025, 5000, u32::MAX] {
            assert_eq!(b.delay(failures), Duration::ZERO, "{failures}");
        }
        let jittered = b.with_jitter(0.5).unwrap();
        assert_eq!(jittered.delay(2000), Duration::ZERO);
    }

    #[test]
    fn zero_failures_counts_as_the_first() {
        let b = Backoff::default();
        assert_eq!(b.delay(0), secs(1));
        assert_eq!(b.delay(1), secs(1));
    }

    #[test]
    fn jitter_stays_between_base_and_max() {
        let b = Backoff::new(secs(10), 2.0, secs(30))
            .unwrap()
            .with_jitter(0.5)
            .unwrap();
        for _ in 0..200 {
            let d = b.delay(1);
            assert!(d >= secs(10) && d < secs(15), "{d:?}");
            assert!(b.delay(3) <= secs(30));
        }
    }

    #[test]
    fn impossible_policies_are_rejected() {
        assert_eq!(
            Backoff::new(secs(1), 0.5, secs(2)),
            Err(BackoffError::Factor(0.5))
        );
        assert!(matches!(
            Backoff::new(secs(1), f64::NAN, secs(2)),
            Err(BackoffError::Factor(_))
        ));
        assert!(matches!(
            Backoff::new(secs(5), 2.0, secs(2)),
            Err(BackoffError::MaxBelowInitial { .. })
        ));
        assert_eq!(
            Backoff::default().with_jitter(1.5),
            Err(BackoffError::Jitter(1.5))
        );
    }

    #[test]
    fn durations_are_clamped_to_about_six_months() {
        let b = Backoff::new(Duration::MAX, 2.0, Duration::MAX).unwrap();
        assert_eq!(b.delay(3), MAX_DELAY);
        assert_eq!(clamp_delay(Duration::MAX), MAX_DELAY);
    }
}
