//! The queue's state machine: every rule of the workqueue, with no locking and no
//! waiting. [`super::workqueue`] wraps it in one mutex and adds async `get`.
//!
//! A key lives in `entries` while it is queued, being processed, waiting for a
//! delay, or inside a backoff; a key in none of these has no entry. The ready
//! queue and the delay heap hold copies of keys tagged with a generation: when an
//! entry moves (a priority rises, a delay is replaced) the old copy goes stale and
//! is skipped when it surfaces, so no operation searches a queue.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use foldhash::fast::RandomState;
use tokio::time::Instant;

use super::AddOpts;
use crate::backoff::clamp_delay;

/// Reads the clock at most once per operation, and only if the operation needs it:
/// the plain add/get/done path never does.
#[derive(Debug, Default)]
pub(crate) struct LazyNow(Option<Instant>);

impl LazyNow {
    pub(crate) fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// What an operation changed, so the async layer knows whom to wake and what to
/// count after the lock is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing new to hand out (coalesced, rejected, or only reprioritised).
    Unchanged,
    /// A key entered the ready queue: wake one waiting `get`.
    Queued,
    /// A key being processed was marked to run once more after `done`.
    Dirty,
    /// `done` queued a key that was marked dirty: wake one waiting `get`, but do
    /// not count an add again — client-go counts the add that marked it dirty.
    Requeued,
    /// A key now waits for a time; `earliest` when it is the next timer of all, so
    /// a sleeping `get` must recompute its deadline.
    Scheduled {
        /// The new timer is the earliest one.
        earliest: bool,
    },
}

impl Change {
    /// Whether this change counts as an add in `workqueue_adds_total`.
    pub(crate) fn is_add(self) -> bool {
        matches!(self, Change::Queued | Change::Dirty)
    }
}

/// Timing facts for metrics, returned by `pop` and `done`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Timing {
    /// How long the key waited in the ready queue (metrics only).
    pub(crate) waited: Option<Duration>,
    /// How long the key was processed (metrics only).
    pub(crate) worked: Option<Duration>,
}

/// How an add wants to run: its priority and whether it ignores the backoff.
#[derive(Debug, Clone, Copy)]
struct Pending {
    priority: i32,
    bypass: bool,
}

impl Pending {
    const PLAIN: Pending = Pending {
        priority: 0,
        bypass: false,
    };

    /// Two adds of one key coalesce to the higher priority and the more urgent
    /// backoff choice.
    fn merge(self, other: Pending) -> Pending {
        Pending {
            priority: self.priority.max(other.priority),
            bypass: self.bypass || other.bypass,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    generation: u64,
    priority: i32,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    at: Instant,
    generation: u64,
    pending: Pending,
}

/// Everything the queue knows about one key.
#[derive(Debug, Default)]
struct Entry {
    queued: Option<Slot>,
    processing: bool,
    /// Added while processing: `done` queues it once more.
    dirty: Option<Pending>,
    waiting: Option<Waiting>,
    /// The end of the backoff set by the last rate-limited add.
    not_before: Option<Instant>,
    /// When the key became ready (metrics only).
    ready_since: Option<Instant>,
    /// When processing started (metrics only).
    started: Option<Instant>,
}

impl Entry {
    /// The time a non-bypassing add made now, delayed by `after`, may run, or
    /// `None` for "now". An expired backoff is forgotten on the way.
    fn ready_time(&mut self, after: Duration, bypass: bool, now: &mut LazyNow) -> Option<Instant> {
        let delayed = (!after.is_zero()).then(|| now.get() + after);
        if bypass {
            return delayed;
        }
        let Some(not_before) = self.not_before else {
            return delayed;
        };
        if not_before <= now.get() {
            self.not_before = None;
            return delayed;
        }
        Some(delayed.map_or(not_before, |at| at.max(not_before)))
    }

    fn is_idle(&mut self, now: &mut LazyNow) -> bool {
        if self.queued.is_some() || self.processing || self.waiting.is_some() {
            return false;
        }
        match self.not_before {
            Some(at) => at <= now.get(),
            None => true,
        }
    }
}

/// Ready keys by priority, highest first, FIFO within a priority.
///
/// A handful of priorities is the norm, so a short sorted list of buckets beats a
/// tree: the common case is one bucket and one `VecDeque` push or pop.
#[derive(Debug)]
struct ReadyQueue<K> {
    buckets: Vec<(i32, VecDeque<(K, u64)>)>,
    /// Places in all buckets, stale ones (left by a raised priority) included.
    slots: usize,
}

impl<K> ReadyQueue<K> {
    /// Empty buckets are kept for reuse, but only this many in all.
    const MAX_BUCKETS: usize = 8;

    fn push(&mut self, key: K, generation: u64, priority: i32) {
        let index = self.buckets.partition_point(|(p, _)| *p > priority);
        let index = match self.buckets.get(index) {
            Some((p, _)) if *p == priority => index,
            _ if self.buckets.len() >= Self::MAX_BUCKETS => {
                self.buckets.retain(|(_, slots)| !slots.is_empty());
                let index = self.buckets.partition_point(|(p, _)| *p > priority);
                self.buckets.insert(index, (priority, VecDeque::new()));
                index
            }
            _ => {
                self.buckets.insert(index, (priority, VecDeque::new()));
                index
            }
        };
        self.buckets[index].1.push_back((key, generation));
        self.slots += 1;
    }

    fn pop(&mut self) -> Option<(K, u64)> {
        let slot = self
            .buckets
            .iter_mut()
            .find_map(|(_, slots)| slots.pop_front());
        if slot.is_some() {
            self.slots -= 1;
        }
        slot
    }

    /// Keeps only the places `live` accepts, and drops empty buckets.
    fn retain(&mut self, mut live: impl FnMut(&K, u64) -> bool) {
        for (_, slots) in &mut self.buckets {
            slots.retain(|(key, generation)| live(key, *generation));
        }
        self.buckets.retain(|(_, slots)| !slots.is_empty());
        self.slots = self.buckets.iter().map(|(_, slots)| slots.len()).sum();
    }
}

/// A timer in the delay heap; ordered so the earliest pops first.
#[derive(Debug)]
struct Timer<K> {
    at: Instant,
    generation: u64,
    key: K,
}

impl<K> PartialEq for Timer<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<K> Eq for Timer<K> {}
impl<K> PartialOrd for Timer<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Timer<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.generation).cmp(&(self.at, self.generation))
    }
}

/// The queues, apart from the entries so both can be borrowed at once.
#[derive(Debug)]
struct Lanes<K> {
    ready: ReadyQueue<K>,
    timers: BinaryHeap<Timer<K>>,
    live_timers: usize,
    next_generation: u64,
    depth: usize,
    track_times: bool,
}

impl<K: Clone> Lanes<K> {
    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    fn clear_waiting(&mut self, entry: &mut Entry) {
        if entry.waiting.take().is_some() {
            self.live_timers -= 1;
        }
    }

    /// The key should run now: queue it, mark it dirty, or raise its priority.
    fn make_ready(
        &mut self,
        entry: &mut Entry,
        key: K,
        pending: Pending,
        now: &mut LazyNow,
    ) -> Change {
        self.clear_waiting(entry);
        if entry.processing {
            let first = entry.dirty.is_none();
            entry.dirty = Some(entry.dirty.map_or(pending, |d| d.merge(pending)));
            return if first {
                Change::Dirty
            } else {
                Change::Unchanged
            };
        }
        match entry.queued {
            Some(slot) if slot.priority >= pending.priority => Change::Unchanged,
            Some(_) => {
                self.enqueue(entry, key, pending.priority);
                Change::Unchanged
            }
            None => {
                self.enqueue(entry, key, pending.priority);
                self.depth += 1;
                if self.track_times {
                    entry.ready_since = Some(now.get());
                }
                Change::Queued
            }
        }
    }

    fn enqueue(&mut self, entry: &mut Entry, key: K, priority: i32) {
        let generation = self.generation();
        entry.queued = Some(Slot {
            generation,
            priority,
        });
        self.ready.push(key, generation, priority);
    }

    /// The key should run at `at`: start a timer unless it runs sooner anyway.
    fn schedule(&mut self, entry: &mut Entry, key: K, at: Instant, pending: Pending) -> Change {
        if entry.queued.is_some() || entry.dirty.is_some() {
            return Change::Unchanged;
        }
        if let Some(waiting) = entry.waiting.as_mut()
            && waiting.at <= at
        {
            waiting.pending = waiting.pending.merge(pending);
            return Change::Unchanged;
        }
        let pending = entry.waiting.map_or(pending, |w| w.pending.merge(pending));
        self.clear_waiting(entry);
        let generation = self.generation();
        entry.waiting = Some(Waiting {
            at,
            generation,
            pending,
        });
        self.live_timers += 1;
        let earliest = self.timers.peek().is_none_or(|top| at < top.at);
        self.timers.push(Timer {
            at,
            generation,
            key,
        });
        Change::Scheduled { earliest }
    }
}

/// The whole state of one queue. Not thread-safe by itself: the queue holds it in
/// one mutex, so every method here is one atomic step.
#[derive(Debug)]
pub(crate) struct State<K> {
    /// foldhash rather than SipHash: keys come from the user's own system, and
    /// hashing is most of the hot path; each queue still gets a random seed.
    entries: HashMap<K, Entry, RandomState>,
    lanes: Lanes<K>,
    processing: usize,
    shutting_down: bool,
    /// Keys that timers made ready (queued, dirty) since the last `take_promoted`.
    promoted: (usize, usize),
    /// `get` calls registered for a wake-up (see [`State::add_waiter`]).
    waiters: usize,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// An empty state; `track_times` records the timestamps metrics need.
    pub(crate) fn new(track_times: bool) -> Self {
        Self {
            entries: HashMap::with_hasher(RandomState::default()),
            lanes: Lanes {
                ready: ReadyQueue {
                    buckets: Vec::new(),
                    slots: 0,
                },
                timers: BinaryHeap::new(),
                live_timers: 0,
                next_generation: 0,
                depth: 0,
                track_times,
            },
            processing: 0,
            shutting_down: false,
            promoted: (0, 0),
            waiters: 0,
        }
    }

    /// Counts a `get` that found nothing and registered for a wake-up under
    /// this lock; the queue wakes only while one is counted, so a key added to
    /// a busy queue (every worker working) costs no wake-up at all.
    pub(crate) fn add_waiter(&mut self) {
        self.waiters += 1;
    }

    /// Uncounts a `get` whose wait ended (woken, timed out or dropped).
    pub(crate) fn remove_waiter(&mut self) {
        self.waiters -= 1;
    }

    /// Whether keys are ready and some `get` waits for them: after a hand-out,
    /// the wake-up to pass on.
    pub(crate) fn more(&self) -> bool {
        self.lanes.depth > 0 && self.waiters > 0
    }

    /// Whether some `get` is waiting for a wake-up.
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiters > 0
    }

    /// Keys ready to be handed out.
    pub(crate) fn len(&self) -> usize {
        self.lanes.depth
    }

    /// Keys handed out and not yet done.
    pub(crate) fn processing(&self) -> usize {
        self.processing
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Places in the ready queue, live or stale, counted (and checked against
    /// the running count).
    #[cfg(test)]
    pub(crate) fn ready_slots(&self) -> usize {
        let ready = &self.lanes.ready;
        let counted = ready.buckets.iter().map(|(_, slots)| slots.len()).sum();
        assert_eq!(ready.slots, counted, "the running count is off");
        counted
    }

    /// The next timer, for a waiting `get` to sleep until.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        self.lanes.timers.peek().map(|t| t.at)
    }

    /// Adds `key` with `opts`. After shutdown, adds are ignored.
    pub(crate) fn add(&mut self, key: K, opts: AddOpts, now: &mut LazyNow) -> Change {
        if self.shutting_down {
            return Change::Unchanged;
        }
        self.catch_up(now);
        let pending = Pending {
            priority: opts.priority,
            bypass: opts.bypass_backoff,
        };
        let slot = self.entries.entry(key);
        let key = slot.key().clone();
        let entry = slot.or_default();
        let change = match entry.ready_time(clamp_delay(opts.after), pending.bypass, now) {
            None => self.lanes.make_ready(entry, key, pending, now),
            Some(at) => self.lanes.schedule(entry, key, at, pending),
        };
        self.compact_timers();
        self.compact_ready();
        change
    }

    /// Starts a backoff of `delay` for `key` and schedules it to run when the
    /// backoff ends. Adds that do not bypass the backoff cannot run the key before
    /// then; a key already queued keeps its place (it runs soon anyway).
    pub(crate) fn add_backoff(&mut self, key: K, delay: Duration, now: &mut LazyNow) -> Change {
        if self.shutting_down {
            return Change::Unchanged;
        }
        self.catch_up(now);
        let slot = self.entries.entry(key);
        let key = slot.key().clone();
        let entry = slot.or_default();
        let end = now.get() + clamp_delay(delay);
        let end = entry.not_before.map_or(end, |old| old.max(end));
        entry.not_before = Some(end);
        let mut pending = Pending::PLAIN;
        if let Some(w) = entry.waiting.filter(|w| !w.pending.bypass && w.at < end) {
            pending = pending.merge(w.pending);
            self.lanes.clear_waiting(entry);
        }
        let change = self.lanes.schedule(entry, key, end, pending);
        self.compact_timers();
        change
    }

    /// Moves every key whose timer has passed into the ready queue (or marks it
    /// dirty), in timer order. Every operation does this first, so a timer that
    /// fired ranks before keys added after it, as if it had a thread of its own.
    pub(crate) fn catch_up(&mut self, now: &mut LazyNow) {
        while let Some(top) = self.lanes.timers.peek() {
            if top.at > now.get() {
                break;
            }
            let Some(timer) = self.lanes.timers.pop() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&timer.key) else {
                continue;
            };
            let Some(waiting) = entry.waiting.filter(|w| w.generation == timer.generation) else {
                continue;
            };
            match self
                .lanes
                .make_ready(entry, timer.key, waiting.pending, now)
            {
                Change::Queued => {
                    self.promoted.0 += 1;
                    // Ready since its timer, not since this (perhaps much later)
                    // look: the wait between is queue time for the metrics.
                    if self.lanes.track_times {
                        entry.ready_since = Some(timer.at);
                    }
                }
                Change::Dirty => self.promoted.1 += 1,
                _ => {}
            }
        }
    }

    /// How many keys timers made ready (queued, dirty) since the last call.
    pub(crate) fn take_promoted(&mut self) -> (usize, usize) {
        std::mem::take(&mut self.promoted)
    }

    /// Hands out the next ready key, highest priority first, marking it processing.
    pub(crate) fn pop(&mut self, now: &mut LazyNow) -> Option<(K, Timing)> {
        self.catch_up(now);
        while let Some((key, generation)) = self.lanes.ready.pop() {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            if entry.queued.map(|s| s.generation) != Some(generation) {
                continue;
            }
            entry.queued = None;
            entry.processing = true;
            self.lanes.depth -= 1;
            self.processing += 1;
            let mut timing = Timing::default();
            if self.lanes.track_times {
                let at = now.get();
                timing.waited = entry.ready_since.take().map(|t| at - t);
                entry.started = Some(at);
            }
            return Some((key, timing));
        }
        None
    }

    /// Ends processing of `key`; a dirty key is added once more (after shutdown,
    /// only if it may run now: a delayed one is dropped). Returns `None` if `key`
    /// was not being processed.
    pub(crate) fn done(&mut self, key: &K, now: &mut LazyNow) -> Option<(Change, Timing)> {
        self.catch_up(now);
        let entry = self.entries.get_mut(key).filter(|e| e.processing)?;
        entry.processing = false;
        self.processing -= 1;
        let mut timing = Timing::default();
        if let Some(started) = entry.started.take() {
            timing.worked = Some(now.get() - started);
        }
        let change = match entry.dirty.take() {
            None => Change::Unchanged,
            Some(pending) => match entry.ready_time(Duration::ZERO, pending.bypass, now) {
                None => match self.lanes.make_ready(entry, key.clone(), pending, now) {
                    Change::Queued => Change::Requeued,
                    change => change,
                },
                // Delayed by its backoff after shutdown: dropped, as shutdown
                // drops every delayed key (no timer may hand it out once `get`
                // has returned `None`).
                Some(_) if self.shutting_down => Change::Unchanged,
                Some(at) => self.lanes.schedule(entry, key.clone(), at, pending),
            },
        };
        if entry.is_idle(now) {
            self.entries.remove(key);
        }
        Some((change, timing))
    }

    /// Ends `key`'s backoff, so plain adds may run it at once again.
    pub(crate) fn forget(&mut self, key: &K, now: &mut LazyNow) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.not_before = None;
            if entry.is_idle(now) {
                self.entries.remove(key);
            }
        }
    }

    /// Stops accepting adds and drops every delayed key; queued and processing
    /// keys stay, so `get` can drain them and `done` can still re-queue dirty ones.
    pub(crate) fn shut_down(&mut self, now: &mut LazyNow) {
        self.shutting_down = true;
        self.lanes.timers.clear();
        self.lanes.live_timers = 0;
        self.entries.retain(|_, entry| {
            entry.waiting = None;
            !entry.is_idle(now)
        });
    }

    /// Sum and maximum of the processing time of the keys now processing.
    pub(crate) fn in_flight(&self, now: Instant) -> (f64, f64) {
        self.entries
            .values()
            .filter_map(|e| e.started)
            .map(|started| (now - started).as_secs_f64())
            .fold((0.0, 0.0), |(sum, max), secs| {
                (sum + secs, f64::max(max, secs))
            })
    }

    /// Drops stale places in the ready queue once they outnumber the live ones, so
    /// raising a queued key's priority over and over (each raise leaves its old
    /// place behind) cannot grow the queue without bound.
    fn compact_ready(&mut self) {
        let ready = &mut self.lanes.ready;
        if ready.slots <= 2 * self.lanes.depth + 64 {
            return;
        }
        let entries = &self.entries;
        ready.retain(|key, generation| {
            entries
                .get(key)
                .and_then(|e| e.queued)
                .is_some_and(|slot| slot.generation == generation)
        });
    }

    /// Drops stale timers once they outnumber the live ones, so replacing a delay
    /// over and over cannot grow the heap without bound.
    fn compact_timers(&mut self) {
        let lanes = &mut self.lanes;
        if lanes.timers.len() <= 2 * lanes.live_timers + 64 {
            return;
        }
        let entries = &self.entries;
        lanes.timers.retain(|t| {
            entries
                .get(&t.key)
                .and_then(|e| e.waiting)
                .is_some_and(|w| w.generation == t.generation)
        });
    }
}
