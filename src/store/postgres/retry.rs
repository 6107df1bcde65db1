//! Retrying operations that lost a race or found the pool exhausted.

use std::future::Future;
use std::time::Duration;

use crate::store::{DriverError, StoreError};

/// Attempts per operation, the first included.
const ATTEMPTS: u32 = 4;

/// The pause before the first retry; doubled for each further one.
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// Runs `op` until it succeeds, fails with anything but [`StoreError::Busy`], or
/// has been tried [`ATTEMPTS`] times. Only failures that guarantee nothing was
/// committed are retried, so running the operation again cannot apply it twice:
/// a `Busy` from PostgreSQL itself (serialization failure, deadlock, lock
/// timeout: the transaction was aborted) and `Unavailable` (the connection broke
/// before the commit; the server rolls the transaction back). A broken connection
/// at the commit is `CommitUnknown` and is not retried.
pub(super) async fn retry<T, F, Fut>(op: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut pause = FIRST_PAUSE;
    for _ in 1..ATTEMPTS {
        match op().await {
            Err(
                StoreError::Busy(DriverError(e @ sqlx::Error::Database(_)))
                | StoreError::Unavailable(DriverError(e)),
            ) => {
                tracing::debug!(error = %e, "postgres transaction failed before commit; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return other,
        }
    }
    op().await
}
