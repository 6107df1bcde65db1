//! The queue handle: the state machine of [`super::state`] behind one mutex, with
//! async `get` and wake-ups.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::AddOpts;
use super::lock::Lock;
use super::rate_limit::{RateLimiter, default_rate_limiter};
use super::state::{Change, LazyNow, State, Timing};
use crate::metrics::{InFlight, MetricsHandle, QueueMetrics};

/// A keyed workqueue: the client-go workqueue, async, with priorities and backoff
/// that plain adds respect.
///
/// Guarantees:
/// - a key is queued at most once: adding a queued key changes nothing (but may
///   raise its priority);
/// - a key is never handed out twice at once: between [`get`](Queue::get) and
///   [`done`](Queue::done) it is *processing*, and adds only mark it dirty;
/// - nothing is lost: a key added while processing is queued again exactly once
///   when `done` is called, however many adds came;
/// - a key waiting out a backoff from [`add_rate_limited`](Queue::add_rate_limited)
///   does not run early because of a plain add (use
///   [`AddOpts::bypass_backoff`] to force it).
///
/// Clones are cheap handles to the same queue, for many worker tasks.
pub struct Queue<K> {
    shared: Arc<Shared<K, parking_lot::Mutex<State<K>>>>,
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K> fmt::Debug for Queue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Default for Queue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Queue<K> {
    /// An unnamed queue (no metrics) with client-go's default rate limiter.
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder to name the queue (enabling metrics) or choose its rate limiter.
    pub fn builder() -> QueueBuilder<K> {
        QueueBuilder {
            name: None,
            limiter: None,
            metrics: None,
        }
    }

    /// Queues `key` to run now. Coalesces with a queued key, marks a processing key
    /// dirty, and respects the key's backoff. Ignored after shutdown.
    pub fn add(&self, key: K) {
        self.shared.add(key, AddOpts::default());
    }

    /// Queues `key` to run after `delay` (clamped to about six months). When the
    /// key is already waiting, the earlier ready time wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.shared.add(key, AddOpts::after(delay));
    }

    /// Queues `key` with explicit options: delay, priority, and whether to bypass
    /// its backoff.
    pub fn add_with(&self, key: K, opts: AddOpts) {
        self.shared.add(key, opts);
    }

    /// Records a failure of `key` with the rate limiter and queues it when the
    /// limiter's delay has passed. Until then, plain adds of `key` do not run it.
    /// Ignored after shutdown (the limiter still records the failure, as
    /// client-go's does), and then not counted in `workqueue_retries_total`.
    pub fn add_rate_limited(&self, key: K) {
        self.shared.add_rate_limited(key);
    }

    /// Forgets `key`'s failures (call it when `key` succeeded): the rate limiter
    /// starts over and the key's backoff ends.
    pub fn forget(&self, key: &K) {
        self.shared.forget(key);
    }

    /// How many failures of `key` the rate limiter has recorded.
    #[must_use]
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.shared.limiter.num_requeues(key)
    }

    /// Waits for the next key, highest priority first, FIFO within a priority.
    /// Returns `None` once the queue is shut down and no queued key is left.
    ///
    /// Cancel-safe: dropping the future hands out nothing.
    pub async fn get(&self) -> Option<K> {
        self.shared.get().await
    }

    /// Ends processing of `key`. If it was added while processing, it is queued
    /// again now (or when its backoff ends). Unknown keys are ignored.
    pub fn done(&self, key: &K) {
        self.shared.done(key);
    }

    /// Stops the queue: adds are ignored, delayed keys are dropped, and `get`
    /// hands out what is queued, then returns `None`. A key added while it was
    /// processing is still queued at its `done`, unless it is backing off: then
    /// it is delayed, and dropped too.
    pub fn shut_down(&self) {
        self.shared.shut_down();
    }

    /// Like [`shut_down`](Queue::shut_down), then waits until every key handed out
    /// is `done`.
    pub async fn shut_down_with_drain(&self) {
        self.shared.shut_down();
        self.shared.drain().await;
    }

    /// Whether [`shut_down`](Queue::shut_down) was called.
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.shared.is_shutting_down()
    }

    /// Keys ready to be handed out now (not those processing or delayed).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// Whether no key is ready to be handed out now.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Builds a [`Queue`]; every setting has a default.
#[must_use]
pub struct QueueBuilder<K> {
    name: Option<String>,
    limiter: Option<Arc<dyn RateLimiter<K>>>,
    metrics: Option<QueueMetrics>,
}

impl<K> fmt::Debug for QueueBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> QueueBuilder<K> {
    /// Names the queue, which turns on its metrics (label `name`), in
    /// [`QueueMetrics::global`] unless [`metrics`](Self::metrics) picks another
    /// registry. Default: unnamed, no metrics, no clock reads on the hot path.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Reports the metrics of this (named) queue to `metrics`.
    pub fn metrics(mut self, metrics: &QueueMetrics) -> Self {
        self.metrics = Some(metrics.clone());
        self
    }

    /// The rate limiter behind [`Queue::add_rate_limited`]. Default: client-go's,
    /// per-key exponential 5 ms → 1000 s, and a global 10 qps / burst 100 bucket.
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<K> + 'static) -> Self {
        self.limiter = Some(Arc::new(limiter));
        self
    }

    /// Builds the queue.
    pub fn build(self) -> Queue<K> {
        let metrics = self.name.as_ref().map(|name| {
            let registry = self
                .metrics
                .unwrap_or_else(|| QueueMetrics::global().clone());
            (registry.handle(name), registry)
        });
        let shared = Arc::new(Shared::new(
            self.name,
            self.limiter
                .unwrap_or_else(|| Arc::new(default_rate_limiter())),
            metrics.as_ref().map(|(handle, _)| handle.clone()),
        ));
        if let Some((_, registry)) = metrics {
            let weak: std::sync::Weak<dyn InFlight> = Arc::downgrade(&shared) as _;
            registry.track(weak);
        }
        Queue { shared }
    }
}

/// The queue's shared core, generic over its lock so the model-checking tests run
/// this very code under shuttle.
pub(crate) struct Shared<K, L> {
    state: L,
    /// Wakes one waiting `get` per key that became ready (only while one is
    /// counted as waiting: [`State::has_waiters`]); all of them at shutdown.
    ready: Notify,
    /// Wakes `shut_down_with_drain` when the last processing key is done.
    drained: Notify,
    limiter: Arc<dyn RateLimiter<K>>,
    metrics: Option<MetricsHandle>,
    name: Option<String>,
    _keys: PhantomData<fn() -> K>,
}

impl<K: Clone + Eq + Hash + Send, L: Lock<State<K>>> Shared<K, L> {
    pub(crate) fn new(
        name: Option<String>,
        limiter: Arc<dyn RateLimiter<K>>,
        metrics: Option<MetricsHandle>,
    ) -> Self {
        Self {
            state: L::new(State::new(metrics.is_some())),
            ready: Notify::new(),
            drained: Notify::new(),
            limiter,
            metrics,
            name,
            _keys: PhantomData,
        }
    }

    /// Runs one state operation under the lock, then wakes and counts outside it.
    fn with_state<R>(&self, op: impl FnOnce(&mut State<K>, &mut LazyNow) -> (R, Change)) -> R {
        let mut now = LazyNow::default();
        let (result, change, promoted, depth, waiters) = {
            let mut state = self.state.lock();
            let (result, change) = op(&mut state, &mut now);
            let waiters = state.has_waiters();
            (result, change, state.take_promoted(), state.len(), waiters)
        };
        self.state.after_unlock();
        let wake = matches!(
            change,
            Change::Queued | Change::Requeued | Change::Scheduled { earliest: true }
        );
        if waiters && (wake || promoted.0 > 0) {
            self.ready.notify_one();
        }
        if let Some(m) = &self.metrics {
            let adds = promoted.0 + promoted.1 + usize::from(change.is_add());
            if adds > 0 {
                m.adds.inc_by(adds as u64);
            }
            m.depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
        }
        result
    }

    pub(crate) fn add(&self, key: K, opts: AddOpts) {
        self.with_state(|state, now| ((), state.add(key, opts, now)));
    }

    fn add_rate_limited(&self, key: K) {
        let delay = self.limiter.when(&key);
        // After shutdown the add is ignored, so it is no retry (as in client-go).
        let accepted = self.with_state(|state, now| {
            let accepted = !state.is_shutting_down();
            (accepted, state.add_backoff(key, delay, now))
        });
        if let (true, Some(m)) = (accepted, &self.metrics) {
            m.retries.inc();
        }
    }

    fn forget(&self, key: &K) {
        self.limiter.forget(key);
        self.with_state(|state, now| {
            state.forget(key, now);
            ((), Change::Unchanged)
        });
    }

    /// Ready keys, after moving those whose delay has passed into the queue.
    pub(crate) fn len(&self) -> usize {
        self.with_state(|state, now| {
            state.catch_up(now);
            (state.len(), Change::Unchanged)
        })
    }

    fn is_shutting_down(&self) -> bool {
        self.state.lock().is_shutting_down()
    }

    pub(crate) async fn get(&self) -> Option<K> {
        // A ready key needs no wake-up registration: look once without one.
        if let Some((key, timing, more)) = self.with_state(|state, now| {
            let got = state
                .pop(now)
                .map(|(key, timing)| (key, timing, state.more()));
            (got, Change::Unchanged)
        }) {
            self.handed_out(more, timing);
            return Some(key);
        }
        loop {
            let mut notified = pin!(self.ready.notified());
            let attempt = self.with_state(|state, now| {
                if let Some((key, timing)) = state.pop(now) {
                    return (Attempt::Got(key, timing, state.more()), Change::Unchanged);
                }
                if state.is_shutting_down() {
                    return (Attempt::Closed, Change::Unchanged);
                }
                // Registered and counted while the lock is held: an add after
                // the unlock sees the count and wakes us.
                notified.as_mut().enable();
                state.add_waiter();
                (Attempt::Wait(state.next_timer()), Change::Unchanged)
            });
            // Uncounts the wait however it ends, the future's drop included.
            let mut waiting = matches!(attempt, Attempt::Wait(_)).then(|| Waiting {
                shared: self,
                woke: false,
            });
            match attempt {
                Attempt::Got(key, timing, more) => {
                    self.handed_out(more, timing);
                    return Some(key);
                }
                Attempt::Closed => return None,
                Attempt::Wait(Some(at)) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                Attempt::Wait(None) => notified.await,
            }
            if let Some(waiting) = waiting.as_mut() {
                waiting.woke = true;
            }
        }
    }

    /// After a hand-out: pass the wake-up on if more keys are ready and another
    /// `get` waits (a timer may have made several ready at once), and record
    /// the wait.
    fn handed_out(&self, more: bool, timing: Timing) {
        if more {
            self.ready.notify_one();
        }
        if let (Some(m), Some(waited)) = (&self.metrics, timing.waited) {
            m.queue_duration.observe(waited.as_secs_f64());
        }
    }

    pub(crate) fn done(&self, key: &K) {
        let (timing, idle) = self.with_state(|state, now| {
            let Some((change, timing)) = state.done(key, now) else {
                return ((None, false), Change::Unchanged);
            };
            let idle = state.is_shutting_down() && state.processing() == 0;
            ((Some(timing), idle), change)
        });
        if let (Some(m), Some(worked)) = (&self.metrics, timing.and_then(|t| t.worked)) {
            m.work_duration.observe(worked.as_secs_f64());
        }
        if idle {
            self.drained.notify_waiters();
        }
    }

    pub(crate) fn shut_down(&self) {
        self.with_state(|state, now| {
            state.shut_down(now);
            ((), Change::Unchanged)
        });
        self.ready.notify_waiters();
    }

    async fn drain(&self) {
        loop {
            let mut drained = pin!(self.drained.notified());
            {
                let state = self.state.lock();
                if state.processing() == 0 {
                    return;
                }
                drained.as_mut().enable();
            }
            drained.await;
        }
    }
}

/// A `get` counted among the waiters ([`State::add_waiter`]) until dropped.
struct Waiting<'a, K: Clone + Eq + Hash + Send, L: Lock<State<K>>> {
    shared: &'a Shared<K, L>,
    /// The wait ended (woken or timed out) rather than the future being dropped.
    woke: bool,
}

impl<K: Clone + Eq + Hash + Send, L: Lock<State<K>>> Drop for Waiting<'_, K, L> {
    fn drop(&mut self) {
        let pass_on = {
            let mut state = self.shared.state.lock();
            state.remove_waiter();
            // Only one waiting `get` is woken to sleep until a new earliest
            // timer; the others may wait for a wake-up alone. If that one is
            // dropped mid-wait, wake another to take the timer over, or the
            // key would wait for some unrelated add.
            !self.woke && state.has_waiters() && state.next_timer().is_some()
        };
        self.shared.state.after_unlock();
        if pass_on {
            self.shared.ready.notify_one();
        }
    }
}

/// What one look at the state found for a `get`.
enum Attempt<K> {
    /// A key, its timing, and whether more are ready for a waiting `get`.
    Got(K, Timing, bool),
    /// Shut down and empty.
    Closed,
    /// Nothing ready: wait for a wake-up, or until the next timer.
    Wait(Option<Instant>),
}

impl<K: Clone + Eq + Hash + Send, L: Lock<State<K>>> InFlight for Shared<K, L> {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    fn in_flight(&self) -> (f64, f64) {
        self.state.lock().in_flight(Instant::now())
    }
}
