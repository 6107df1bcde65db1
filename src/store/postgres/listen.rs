//! Wake-ups from other nodes: one `LISTEN` connection per store, shared by every
//! controller and waiting claim that uses it.
//!
//! A process is subscribed the first time something waits on it; from then on
//! (until the store runs short of channels and nothing in this process holds
//! the process's signal any more, when it is let go to make room) a
//! notification on its channel (sent when a write that leaves keys ready
//! commits on any node: an enqueue, a retry or a dirty completion, a key
//! given back by a release, a close or a reclaim) fires the process's in-process signal
//! ([`wakeup::notify`]). A process that found all 1,024 channels held by
//! processes still waited on is listened for as soon as one comes free
//! (checked every second), for as long as it is still waited on. Notifications are hints: waiters poll as well, and
//! after the connection breaks every subscribed process is woken once, since
//! anything may have been missed. When the store retires its connections (a
//! read-only or shutting-down server, see `failover.rs`), the `LISTEN`
//! connection goes too: it re-subscribes wherever the pool now connects (the
//! new primary) and wakes every process once, so no wake-up sent there is lost.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
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

/// The channels listened on, each with the processes whose notifications
/// it carries.
type Channels = HashMap<String, HashSet<String>>;

/// What the listening task is asked to do, in the order asked.
#[derive(Debug)]
enum Request {
    Listen(String),
    Unlisten(String),
}

/// How often a store with waiters it could not listen for (every channel
/// was taken when they subscribed) checks whether channels came free: a
/// signal let go tells nobody, so the check is a look at this process's
/// registry, never a query.
const ADMIT_EVERY: Duration = Duration::from_secs(1);

/// The processes a store listens for, and those refused a channel while
/// every channel was taken.
#[derive(Debug, Default)]
struct Subscriptions {
    listening: HashSet<String>,
    /// Refused processes; admitted when a channel comes free while one
    /// still waits, forgotten once none does (so made-up names cannot pile
    /// up here either).
    refused: HashSet<String>,
}

impl Subscriptions {
    /// Listens for `process` if a channel is free or can be freed; `false`
    /// when every channel is taken by a process still waited on.
    fn admit(&mut self, process: &str, requests: &mpsc::UnboundedSender<Request>) -> bool {
        if self.listening.len() >= MAX_CHANNELS {
            self.listening.retain(|other| {
                let waited = wakeup::waited_on(other);
                if !waited {
                    requests.send(Request::Unlisten(other.clone())).ok();
                }
                waited
            });
        }
        if self.listening.len() >= MAX_CHANNELS {
            return false;
        }
        self.listening.insert(process.to_owned());
        requests.send(Request::Listen(process.to_owned())).ok();
        true
    }

    /// Admits the refused processes still waited on, while channels can be
    /// freed; forgets those nobody waits on any more.
    fn admit_refused(&mut self, requests: &mpsc::UnboundedSender<Request>) {
        let mut refused = std::mem::take(&mut self.refused);
        refused.retain(|process| wakeup::waited_on(process));
        let mut full = false;
        for process in refused {
            if full || !self.admit(&process, requests) {
                full = true;
                self.refused.insert(process);
            }
        }
    }
}

/// The listening task's handle: dropping it (with the last clone of its
/// store) or [`stop`](Self::stop) ends the task and its connection.
#[derive(Debug)]
pub(super) struct Listener {
    subscriptions: Arc<Mutex<Subscriptions>>,
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
        let subscriptions = Arc::default();
        tokio::spawn(listen(pool, rx, notices, stop.clone()));
        tokio::spawn(admit(
            Arc::downgrade(&subscriptions),
            requests.clone(),
            stop.clone(),
        ));
        Self {
            subscriptions,
            requests,
            stop,
        }
    }

    /// Makes sure notifications of `process` wake this process's waiters.
    /// With every channel taken, first lets go of the processes whose signal
    /// nothing in this process holds (their waits ended): a caller's claims
    /// on a thousand made-up names cannot keep a real waiter from being
    /// woken once they are over. A process refused because every channel is
    /// held is admitted within [`ADMIT_EVERY`] of one coming free, for as
    /// long as it is still waited on: a controller subscribes once, at its
    /// start, and would otherwise poll for its life.
    pub(super) fn subscribe(&self, process: &str) {
        let mut subscriptions = self
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if subscriptions.listening.contains(process) {
            return;
        }
        if subscriptions.admit(process, &self.requests) {
            subscriptions.refused.remove(process);
        } else {
            subscriptions.refused.insert(process.to_owned());
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

/// Every [`ADMIT_EVERY`], admits the refused processes still waited on if
/// channels came free; ends with the store's listener.
async fn admit(
    subscriptions: Weak<Mutex<Subscriptions>>,
    requests: mpsc::UnboundedSender<Request>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(ADMIT_EVERY) => {}
        }
        let Some(subscriptions) = subscriptions.upgrade() else {
            return;
        };
        let mut subscriptions = subscriptions.lock().unwrap_or_else(PoisonError::into_inner);
        if !subscriptions.refused.is_empty() {
            subscriptions.admit_refused(&requests);
        }
    }
}

/// Relays notifications, reconnecting with a growing delay after errors.
async fn listen(
    pool: PgPool,
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut notices: watch::Receiver<u64>,
    stop: CancellationToken,
) {
    // channel → the processes listening on it (names may share a channel:
    // a hashed name's channel is also that of the name its hash spells)
    let mut channels: Channels = HashMap::new();
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
        for process in channels.values().flatten() {
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
    channels: &mut Channels,
) -> Result<(), Option<sqlx::Error>> {
    // Nothing to listen on yet: connect only once something waits.
    while channels.is_empty() {
        match requests.recv().await {
            None => return Ok(()),
            Some(Request::Listen(process)) => {
                let channel = PostgresStore::notify_channel(&process);
                channels.entry(channel).or_default().insert(process);
            }
            Some(Request::Unlisten(_)) => {}
        }
    }
    let mut listener = PgListener::connect_with(pool).await?;
    for channel in channels.keys() {
        listener.listen(channel).await?;
    }
    // An enqueue before the LISTEN took effect sent nothing we could hear.
    for process in channels.values().flatten() {
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
                    channels
                        .entry(channel.clone())
                        .or_default()
                        .insert(process.clone());
                    listener.listen(&channel).await?;
                    wakeup::notify(&process);
                }
                Some(Request::Unlisten(process)) => {
                    // The channel is let go with the last process on it.
                    let channel = PostgresStore::notify_channel(&process);
                    let Some(processes) = channels.get_mut(&channel) else {
                        continue;
                    };
                    processes.remove(&process);
                    if processes.is_empty() {
                        channels.remove(&channel);
                        listener.unlisten(&channel).await?;
                    }
                }
            },
            notification = listener.try_recv() => match notification? {
                Some(notification) => {
                    for process in channels.get(notification.channel()).into_iter().flatten() {
                        wakeup::notify(process);
                    }
                }
                None => {
                    for process in channels.values().flatten() {
                        wakeup::notify(process);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::{Connection as _, PgConnection};
    use tokio::sync::Notify;

    use super::super::plans::Schema;
    use super::PostgresStore;
    use crate::store::Store;

    /// How long a `LISTEN`, or a notification's relay, may take here.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// Subscribes `store` to `process` and returns its signal once the
    /// store listens on its channel (the listening task wakes a process
    /// whose `LISTEN` took effect).
    async fn listening(store: &Store, process: &str) -> std::sync::Arc<tokio::sync::Notify> {
        let signal = store.wakeup(process);
        let mut listened = Box::pin(std::sync::Arc::clone(&signal).notified_owned());
        listened.as_mut().enable();
        let subscribed = store.subscribe(process);
        assert!(std::sync::Arc::ptr_eq(&signal, &subscribed));
        tokio::time::timeout(PATIENCE, listened)
            .await
            .unwrap_or_else(|_| panic!("{process}: the store listens"));
        signal
    }

    /// Asserts a notification on `channel` from another connection (another
    /// node's enqueue) fires `signal`.
    async fn woken_by_another_node(url: &str, signal: &Notify, channel: &str) {
        let woken = signal.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let mut node = PgConnection::connect(url).await.expect("a connection");
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(channel)
            .execute(&mut node)
            .await
            .expect("a notification");
        tokio::time::timeout(PATIENCE, woken)
            .await
            .expect("the waiter is woken by the other node's notification");
        node.close().await.expect("the connection closes");
    }

    /// A made-up process named as another process's channel hash (a hashed
    /// name's channel is `drover_` and 16 hex digits, and 16 hex digits are
    /// a name whose channel is `drover_` and itself) shares that process's
    /// channel. A waiting claim on it, over at once, must leave the real
    /// waiter its wake-ups from other nodes. The listening task kept one
    /// process per channel: the made-up name took the channel's
    /// notifications, and the real waiter slept until its poll (and, with
    /// the store short of channels, the made-up name's `UNLISTEN` would end
    /// the channel for both).
    #[tokio::test]
    async fn a_made_up_name_sharing_a_channel_leaves_the_real_waiter_its_wakeups() {
        let Some(schema) = Schema::create("drover_shared_channel").await else {
            return;
        };
        let store = Store::connect(&schema.url).await.expect("a store");
        let real = format!("Shared-Channel-{}", std::process::id());
        let channel = PostgresStore::notify_channel(&real);
        let made_up = channel
            .strip_prefix("drover_")
            .expect("a channel")
            .to_owned();
        assert_eq!(PostgresStore::notify_channel(&made_up), channel);
        let signal = listening(&store, &real).await;
        drop(listening(&store, &made_up).await);
        woken_by_another_node(&schema.url, &signal, &channel).await;
        store.close().await;
        schema.remove().await;
    }

    /// A controller subscribes once, at its start. If every channel was then
    /// held by processes still waited on, it was refused, and stayed deaf to
    /// other nodes for its life, polling, even after the other waits ended.
    /// It is now admitted once a channel comes free.
    #[tokio::test]
    async fn a_waiter_refused_a_channel_is_admitted_once_one_comes_free() {
        let Some(schema) = Schema::create("drover_refused_channel").await else {
            return;
        };
        let store = Store::connect(&schema.url).await.expect("a store");
        let pid = std::process::id();
        let held: Vec<_> = (0..super::MAX_CHANNELS)
            .map(|n| store.subscribe(&format!("held_{pid}_{n}")))
            .collect();
        let real = format!("refused_{pid}");
        let signal = store.wakeup(&real);
        let admitted = std::sync::Arc::clone(&signal).notified_owned();
        tokio::pin!(admitted);
        admitted.as_mut().enable();
        drop(store.subscribe(&real));
        drop(held);
        tokio::time::timeout(PATIENCE, admitted)
            .await
            .expect("the refused waiter listens once channels come free");
        let channel = PostgresStore::notify_channel(&real);
        woken_by_another_node(&schema.url, &signal, &channel).await;
        store.close().await;
        schema.remove().await;
    }
}
