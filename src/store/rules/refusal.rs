//! Why the store refuses a caller, decided once for both engines: each engine
//! reads the rows with its own SQL and hands them here, so "which error does a
//! caller get, and what does it promise" is written one time.

#[cfg(feature = "_engine")]
use chrono::{DateTime, Utc};

use crate::store::error::StoreError;
use crate::store::types::Lease;

impl StoreError {
    /// The lease no longer holds its key (reclaimed, released, superseded):
    /// what a completion, a release or a fenced write gets, changing nothing.
    pub(crate) fn lease_lost(lease: &Lease) -> Self {
        Self::LeaseLost {
            process: lease.process.clone(),
            key: lease.key.clone(),
            token: lease.token,
        }
    }
}

/// What `lease_lock` found on the key's row when it could not take it.
#[cfg(feature = "_engine")]
#[derive(Debug)]
pub(crate) struct Unlockable<'a> {
    /// The item's stored state (`pending`, `running`, `parked`).
    pub(crate) state: &'a str,
    /// The end of its backoff, if any.
    pub(crate) backoff_until: Option<DateTime<Utc>>,
    /// When it becomes ready (a delayed enqueue, a requeue-after).
    pub(crate) ready_at: DateTime<Utc>,
}

/// Why `lease_lock` refused `process`/`key`: held by another lease, parked
/// until its next enqueue, or not due before its backoff or delay ends. A row
/// that fits none of these (it changed under the caller) is `Busy`: retrying
/// may take it.
#[cfg(feature = "_engine")]
pub(crate) fn lock_refusal(
    process: String,
    key: String,
    row: Option<Unlockable<'_>>,
    now: DateTime<Utc>,
) -> StoreError {
    let Some(row) = row else {
        return StoreError::Busy(sqlx::Error::RowNotFound.into());
    };
    let until = row.backoff_until.unwrap_or(row.ready_at).max(row.ready_at);
    match row.state {
        "running" => StoreError::AlreadyLeased { process, key },
        "parked" => StoreError::Parked { process, key },
        _ if until > now => StoreError::InBackoff {
            process,
            key,
            until,
        },
        _ => StoreError::Busy(sqlx::Error::RowNotFound.into()),
    }
}

#[cfg(all(test, feature = "_engine"))]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    fn refuse(state: &str, backoff: Option<i64>, ready: i64) -> StoreError {
        let now = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::seconds(100);
        let at = |s: i64| DateTime::<Utc>::UNIX_EPOCH + TimeDelta::seconds(s);
        let row = Unlockable {
            state,
            backoff_until: backoff.map(at),
            ready_at: at(ready),
        };
        lock_refusal("p".into(), "k".into(), Some(row), now)
    }

    #[test]
    fn a_lock_is_refused_for_the_first_reason_that_holds() {
        assert!(matches!(
            refuse("running", Some(200), 0),
            StoreError::AlreadyLeased { .. }
        ));
        assert!(matches!(
            refuse("parked", None, 0),
            StoreError::Parked { .. }
        ));
        let StoreError::InBackoff { until, .. } = refuse("pending", Some(150), 120) else {
            panic!("backing off")
        };
        assert_eq!(until.timestamp(), 150, "the later of backoff and delay");
        let StoreError::InBackoff { until, .. } = refuse("pending", None, 130) else {
            panic!("delayed")
        };
        assert_eq!(until.timestamp(), 130);
        assert!(matches!(
            refuse("pending", Some(50), 50),
            StoreError::Busy(_)
        ));
    }
}
