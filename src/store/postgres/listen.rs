//! Wake-ups from other nodes: one `LISTEN` connection per store, shared by every
//! controller and waiting claim that uses it.
//!
//! A process is subscribed the first time something waits on it; from then on
//! (until the store runs short of channels and nothing in this process holds
//! the process's signal any more, when it is let go to make room) a
//! notification on its channel (sent when an enqueue, a retry or a dirty
//! completion commits on any node) fires the process's in-process signal
//! ([`wakeup::notify`]). Notifications are hints: waiters poll as well, and
//! after the connection breaks every subscribed process is woken once, since
//! anything may have been missed. When the store retires its connections (a
//! read-only or shutting-down server, see `failover.rs`), the `LISTEN`
//! connection goes too: it re-subscribes wherever the pool now connects (the
//! new primary) and wakes every process once, so no wake-up sent there is lost.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::PostgresStore;
use crate::store::wakeup;

/// The pause before reconnecting after a first failure; doubled (up to 5 s)
/// while failures repeat.
const FIRST_DELAY: Duration = Duration::from_millis(100);

/// The most channels one store listens on. When all are taken, those of
/// processes nothing here waits on any more are let go; past that, waits on
/// further processes poll.
const MAX_CHANNELS: usize = 1024;

/// What the listening task is asked to do, in the order asked.
#[derive(Debug)]
enum Request {
    Listen(String),
    Unlisten(String),
}

/// The listening task's handle: dropping it (with the last clone of its
/// store) or [`stop`](Self::stop) ends the task and its connection.
#[derive(Debug)]
pub(super) struct Listener {
    subscribed: Mutex<HashSet<String>>,
    requests: mpsc::UnboundedSender<Request>,
    stop: CancellationToken,
}

impl Listener {
    /// Starts the listening task on `pool`; it connects when the first process
    /// is subscribed. Must be called inside a Tokio runtime.
    /// A change of `notices` (the store retired its connections) makes it
    /// reconnect.
    pub(super) fn start(pool: PgPool, notices: watch::Receiver<u64>) -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        tokio::spawn(listen(pool, rx, notices, stop.clone()));
        Self {
            subscribed: Mutex::new(HashSet::new()),
            requests,
            stop,
        }
    }

    /// Makes sure notifications of `process` wake this process's waiters.
    /// With every channel taken, first lets go of the processes whose signal
    /// nothing in this process holds (their waits ended): a caller's claims
    /// on a thousand made-up names cannot keep a real waiter from being
    /// woken once they are over.
    pub(super) fn subscribe(&self, process: &str) {
        let mut subscribed = self
            .subscribed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if subscribed.contains(process) {
            return;
        }
        if subscribed.len() >= MAX_CHANNELS {
            subscribed.retain(|other| {
                let waited = wakeup::waited_on(other);
                if !waited {
                    self.requests.send(Request::Unlisten(other.clone())).ok();
                }
                waited
            });
        }
        if subscribed.len() < MAX_CHANNELS {
            subscribed.insert(process.to_owned());
            self.requests.send(Request::Listen(process.to_owned())).ok();
        }
    }

    /// Ends the task (what closing the store does).
    pub(super) fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Relays notifications, reconnecting with a growing delay after errors.
async fn listen(
    pool: PgPool,
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut notices: watch::Receiver<u64>,
    stop: CancellationToken,
) {
    // channel → process
    let mut channels: HashMap<String, String> = HashMap::new();
    let mut delay = FIRST_DELAY;
    loop {
        notices.mark_unchanged();
        let result = tokio::select! {
            () = stop.cancelled() => return,
            result = relay(&pool, &mut requests, &mut channels) => result,
            Ok(()) = notices.changed() => Err(None),
        };
        match result {
            Ok(()) => return, // every handle is gone
            Err(Some(e)) => {
                tracing::warn!(error = %e, "LISTEN failed; waiters poll until it reconnects");
            }
            Err(None) => {
                tracing::debug!("LISTEN follows the store to a fresh connection");
                delay = FIRST_DELAY;
            }
        }
        for process in channels.values() {
            wakeup::notify(process);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Listens on every known channel and on each newly requested one, relaying
/// notifications until the connection fails (`Err`) or the handle is dropped.
/// A connection the driver replaced on its own wakes every process, since
/// notifications sent meanwhile were lost.
async fn relay(
    pool: &PgPool,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    channels: &mut HashMap<String, String>,
) -> Result<(), Option<sqlx::Error>> {
    // Nothing to listen on yet: connect only once something waits.
    while channels.is_empty() {
        match requests.recv().await {
            None => return Ok(()),
            Some(Request::Listen(process)) => {
                channels.insert(PostgresStore::notify_channel(&process), process);
            }
            Some(Request::Unlisten(_)) => {}
        }
    }
    let mut listener = PgListener::connect_with(pool).await?;
    for channel in channels.keys() {
        listener.listen(channel).await?;
    }
    // An enqueue before the LISTEN took effect sent nothing we could hear.
    for process in channels.values() {
        wakeup::notify(process);
    }
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                None => return Ok(()),
                Some(Request::Listen(process)) => {
                    let channel = PostgresStore::notify_channel(&process);
                    // Recorded first: a failed LISTEN is tried again on
                    // the next connection.
                    channels.insert(channel.clone(), process.clone());
                    listener.listen(&channel).await?;
                    wakeup::notify(&process);
                }
                Some(Request::Unlisten(process)) => {
                    let channel = PostgresStore::notify_channel(&process);
                    channels.remove(&channel);
                    listener.unlisten(&channel).await?;
                }
            },
            notification = listener.try_recv() => match notification? {
                Some(notification) => {
                    if let Some(process) = channels.get(notification.channel()) {
                        wakeup::notify(process);
                    }
                }
                None => {
                    for process in channels.values() {
                        wakeup::notify(process);
                    }
                }
            }
        }
    }
}
