//! WAL checkpoints off the write path.
//!
//! SQLite checkpoints the WAL into the database file automatically, inside
//! the commit that pushes the WAL past 1,000 pages: that commit — on drover's
//! one writer connection, so every claim and completion queued behind it —
//! then copies megabytes (≈20 ms of a 10,000-key enqueue's ≈55 ms). The writer
//! turns that off, and this task checkpoints from a reader connection instead,
//! on the other core, in `PASSIVE` mode, which never blocks the writer or
//! readers. Other processes sharing the file keep their own settings.

use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How soon to check again after a checkpoint that found frames to copy.
const BUSY_EVERY: Duration = Duration::from_millis(50);

/// How soon to check again when the WAL was empty.
const IDLE_EVERY: Duration = Duration::from_secs(1);

/// Stops the task when the last clone of the store is dropped.
#[derive(Debug, Clone)]
pub(super) struct Checkpoints {
    _stop: Arc<DropGuard>,
}

impl Checkpoints {
    /// Starts checkpointing `pool`'s database until the returned handle (and
    /// its clones) are dropped or the pool is closed.
    pub(super) fn start(pool: SqlitePool) -> Self {
        let stop = CancellationToken::new();
        tokio::spawn(run(pool, stop.clone()));
        Self {
            _stop: Arc::new(stop.drop_guard()),
        }
    }
}

async fn run(pool: SqlitePool, stop: CancellationToken) {
    let mut every = IDLE_EVERY;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if pool.is_closed() {
            return;
        }
        // (busy, frames in the WAL, frames checkpointed); -1s when not in WAL mode.
        let result: Result<(i64, i64, i64), _> = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&pool)
            .await;
        every = match result {
            Ok((_, frames, _)) if frames > 0 => BUSY_EVERY,
            Ok(_) => IDLE_EVERY,
            Err(e) => {
                tracing::debug!(error = %e, "WAL checkpoint failed; retrying later");
                IDLE_EVERY
            }
        };
    }
}
