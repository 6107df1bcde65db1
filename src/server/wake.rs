//! Wake-ups for long-polling claims: the same idea as the runner's, shared by
//! every waiting request of one server.
//!
//! In-process enqueues fire [`Store::wakeup`]. On PostgreSQL one background
//! task `LISTEN`s on the channel of every process a claim has waited on and
//! relays notifications to the same signal, so an enqueue on any node wakes the
//! claim at once. Both are hints: waiting claims poll as well.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::store::{PostgresStore, Store};

/// The most channels one server listens on; claims on further processes poll.
const MAX_CHANNELS: usize = 1024;

/// Subscribes processes to the server's PostgreSQL listener (a no-op on SQLite).
#[derive(Debug, Clone)]
pub(crate) struct Wakeups {
    inner: Option<Arc<Listening>>,
}

#[derive(Debug)]
struct Listening {
    subscribed: Mutex<HashSet<String>>,
    requests: mpsc::UnboundedSender<String>,
}

impl Wakeups {
    /// Starts the listener task on PostgreSQL; it runs until `stop` fires.
    pub(crate) fn start(store: &Store, stop: &CancellationToken) -> Self {
        let Some(pool) = store.postgres_pool() else {
            return Self { inner: None };
        };
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(listen(pool.clone(), store.clone(), rx, stop.clone()));
        let inner = Arc::new(Listening {
            subscribed: Mutex::new(HashSet::new()),
            requests,
        });
        Self { inner: Some(inner) }
    }

    /// Makes sure enqueues of `process` on other nodes wake this server's claims.
    pub(crate) fn subscribe(&self, process: &str) {
        let Some(inner) = &self.inner else { return };
        let mut subscribed = inner
            .subscribed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if subscribed.len() < MAX_CHANNELS && subscribed.insert(process.to_owned()) {
            inner.requests.send(process.to_owned()).ok();
        }
    }
}

/// Relays notifications to the processes' in-process signals, reconnecting
/// (and waking everyone, since anything may have been missed) after errors.
async fn listen(
    pool: sqlx::PgPool,
    store: Store,
    mut requests: mpsc::UnboundedReceiver<String>,
    stop: CancellationToken,
) {
    let mut channels: HashMap<String, String> = HashMap::new();
    let mut delay = Duration::from_millis(100);
    loop {
        let result = tokio::select! {
            () = stop.cancelled() => return,
            result = relay(&pool, &store, &mut requests, &mut channels) => result,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "LISTEN failed; waiting claims poll until it reconnects");
        }
        for process in channels.values() {
            store.wakeup(process).notify_waiters();
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn relay(
    pool: &sqlx::PgPool,
    store: &Store,
    requests: &mut mpsc::UnboundedReceiver<String>,
    channels: &mut HashMap<String, String>,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    for channel in channels.keys() {
        listener.listen(channel).await?;
    }
    loop {
        tokio::select! {
            process = requests.recv() => {
                let Some(process) = process else { return Ok(()) };
                let channel = PostgresStore::notify_channel(&process);
                listener.listen(&channel).await?;
                // An enqueue just before the LISTEN took effect sent no
                // notification we could hear: let waiting claims look again.
                store.wakeup(&process).notify_waiters();
                channels.insert(channel, process);
            }
            notification = listener.recv() => {
                if let Some(process) = channels.get(notification?.channel()) {
                    store.wakeup(process).notify_waiters();
                }
            }
        }
    }
}
