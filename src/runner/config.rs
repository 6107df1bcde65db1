//! [`ControllerBuilder`]: every knob of a control loop, validated when built.

use std::sync::Arc;
use std::time::Duration;

use super::Pruner;
use super::controller::Controller;
use super::reconciler::Reconciler;
use super::source::Source;
use crate::backoff::Backoff;
use crate::queue::rate_limit::{Bucket, RateLimitError};
use crate::store::{Store, StoreError, WorkerBackend, validate_process};

/// Why a [`ControllerBuilder`] refused its settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The process name is not a valid name.
    #[error("invalid process name: {0}")]
    Process(#[source] StoreError),
    /// Parallelism must be at least 1.
    #[error("parallelism must be at least 1")]
    Parallelism,
    /// The session TTL is too short for the safety margin: a worker gives its
    /// session up ttl − [`safety_margin`](super::safety_margin) after its last
    /// heartbeat was sent, and the margin (at least 250 ms) must leave room for
    /// a heartbeat and a retry. The least TTL is [`MIN_TTL`](super::MIN_TTL).
    #[error(
        "session ttl {0:?} is too short for the safety margin of {margin:?}: it must be at least {min:?}",
        margin = super::safety_margin(*.0),
        min = super::MIN_TTL
    )]
    Ttl(Duration),
    /// The session TTL is longer than a database keeps a session: it clamps
    /// the TTL to [`MAX_DELAY`](crate::backoff::MAX_DELAY) (180 days), as
    /// every duration it stores, and would give the session's leases away
    /// before this node's timer gave them up (DESIGN.md rule 6).
    #[error(
        "session ttl {0:?} is longer than a database keeps a session: it must be at most {max:?}",
        max = crate::backoff::MAX_DELAY
    )]
    TtlTooLong(Duration),
    /// A timeout or deadline of zero would cancel every run at once.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// The poll rate limit is impossible.
    #[error("invalid poll rate limit: {0}")]
    Poll(#[source] RateLimitError),
    /// A query source locks keys through the database, which this backend
    /// (a server's client) does not reach.
    #[error("a query source needs a backend on the database (a Store), not a server's client")]
    QueryNeedsStore,
}

/// Settings shared by the controller's parts. Built by [`ControllerBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) process: String,
    pub(crate) component: String,
    pub(crate) parallelism: usize,
    /// Leases held beyond the running ones.
    pub(crate) prefetch: usize,
    pub(crate) ttl: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) shutdown_deadline: Duration,
    pub(crate) idle_poll: Duration,
    pub(crate) backoff: Option<Backoff>,
    /// How often a controller on a database applies retention.
    pub(crate) prune_every: Duration,
}

impl Settings {
    /// Heartbeats run every TTL/3 (DESIGN.md rule 6).
    pub(crate) fn heartbeat_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Every node reclaims expired sessions about twice per TTL.
    pub(crate) fn reclaim_every(&self) -> Duration {
        self.ttl / 2
    }
}

/// Builds a [`Controller`]. Every setter documents its default and trade-off.
#[must_use]
pub struct ControllerBuilder<R, B = Store> {
    backend: B,
    reconciler: R,
    source: Source,
    settings: Settings,
    poll: (Duration, u32),
}

impl<R, B> std::fmt::Debug for ControllerBuilder<R, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerBuilder")
            .field("settings", &self.settings)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl<R: Reconciler, B: WorkerBackend> ControllerBuilder<R, B> {
    pub(crate) fn new(backend: B, process: impl Into<String>, reconciler: R) -> Self {
        Self {
            backend,
            reconciler,
            source: Source::Queue,
            settings: Settings {
                process: process.into(),
                component: "drover".into(),
                parallelism: 1,
                prefetch: 0,
                ttl: Duration::from_secs(10),
                timeout: None,
                shutdown_deadline: Duration::from_secs(30),
                idle_poll: Duration::from_secs(1),
                backoff: None,
                prune_every: Pruner::<Store>::EVERY,
            },
            poll: (Duration::from_millis(250), 8),
        }
    }

    /// Where keys come from. Default [`Source::Queue`]: keys enqueued in the store.
    /// A [`Source::Query`] needs a [`Store`] backend.
    pub fn source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// How many keys run at once in this controller. Default 1. More uses more
    /// database connections and more of the reconciler's downstream.
    pub fn parallelism(mut self, parallelism: usize) -> Self {
        self.settings.parallelism = parallelism;
        self
    }

    /// How many keys this controller may hold leased beyond those running:
    /// claimed ahead, so a run that ends is followed by the next without a
    /// database round trip, and claims come in bigger batches (fewer
    /// transactions per key). Default 0: claims only for free slots, so a key
    /// shown running is running. More raises throughput when reconciles are quick
    /// (the parallelism again roughly doubles a busy loop's batches),
    /// but a prefetched key waits here, leased, while another node might have
    /// run it, and a higher-priority key enqueued meanwhile starts after the
    /// prefetched ones; at shutdown unstarted keys go back to pending, and on
    /// session loss they are dropped here and reclaimed like any lost lease.
    pub fn prefetch(mut self, prefetch: usize) -> Self {
        self.settings.prefetch = prefetch;
        self
    }

    /// The name sessions are registered under (shown in history). Default
    /// `drover`.
    pub fn component(mut self, component: impl Into<String>) -> Self {
        self.settings.component = component.into();
        self
    }

    /// The session TTL. Default 10 s, at least [`MIN_TTL`](super::MIN_TTL)
    /// (750 ms), at most [`MAX_DELAY`](crate::backoff::MAX_DELAY) (180
    /// days); heartbeats every TTL/3. A shorter TTL makes a dead worker's
    /// keys run elsewhere sooner, at the cost of more heartbeats and a greater
    /// risk that a long GC pause or network blip loses the session.
    ///
    /// A worker cut off from the database cancels its runs ttl −
    /// [`safety_margin`](super::safety_margin) after its last successful
    /// heartbeat was sent, before the database can hand its keys to another
    /// worker.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// Cancels a reconcile that runs longer than this; the run counts as a
    /// transient failure. Default: no limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = Some(timeout);
        self
    }

    /// On shutdown, how long in-flight runs may finish before they are cancelled
    /// and their keys released (pending again). Default 30 s.
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.settings.shutdown_deadline = deadline;
        self
    }

    /// How often an idle controller looks for work without a wake-up (delayed and
    /// backing-off keys become ready without one). Default 1 s. Over HTTP an
    /// idle controller long-polls instead, for this long but at least 20 s (the
    /// server wakes the claim on enqueues and watches for delayed keys).
    pub fn idle_poll(mut self, every: Duration) -> Self {
        self.settings.idle_poll = every;
        self
    }

    /// The token bucket that paces polls which keep finding nothing. Default
    /// one per 250 ms with a burst of 8, like the BMDB control loop. Only an empty
    /// poll right after another empty one takes a token: a busy loop, or a
    /// wake-up that finds work, never waits for it, while an idle or starved loop
    /// (every wake-up lost to other nodes) cannot hammer the database.
    pub fn poll_rate(mut self, every: Duration, burst: u32) -> Self {
        self.poll = (every, burst);
        self
    }

    /// The process's backoff policy, written to the store at start so every node
    /// applies it. Default: leave the stored policy (1 s, ×2, 360 s if never set).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = Some(backoff);
        self
    }

    /// How often a controller on a database (a [`Store`] backend) applies every
    /// process's retention with a [`Pruner`]. Default 60 s (jittered ±10 %).
    /// Shorter keeps the history closer to its limits at the cost of more
    /// small transactions; every node prunes, so a fleet shares the work. A
    /// controller over HTTP never prunes: its server does.
    pub fn prune_every(mut self, every: Duration) -> Self {
        self.settings.prune_every = every;
        self
    }

    /// Checks the settings and builds the controller.
    pub fn build(self) -> Result<Controller<R, B>, ConfigError> {
        let s = &self.settings;
        if matches!(self.source, Source::Query(_)) && self.backend.local_store().is_none() {
            return Err(ConfigError::QueryNeedsStore);
        }
        validate_process(&s.process).map_err(ConfigError::Process)?;
        if s.parallelism == 0 {
            return Err(ConfigError::Parallelism);
        }
        if s.ttl < super::MIN_TTL {
            return Err(ConfigError::Ttl(s.ttl));
        }
        if s.ttl > crate::backoff::MAX_DELAY {
            return Err(ConfigError::TtlTooLong(s.ttl));
        }
        if s.timeout == Some(Duration::ZERO) {
            return Err(ConfigError::Zero("timeout"));
        }
        if s.shutdown_deadline.is_zero() {
            return Err(ConfigError::Zero("shutdown deadline"));
        }
        if s.idle_poll.is_zero() {
            return Err(ConfigError::Zero("idle poll"));
        }
        if s.prune_every.is_zero() {
            return Err(ConfigError::Zero("prune interval"));
        }
        let (every, burst) = self.poll;
        if every.is_zero() {
            return Err(ConfigError::Zero("poll interval"));
        }
        let poll = Bucket::new(1.0 / every.as_secs_f64(), burst).map_err(ConfigError::Poll)?;
        Ok(Controller::new(
            self.backend,
            Arc::new(self.reconciler),
            self.source,
            self.settings,
            poll,
        ))
    }
}
