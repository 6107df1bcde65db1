//! Options of one add.

use std::time::Duration;

/// How one [`Queue::add_with`](super::Queue::add_with) queues a key.
///
/// The default (`AddOpts::default()`) is a plain [`Queue::add`](super::Queue::add):
/// ready now, priority 0, respecting the key's backoff.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AddOpts {
    /// Wait this long before the key becomes ready. Clamped to
    /// [`MAX_DELAY`](crate::backoff::MAX_DELAY). When the key is already waiting,
    /// the earlier ready time wins.
    pub after: Duration,
    /// Higher runs first; equal priorities run in the order they became ready.
    /// When a key is added twice, the higher priority wins.
    pub priority: i32,
    /// Run after `after` even if the key is waiting out a backoff from
    /// [`Queue::add_rate_limited`](super::Queue::add_rate_limited). Without it, an
    /// add never makes a backing-off key run before its backoff ends (client-go
    /// runs it at once and then again when the backoff timer fires, doubling the
    /// attempts on a failing object).
    pub bypass_backoff: bool,
}

impl AddOpts {
    /// Options for a delayed add.
    #[must_use]
    pub fn after(after: Duration) -> Self {
        Self {
            after,
            ..Self::default()
        }
    }

    /// The same options with a priority.
    #[must_use]
    pub fn priority(self, priority: i32) -> Self {
        Self { priority, ..self }
    }

    /// The same options, ignoring the key's backoff.
    #[must_use]
    pub fn bypass_backoff(self) -> Self {
        Self {
            bypass_backoff: true,
            ..self
        }
    }
}
