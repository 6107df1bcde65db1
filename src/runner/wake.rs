//! Wake-ups for idle controllers, so new work starts within milliseconds of an
//! enqueue instead of at the next poll.
//!
//! Two signals feed one [`Notify`]: enqueues through the same [`Store`] in this
//! process (both engines), and on PostgreSQL a `LISTEN` on the process's channel,
//! which hears enqueues from every node. Both are hints: the controller still
//! polls, so a lost notification only delays work until the next poll.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::{Notify, futures::Notified};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::store::{PostgresStore, Store};

/// A controller's wake-up signal.
#[derive(Debug)]
pub(crate) struct Wake {
    notify: Arc<Notify>,
}

impl Wake {
    /// Subscribes to `process`'s enqueues; on PostgreSQL, starts a listener task
    /// on `services` that runs until `stop` fires.
    pub(crate) fn subscribe(
        store: &Store,
        process: &str,
        services: &TaskTracker,
        stop: &CancellationToken,
    ) -> Self {
        let notify = store.wakeup(process);
        if let Some(pool) = store.postgres_pool() {
            let channel = PostgresStore::notify_channel(process);
            services.spawn(listen(
                pool.clone(),
                channel,
                Arc::clone(&notify),
                stop.clone(),
            ));
        }
        Self { notify }
    }

    /// Completes at the next wake-up after this call (not one before it).
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

/// Relays notifications on `channel` to `notify`, reconnecting after errors.
async fn listen(pool: sqlx::PgPool, channel: String, notify: Arc<Notify>, stop: CancellationToken) {
    let mut delay = Duration::from_millis(100);
    loop {
        let result = tokio::select! {
            () = stop.cancelled() => return,
            result = relay(&pool, &channel, &notify) => result,
        };
        if let Err(e) = result {
            tracing::warn!(%channel, error = %e, "LISTEN failed; polling until it reconnects");
        }
        // Anything may have been enqueued while we were not listening.
        notify.notify_waiters();
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn relay(pool: &sqlx::PgPool, channel: &str, notify: &Notify) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    loop {
        listener.recv().await?;
        notify.notify_waiters();
    }
}
