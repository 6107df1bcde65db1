//! Decoding stored values both engines share: state and event names, backoff
//! policies.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::store::error::StoreError;
use crate::store::types::{ItemState, RunOutcome};

/// An item's state from its stored name; a pending item still inside its backoff
/// is reported as [`ItemState::Backoff`].
pub(crate) fn item_state(stored: &str, backing_off: bool) -> Result<ItemState, StoreError> {
    match stored {
        "pending" if backing_off => Ok(ItemState::Backoff),
        "pending" => Ok(ItemState::Pending),
        "running" => Ok(ItemState::Running),
        "parked" => Ok(ItemState::Parked),
        "idle" => Ok(ItemState::Idle),
        other => Err(corrupt(format!("unknown item state {other:?}"))),
    }
}

/// The stored state an item in `state` has (`backoff` is stored as `pending`).
pub(crate) fn stored_state(state: ItemState) -> &'static str {
    match state {
        ItemState::Pending | ItemState::Backoff => "pending",
        ItemState::Running => "running",
        ItemState::Parked => "parked",
        ItemState::Idle => "idle",
    }
}

/// For a state filter: `Some(true)` = only items still backing off, `Some(false)`
/// = only items not backing off, `None` = no such condition.
pub(crate) fn backing_off(state: ItemState) -> Option<bool> {
    match state {
        ItemState::Pending => Some(false),
        ItemState::Backoff => Some(true),
        ItemState::Running | ItemState::Parked | ItemState::Idle => None,
    }
}

/// A run's outcome from its stored name.
pub(crate) fn run_outcome(stored: &str) -> Result<RunOutcome, StoreError> {
    RunOutcome::parse(stored).ok_or_else(|| corrupt(format!("unknown run outcome {stored:?}")))
}

/// A process's backoff policy from its stored columns. A process without a row, or
/// with values no `Backoff` accepts, gets DESIGN.md's defaults (1 s, ×2, 360 s): a
/// bad configuration must not stop failures from being recorded.
pub(crate) fn backoff_policy(
    initial_ms: Option<i64>,
    factor: Option<f64>,
    max_ms: Option<i64>,
    jitter: Option<f64>,
) -> Backoff {
    let (Some(initial), Some(factor), Some(max)) = (initial_ms, factor, max_ms) else {
        return Backoff::default();
    };
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Backoff::new(ms(initial), factor, ms(max))
        .and_then(|b| b.with_jitter(jitter.unwrap_or(0.0)))
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "stored backoff policy is invalid; using the defaults");
            Backoff::default()
        })
}

/// The error for rows the store finds in a state its own writes never leave
/// them in: a database error, naming what was found.
pub(crate) fn corrupt(message: String) -> StoreError {
    StoreError::Database(sqlx::Error::Protocol(message).into())
}
