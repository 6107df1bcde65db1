//! Property test: random sequences of add / add_after / add_with / add_rate_limited
//! / get / done / forget / clock advances, run against the real queue and against a
//! plain reference model (vectors and maps, scanned linearly); every observable
//! result must agree.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use drover::backoff::Backoff;
use drover::queue::rate_limit::ItemExponential;
use drover::queue::{AddOpts, Queue};
use proptest::prelude::*;

type Key = u8;

#[derive(Debug, Clone)]
enum Op {
    Add {
        key: Key,
        after_ms: u64,
        priority: i32,
        bypass: bool,
    },
    AddRateLimited(Key),
    Get,
    /// Done for the n-th held key (modulo how many are held).
    Done(usize),
    Forget(Key),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..5;
    prop_oneof![
        3 => (key.clone(), prop_oneof![Just(0u64), 1u64..60], -1i32..=1, any::<bool>())
            .prop_map(|(key, after_ms, priority, bypass)| Op::Add { key, after_ms, priority, bypass }),
        1 => key.clone().prop_map(Op::AddRateLimited),
        3 => Just(Op::Get),
        3 => any::<usize>().prop_map(Op::Done),
        1 => key.prop_map(Op::Forget),
        2 => (1u64..50).prop_map(Op::Advance),
    ]
}

/// How an add wants to run, as in the queue: priorities and bypass merge.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Want {
    priority: i32,
    bypass: bool,
}

impl Want {
    fn merge(self, other: Want) -> Want {
        Want {
            priority: self.priority.max(other.priority),
            bypass: self.bypass || other.bypass,
        }
    }
}

const PLAIN: Want = Want {
    priority: 0,
    bypass: false,
};

/// The reference: the queue's rules written as directly as possible.
#[derive(Debug, Default)]
struct Model {
    now: u64,
    seq: u64,
    /// (key, priority, seq): pop the highest priority, then the lowest seq.
    ready: Vec<(Key, i32, u64)>,
    processing: HashSet<Key>,
    dirty: HashMap<Key, Want>,
    /// key → (ready at, seq, want)
    waiting: HashMap<Key, (u64, u64, Want)>,
    not_before: HashMap<Key, u64>,
    failures: HashMap<Key, u32>,
}

impl Model {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn catch_up(&mut self) {
        let mut due: Vec<_> = self
            .waiting
            .iter()
            .filter(|(_, (at, _, _))| *at <= self.now)
            .map(|(k, (at, seq, want))| (*at, *seq, *k, *want))
            .collect();
        due.sort_unstable_by_key(|(at, seq, _, _)| (*at, *seq));
        for (_, _, key, want) in due {
            self.make_ready(key, want);
        }
    }

    fn ready_time(&mut self, key: Key, after: u64, bypass: bool) -> Option<u64> {
        let delayed = (after > 0).then_some(self.now + after);
        if bypass {
            return delayed;
        }
        match self.not_before.get(&key).copied() {
            Some(nb) if nb > self.now => Some(delayed.map_or(nb, |d| d.max(nb))),
            _ => {
                self.not_before.remove(&key);
                delayed
            }
        }
    }

    fn make_ready(&mut self, key: Key, want: Want) {
        self.waiting.remove(&key);
        if self.processing.contains(&key) {
            let merged = self.dirty.get(&key).map_or(want, |d| d.merge(want));
            self.dirty.insert(key, merged);
            return;
        }
        let seq = self.next_seq();
        match self.ready.iter_mut().find(|(k, _, _)| *k == key) {
            Some(slot) if slot.1 >= want.priority => {}
            Some(slot) => *slot = (key, want.priority, seq),
            None => self.ready.push((key, want.priority, seq)),
        }
    }

    fn schedule(&mut self, key: Key, at: u64, want: Want) {
        if self.ready.iter().any(|(k, _, _)| *k == key) || self.dirty.contains_key(&key) {
            return;
        }
        match self.waiting.get_mut(&key) {
            Some(w) if w.0 <= at => w.2 = w.2.merge(want),
            old => {
                let want = old.map_or(want, |w| w.2.merge(want));
                let seq = self.next_seq();
                self.waiting.insert(key, (at, seq, want));
            }
        }
    }

    fn add(&mut self, key: Key, after: u64, want: Want) {
        self.catch_up();
        match self.ready_time(key, after, want.bypass) {
            None => self.make_ready(key, want),
            Some(at) => self.schedule(key, at, want),
        }
    }

    fn add_rate_limited(&mut self, key: Key) {
        let failures = self.failures.entry(key).or_default();
        *failures += 1;
        let delay = (10u64 << (*failures - 1).min(3)).min(80);
        self.catch_up();
        let end = self.now + delay;
        let end = self.not_before.get(&key).map_or(end, |nb| (*nb).max(end));
        self.not_before.insert(key, end);
        let mut want = PLAIN;
        if let Some((at, _, w)) = self.waiting.get(&key).copied()
            && !w.bypass
            && at < end
        {
            want = want.merge(w);
            self.waiting.remove(&key);
        }
        self.schedule(key, end, want);
    }

    fn get(&mut self) -> Option<Key> {
        self.catch_up();
        let best = self
            .ready
            .iter()
            .enumerate()
            .max_by_key(|(_, (_, priority, seq))| (*priority, std::cmp::Reverse(*seq)))
            .map(|(i, _)| i)?;
        let (key, _, _) = self.ready.remove(best);
        self.processing.insert(key);
        Some(key)
    }

    fn done(&mut self, key: Key) {
        self.catch_up();
        self.processing.remove(&key);
        if let Some(want) = self.dirty.remove(&key) {
            match self.ready_time(key, 0, want.bypass) {
                None => self.make_ready(key, want),
                Some(at) => self.schedule(key, at, want),
            }
        }
    }

    fn forget(&mut self, key: Key) {
        self.failures.remove(&key);
        self.not_before.remove(&key);
    }

    fn len(&mut self) -> usize {
        self.catch_up();
        self.ready.len()
    }
}

fn queue() -> Queue<Key> {
    let backoff = Backoff::new(Duration::from_millis(10), 2.0, Duration::from_millis(80))
        .expect("a valid backoff");
    Queue::builder()
        .rate_limiter(ItemExponential::new(backoff))
        .build()
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let q = queue();
    let mut model = Model::default();
    let mut held: Vec<Key> = Vec::new();
    for op in ops {
        match op {
            Op::Add {
                key,
                after_ms,
                priority,
                bypass,
            } => {
                let mut opts = AddOpts::after(Duration::from_millis(after_ms)).priority(priority);
                if bypass {
                    opts = opts.bypass_backoff();
                }
                q.add_with(key, opts);
                model.add(key, after_ms, Want { priority, bypass });
            }
            Op::AddRateLimited(key) => {
                q.add_rate_limited(key);
                model.add_rate_limited(key);
                prop_assert_eq!(q.num_requeues(&key), model.failures[&key]);
            }
            Op::Get => {
                let expected = model.get();
                let got = if q.is_empty() { None } else { q.get().await };
                prop_assert_eq!(got, expected);
                held.extend(got);
            }
            Op::Done(n) if !held.is_empty() => {
                let key = held.swap_remove(n % held.len());
                q.done(&key);
                model.done(key);
            }
            Op::Done(_) => {}
            Op::Forget(key) => {
                q.forget(&key);
                model.forget(key);
                prop_assert_eq!(q.num_requeues(&key), 0);
            }
            Op::Advance(ms) => {
                tokio::time::advance(Duration::from_millis(ms)).await;
                model.now += ms;
            }
        }
        prop_assert_eq!(q.len(), model.len(), "ready keys after {:?}", model);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_queue_agrees_with_the_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a paused tokio runtime");
        rt.block_on(run(ops))?;
    }
}
