//! Following the primary across a failover: which host the pool connects to,
//! and which pooled connections may still be used.
//!
//! Every new connection is checked against the URL's `target_session_attrs`
//! (`read-write` by default with several hosts); one that reached the wrong
//! kind of server is swapped, before anything uses it, for a connection to
//! the first host in the URL's order that fits. When a statement finds its
//! server read-only, shutting down or gone ([`Failover::notice`]), every
//! connection opened before that moment is closed when next released or
//! acquired (none is returned to the pool), so no connection outlives its
//! server's role; the `LISTEN` connection is told to reconnect as well.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, Shared};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio::sync::watch;

use super::hosts::Target;
use super::lineage;
use crate::store::{Clock, DriverError, StoreError};

/// How long a connection attempt to one host may take while looking for the
/// host that fits.
const HOST_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a search for the host that fits tries the hosts again.
const SEARCH_PAUSE: Duration = Duration::from_millis(200);

/// How long a search goes on (the next notice starts another).
const SEARCH_FOR: Duration = Duration::from_secs(120);

/// How long, from its start, a finished look at a host's sign of life
/// answers the stuck requests that ask after it.
const PROBE_FRESH: Duration = Duration::from_secs(1);

/// Why a statement says its connection must go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// SQLSTATE 25006: the server refuses writes.
    ReadOnly,
    /// SQLSTATE 57P01–57P03: the server is shutting down or starting.
    ShuttingDown,
    /// The link broke (an I/O error, SQLSTATE class 08).
    Unreachable,
}

impl Cause {
    /// What happened and what drover does about it, in words.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Self::ReadOnly => {
                "the database is read-only (a standby, or a primary that was demoted): reconnecting"
            }
            Self::ShuttingDown => {
                "the database server is shutting down or restarting: reconnecting"
            }
            Self::Unreachable => "the database connection broke (host unreachable): reconnecting",
        }
    }

    /// The cause of `e`, when it is one that retires connections.
    pub(crate) fn of(e: &StoreError) -> Option<Self> {
        let (StoreError::Unavailable(DriverError(e)) | StoreError::CommitUnknown(DriverError(e))) =
            e
        else {
            return None;
        };
        Self::of_driver(e)
    }

    /// The cause of a driver error, when it is one that retires connections.
    pub(crate) fn of_driver(e: &sqlx::Error) -> Option<Self> {
        match e {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("25006") => Some(Self::ReadOnly),
                Some("57P01" | "57P02" | "57P03") => Some(Self::ShuttingDown),
                Some(c) if c.starts_with("08") => Some(Self::Unreachable),
                _ => None,
            },
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) => Some(Self::Unreachable),
            _ => None,
        }
    }
}

/// The hosts of one URL and the state of the connections to them.
#[derive(Debug)]
pub(crate) struct Failover {
    /// `HOST:PORT` and connect options of each host, in the URL's order.
    hosts: Vec<(String, PgConnectOptions)>,
    target: Target,
    /// The host new connections go to.
    current: AtomicUsize,
    /// Connections opened before this were made to a server whose role may
    /// have changed: they are closed instead of reused.
    since: Mutex<Option<Instant>>,
    /// Between a notice and the next good connection (so the notice is
    /// logged once).
    reconnecting: AtomicBool,
    /// Whether a search for the host that fits runs.
    searching: AtomicBool,
    /// Whether the host reached was logged.
    announced: AtomicBool,
    /// Counts notices, for the `LISTEN` connection to follow.
    notices: watch::Sender<u64>,
    /// The store's clock, which the check of a new connection reads the
    /// database's lineage with.
    clock: Clock,
    /// The last look at each host's sign of life (see [`answers`](Self::answers)).
    probes: Mutex<Vec<Option<Probe>>>,
}

/// One look at a host's sign of life, which every request stuck on that host
/// meanwhile shares.
struct Probe {
    started: Instant,
    /// How long it may take: a caller that allows another time starts a
    /// look of its own.
    within: Duration,
    alive: Shared<BoxFuture<'static, bool>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("started", &self.started)
            .field("within", &self.within)
            .field("alive", &self.alive.peek())
            .finish()
    }
}

impl Failover {
    /// The failover state of `hosts` (at least one).
    pub(crate) fn new(hosts: Vec<(String, PgConnectOptions)>, target: Target) -> Arc<Self> {
        Arc::new(Self {
            hosts,
            target,
            current: AtomicUsize::new(0),
            since: Mutex::new(None),
            reconnecting: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            searching: AtomicBool::new(false),
            notices: watch::Sender::new(0),
            clock: Clock::default(),
            probes: Mutex::new(Vec::new()),
        })
    }

    /// The clock of the store these connections serve (clones share it).
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// How many hosts the URL names.
    pub(crate) fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The options of the host new connections go to.
    pub(crate) fn options(&self) -> PgConnectOptions {
        self.hosts[self.current.load(Ordering::Relaxed)].1.clone()
    }

    /// The host that fits, first in the URL's order, as its index; logged when
    /// the URL names several. Errors say what each host answered.
    pub(crate) async fn find(&self, timeout: Duration) -> Result<usize, String> {
        let mut answers = Vec::new();
        for &pass in self.target.passes() {
            answers.clear();
            for (i, (name, options)) in self.hosts.iter().enumerate() {
                match self.try_host(options, timeout, pass).await {
                    Ok(conn) => {
                        conn.close().await.ok();
                        self.reached(i);
                        return Ok(i);
                    }
                    Err(why) => answers.push(format!("{name} {why}")),
                }
            }
        }
        Err(format!(
            "no host accepts {} sessions: {}",
            self.target.name(),
            answers.join("; ")
        ))
    }

    /// A connection to `options`' host if it fits `target` (one of the
    /// target's [`passes`](Target::passes)); otherwise what the host is.
    async fn try_host(
        &self,
        options: &PgConnectOptions,
        timeout: Duration,
        target: Target,
    ) -> Result<PgConnection, String> {
        let mut conn =
            match tokio::time::timeout(timeout, PgConnection::connect_with(options)).await {
                Err(_) => return Err(format!("did not answer within {timeout:?}")),
                Ok(Err(e)) => return Err(format!("refused: {}", DriverError(e))),
                Ok(Ok(conn)) => conn,
            };
        if target == Target::Any {
            return Ok(conn);
        }
        match role(&mut conn).await {
            Ok((recovery, read_only)) if target.fits(recovery, read_only) => Ok(conn),
            Ok((true, _)) => Err("is a standby".into()),
            Ok((false, _)) => Err("is read-only".into()),
            Err(e) => Err(format!("failed: {}", DriverError(e))),
        }
    }

    /// Whether host `i` answers a new connection of its own (made, and one
    /// round trip on it) within `within`: a sign of life that no lock and no
    /// busy pool holds up.
    ///
    /// One look at a time per host: requests that ask while one is under
    /// way, or after one that started less than [`PROBE_FRESH`] ago, share
    /// its answer (so a host gets at most one look a second). A hundred
    /// requests stuck behind a busy pool used to open a hundred connections
    /// to the busy server, about together. The look runs on a task of its
    /// own, so it goes on when the request that started it is answered.
    pub(crate) async fn answers(&self, i: usize, within: Duration) -> bool {
        let alive = {
            let mut probes = self.probes.lock().unwrap_or_else(PoisonError::into_inner);
            if probes.len() < self.hosts.len() {
                probes.resize_with(self.hosts.len(), || None);
            }
            match &probes[i] {
                Some(probe)
                    if probe.within == within
                        && probe.started.elapsed() < within
                        && (probe.alive.peek().is_none()
                            || probe.started.elapsed() < PROBE_FRESH) =>
                {
                    probe.alive.clone()
                }
                _ => {
                    let options = self.hosts[i].1.clone();
                    let look = tokio::spawn(async move {
                        let probe = async {
                            let mut conn = PgConnection::connect_with(&options).await?;
                            conn.ping().await?;
                            conn.close().await
                        };
                        matches!(tokio::time::timeout(within, probe).await, Ok(Ok(())))
                    });
                    let alive = async move { look.await.unwrap_or(false) }.boxed().shared();
                    probes[i] = Some(Probe {
                        started: Instant::now(),
                        within,
                        alive: alive.clone(),
                    });
                    alive
                }
            }
        };
        alive.await
    }

    /// Records that new connections go to host `i`, logging a change.
    fn reached(&self, i: usize) {
        let before = self.current.swap(i, Ordering::Relaxed);
        let many = self.hosts.len() > 1;
        if self.reconnecting.swap(false, Ordering::Relaxed) {
            tracing::warn!(host = %self.hosts[i].0, "reconnected to the database");
        } else if many && (!self.announced.swap(true, Ordering::Relaxed) || before != i) {
            tracing::info!(host = %self.hosts[i].0, target = self.target.name(), "connected to the database");
        }
    }

    /// Which host new connections go to.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Retires every connection opened so far when `e` says their server's
    /// role may have changed; logs the cause once per outage. Returns whether
    /// it did.
    pub(crate) fn notice(&self, e: &StoreError) -> bool {
        let Some(cause) = Cause::of(e) else {
            return false;
        };
        *self.since.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        if !self.reconnecting.swap(true, Ordering::Relaxed) {
            tracing::warn!(cause = ?cause, "{}", cause.words());
        }
        self.notices.send_modify(|n| *n += 1);
        true
    }

    /// A receiver that changes at each [`notice`](Self::notice).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.notices.subscribe()
    }

    /// Whether a connection of this age was opened after the last notice.
    fn fresh(&self, age: Duration) -> bool {
        let since = *self.since.lock().unwrap_or_else(PoisonError::into_inner);
        since.is_none_or(|since| Instant::now().checked_sub(age).is_some_and(|t| t > since))
    }

    /// Checks a new connection before anything uses it: against the target,
    /// swapping it for one to the first host that fits when it reached the
    /// wrong kind of server; then against the database's lineage, so the
    /// first connection to a promoted standby starts the pause of claims.
    async fn check(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        self.fit(conn).await?;
        // In a transaction, as every statement through a pooler (see `role`).
        let mut tx = conn.begin().await?;
        lineage::observe(&mut *tx, self.clock.offset_ms()).await?;
        tx.commit().await
    }

    /// The check of a new connection against the target, pass by pass (see
    /// [`Target::passes`]): kept when it is as good as the pass asks,
    /// otherwise swapped for the first host that is.
    async fn fit(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.target == Target::Any {
            if self.reconnecting.swap(false, Ordering::Relaxed) {
                tracing::warn!("reconnected to the database");
            }
            return Ok(());
        }
        let (recovery, read_only) = role(conn).await?;
        for &pass in self.target.passes() {
            if pass.fits(recovery, read_only) {
                if self.reconnecting.swap(false, Ordering::Relaxed) {
                    tracing::warn!(host = %self.hosts[self.current()].0, "reconnected to the database");
                }
                return Ok(());
            }
            self.reconnecting.store(true, Ordering::Relaxed);
            for (i, (_, options)) in self.hosts.iter().enumerate() {
                if let Ok(found) = self.try_host(options, HOST_TIMEOUT, pass).await {
                    let wrong = std::mem::replace(conn, found);
                    wrong.close().await.ok();
                    self.reached(i);
                    return Ok(());
                }
            }
        }
        Err(sqlx::Error::Protocol(format!(
            "no host accepts {} sessions yet",
            self.target.name()
        )))
    }

    /// Pool options whose hooks keep this failover's rules.
    pub(crate) fn pool_options(self: &Arc<Self>) -> PgPoolOptions {
        let connect = Arc::clone(self);
        let acquire = Arc::clone(self);
        let release = Arc::clone(self);
        PgPoolOptions::new()
            .after_connect(move |conn, _| -> BoxFuture<'_, Result<(), sqlx::Error>> {
                let failover = Arc::clone(&connect);
                Box::pin(async move { failover.check(conn).await })
            })
            .before_acquire(move |_, meta| -> BoxFuture<'_, Result<bool, sqlx::Error>> {
                let fresh = acquire.fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .after_release(move |_, meta| -> BoxFuture<'_, Result<bool, sqlx::Error>> {
                let fresh = release.fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
    }

    /// After a notice, when the URL names several hosts, looks in the
    /// background (one search at a time, every [`SEARCH_PAUSE`], for at most
    /// [`SEARCH_FOR`]) for the host that now fits and points `pool` at it:
    /// the pool keeps retrying the host it knows (a dead primary refuses
    /// connections and never reaches the check of a new connection) and
    /// picks the new host up at its next attempt.
    pub(crate) fn search(self: &Arc<Self>, pool: &PgPool, at: &Arc<AtomicUsize>) {
        if self.hosts.len() < 2 || self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let (failover, pool, at) = (Arc::clone(self), pool.clone(), Arc::clone(at));
        tokio::spawn(async move {
            let started = Instant::now();
            while started.elapsed() < SEARCH_FOR && !pool.is_closed() {
                if let Ok(i) = failover.find(HOST_TIMEOUT).await {
                    at.store(i, Ordering::Relaxed);
                    pool.set_connect_options(failover.hosts[i].1.clone());
                    break;
                }
                tokio::time::sleep(SEARCH_PAUSE).await;
            }
            failover.searching.store(false, Ordering::Release);
        });
    }

    /// Points `pool` at the current host if a check moved it elsewhere.
    pub(crate) fn follow(&self, pool: &PgPool, at: &AtomicUsize) {
        let current = self.current();
        if at.swap(current, Ordering::Relaxed) != current {
            pool.set_connect_options(self.hosts[current].1.clone());
        }
    }
}

/// Whether the server is in recovery (a standby) and whether its sessions
/// are read-only.
///
/// Inside a transaction, whether or not a pooler is in front: sqlx parses an
/// unnamed statement and binds it in two round trips, and a transaction-pooling
/// PgBouncer may hand the second to another server when the first leaves the
/// server idle (see `tx.rs`). A new connection is checked once, so the two
/// extra round trips cost nothing that matters.
async fn role(conn: &mut PgConnection) -> Result<(bool, bool), sqlx::Error> {
    let mut tx = conn.begin().await?;
    let role = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .persistent(false)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> StoreError {
        StoreError::Unavailable(DriverError(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        ))))
    }

    #[test]
    fn only_a_lost_or_refusing_server_retires_connections() {
        assert_eq!(Cause::of(&io()), Some(Cause::Unreachable));
        assert_eq!(
            Cause::of(&StoreError::Busy(DriverError(sqlx::Error::PoolTimedOut))),
            None
        );
        assert_eq!(Cause::of(&StoreError::InvalidArgument("x".into())), None);
        assert!(Cause::ReadOnly.words().starts_with(
            "the database is read-only (a standby, or a primary that was demoted): reconnecting"
        ));
    }

    #[tokio::test]
    async fn a_notice_retires_older_connections_and_is_announced_to_listeners() {
        let options = PgConnectOptions::new();
        let failover = Failover::new(vec![("h:5432".into(), options)], Target::Any);
        let old = Duration::from_secs(5);
        assert!(failover.fresh(old), "nothing noticed yet");
        let notices = failover.subscribe();
        assert!(!failover.notice(&StoreError::InvalidArgument("x".into())));
        assert!(failover.notice(&io()));
        assert!(notices.has_changed().expect("sender alive"));
        assert!(!failover.fresh(old), "opened before the notice");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let new = Duration::ZERO;
        assert!(failover.fresh(new), "opened after the notice");
    }
}
