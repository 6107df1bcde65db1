//! [`Ticks`]: the jittered timer the store's background services ([`Pruner`],
//! [`Resyncer`]) run on, so nodes started together spread their work out.
//!
//! [`Pruner`]: super::Pruner
//! [`Resyncer`]: super::Resyncer

use std::time::Duration;

use rand::RngExt as _;
use tokio_util::sync::CancellationToken;

/// A timer whose first tick comes after a random part of the interval and
/// each further one after the interval ± 10 %.
#[derive(Debug)]
pub(crate) struct Ticks {
    every: Duration,
    wait: Duration,
}

impl Ticks {
    /// Ticks every `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            wait: scaled(every, rand::rng().random_range(0.0..1.0)),
        }
    }

    /// Waits for the next tick: `true` then, `false` once `stop` fires.
    pub(crate) async fn next(&mut self, stop: &CancellationToken) -> bool {
        let wait = self.wait;
        self.wait = scaled(self.every, rand::rng().random_range(0.9..1.1));
        tokio::select! {
            () = stop.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }
}

/// `every × factor`, saturating: an interval near the longest a `Duration`
/// holds (what `drover serve --prune-every` or a library caller may set) made
/// `Duration::mul_f64` panic once jittered up, and with it the service's task.
fn scaled(every: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(every.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}
