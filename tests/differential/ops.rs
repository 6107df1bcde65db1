//! The operations a differential case is made of, how proptest draws (and
//! shrinks) sequences of them, and how a sequence prints.
//!
//! Times are whole units of [`UNIT`]: far longer than a case takes in real
//! time, so the engines' real clocks (which run on under the test offset)
//! never move a comparison across a boundary the model draws.

use std::fmt;
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;

/// One unit of time: delays, TTLs, backoffs and clock moves are whole units.
pub(crate) const UNIT: Duration = Duration::from_secs(60);

/// The clock moves this much before every call to a store, on every side,
/// so no two calls share a time (SQLite's clock counts milliseconds): keys
/// made ready by different calls never tie, on any side. (Keys made ready
/// by one call may: see [`Op::EnqueueEach`].)
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The rate limit's runs per second: one token per [`UNIT`], so a move of
/// the clock adds whole tokens and the real time a case takes adds a
/// hundredth of one at most.
pub(crate) const RATE_PER_S: f64 = 1.0 / 60.0;

/// The keys a case works on: few, so operations meet on the same key.
pub(crate) const KEYS: u8 = 4;

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Done,
    /// Requeue after this many units.
    RequeueAfter(u8),
    Transient,
    Permanent,
}

/// One store operation. Sessions and leases are named by their place among
/// those the case has started or been handed so far, newest first (`S0` is
/// the newest session; counting round, so any shrunk sequence stays
/// meaningful); with none yet, the operation is skipped on every side alike.
/// They print as `s0`, `l1`; a failure's trace says which session (`S2`, in
/// the order started) or lease (`L5`, in the order handed out) each named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Enqueue {
        key: u8,
        after: u8,
        priority: i32,
        bypass: bool,
    },
    /// Every key, one call each, a [`TICK`] apart. Not one call: within one
    /// call the engines order ties differently (PostgreSQL's
    /// `drover_enqueue` stamps a new key with the call's start and an
    /// existing one with the time it writes it, so new keys of a batch run
    /// before existing ones; SQLite stamps all alike, then goes by row id).
    EnqueueEach {
        after: u8,
        priority: i32,
    },
    Start {
        ttl: u8,
    },
    Heartbeat {
        session: u8,
    },
    Close {
        session: u8,
    },
    Claim {
        session: u8,
        max: u8,
    },
    Complete {
        lease: u8,
        end: End,
    },
    /// One completion batch (one transaction), each lease with its own end.
    Batch(Vec<(u8, End)>),
    Release {
        lease: u8,
    },
    /// `lease_lock` of one key, chosen by the caller.
    Lock {
        session: u8,
        key: u8,
    },
    /// Moves the database clock on by this many units.
    Advance(u8),
    Reclaim,
    Retry(u8),
    Park(u8),
    Delete(u8),
    Pause(bool),
    Limit(Option<u8>),
    /// Sets a rate limit of [`RATE_PER_S`] with this burst, or removes it.
    Rate(Option<u8>),
    /// Sets the process's retention: runs kept `keep` units and at most
    /// `per_key` a key; idle keys forgotten after `forget` units, or never.
    Retention {
        keep: u8,
        per_key: u8,
        forget: Option<u8>,
    },
    /// One whole retention pass in batches of `batch` rows (2 to 5: the
    /// engines take no fewer than 2), each batch going on from the cursor
    /// the one before returned, until one says the pass is done.
    Prune {
        batch: u8,
    },
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Done => write!(f, "done"),
            Self::RequeueAfter(u) => write!(f, "requeue_after {u}u"),
            Self::Transient => write!(f, "transient"),
            Self::Permanent => write!(f, "permanent"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Enqueue {
                key,
                after,
                priority,
                bypass,
            } => {
                write!(f, "enqueue k{key} after {after}u priority {priority}")?;
                if *bypass {
                    write!(f, " bypass_backoff")?;
                }
                Ok(())
            }
            Self::EnqueueEach { after, priority } => {
                write!(f, "enqueue each key after {after}u priority {priority}")
            }
            Self::Start { ttl } => write!(f, "start session ttl {ttl}u"),
            Self::Heartbeat { session } => write!(f, "heartbeat s{session}"),
            Self::Close { session } => write!(f, "close s{session}"),
            Self::Claim { session, max } => write!(f, "claim s{session} max {max}"),
            Self::Complete { lease, end } => write!(f, "complete l{lease} {end}"),
            Self::Batch(each) => {
                let each: Vec<String> = each.iter().map(|(l, e)| format!("l{l} {e}")).collect();
                write!(f, "complete batch [{}]", each.join(", "))
            }
            Self::Release { lease } => write!(f, "release l{lease}"),
            Self::Lock { session, key } => write!(f, "lock s{session} k{key}"),
            Self::Advance(u) => write!(f, "advance clock {u}u"),
            Self::Reclaim => write!(f, "reclaim"),
            Self::Retry(k) => write!(f, "retry k{k}"),
            Self::Park(k) => write!(f, "park k{k}"),
            Self::Delete(k) => write!(f, "delete k{k}"),
            Self::Pause(true) => write!(f, "pause"),
            Self::Pause(false) => write!(f, "resume"),
            Self::Limit(Some(n)) => write!(f, "limit concurrency {n}"),
            Self::Limit(None) => write!(f, "remove concurrency limit"),
            Self::Rate(Some(burst)) => write!(f, "rate limit 1/u burst {burst}"),
            Self::Rate(None) => write!(f, "remove rate limit"),
            Self::Retention {
                keep,
                per_key,
                forget,
            } => {
                write!(f, "retention: runs {keep}u, {per_key} a key, idle keys ")?;
                match forget {
                    Some(u) => write!(f, "{u}u"),
                    None => write!(f, "kept"),
                }
            }
            Self::Prune { batch } => write!(f, "prune in batches of {batch}"),
        }
    }
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        3 => Just(End::Done),
        1 => (0u8..3).prop_map(End::RequeueAfter),
        2 => Just(End::Transient),
        1 => Just(End::Permanent),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let session = 0u8..3;
    let lease = 0u8..5;
    prop_oneof![
        8 => (key.clone(), prop_oneof![3 => Just(0u8), 1 => 1u8..4], 0i32..3, prop::bool::weighted(0.15))
            .prop_map(|(key, after, priority, bypass)| Op::Enqueue { key, after, priority, bypass }),
        2 => (prop_oneof![3 => Just(0u8), 1 => 1u8..4], 0i32..3)
            .prop_map(|(after, priority)| Op::EnqueueEach { after, priority }),
        3 => (3u8..9).prop_map(|ttl| Op::Start { ttl }),
        2 => session.clone().prop_map(|session| Op::Heartbeat { session }),
        1 => session.clone().prop_map(|session| Op::Close { session }),
        7 => (session.clone(), 1u8..5).prop_map(|(session, max)| Op::Claim { session, max }),
        8 => (lease.clone(), end()).prop_map(|(lease, end)| Op::Complete { lease, end }),
        2 => vec((lease.clone(), end()), 1..4).prop_map(Op::Batch),
        1 => lease.prop_map(|lease| Op::Release { lease }),
        2 => (session.clone(), key.clone()).prop_map(|(session, key)| Op::Lock { session, key }),
        4 => (1u8..4).prop_map(Op::Advance),
        3 => Just(Op::Reclaim),
        1 => key.clone().prop_map(Op::Retry),
        1 => key.clone().prop_map(Op::Park),
        1 => key.prop_map(Op::Delete),
        1 => any::<bool>().prop_map(Op::Pause),
        1 => prop::option::of(1u8..3).prop_map(Op::Limit),
        1 => prop::option::of(1u8..4).prop_map(Op::Rate),
        1 => retention(),
        3 => (2u8..6).prop_map(|batch| Op::Prune { batch }),
    ]
}

/// Retention short enough for a case's clock (a few units) to pass it.
fn retention() -> impl Strategy<Value = Op> {
    (1u8..6, 1u8..4, prop::option::weighted(0.9, 1u8..4)).prop_map(|(keep, per_key, forget)| {
        Op::Retention {
            keep,
            per_key,
            forget,
        }
    })
}

/// A case: a session started, in some cases a rate or concurrency limit
/// and short retention set from the start (so that the limits meet many
/// claims, and prunes find runs and keys to remove, not only those after a
/// late change), then up to `max_ops` operations. One case in four is made
/// of [`rounds`] instead.
pub(crate) fn sequence(max_ops: usize) -> impl Strategy<Value = Ops> {
    let rate = prop::option::weighted(0.3, 1u8..4).prop_map(|b| b.map(|b| Op::Rate(Some(b))));
    let limit = prop::option::weighted(0.15, 1u8..3).prop_map(|n| n.map(|n| Op::Limit(Some(n))));
    let rules = prop::option::weighted(0.7, retention());
    let everything = (rate, limit, rules).prop_map(|(rate, limit, retention)| {
        [rate, limit, retention].into_iter().flatten().collect()
    });
    prop_oneof![
        3 => case(everything, max_ops),
        1 => rounds(max_ops),
    ]
}

/// A case of any operations after a session's start and the `settings`
/// drawn.
fn case(settings: impl Strategy<Value = Vec<Op>>, max_ops: usize) -> impl Strategy<Value = Ops> {
    let first = (3u8..9).prop_map(|ttl| Op::Start { ttl });
    (first, settings, vec(op(), 1..=max_ops)).prop_map(|(first, settings, rest)| {
        let mut ops = vec![first];
        ops.extend(settings);
        ops.extend(rest);
        Ops(ops)
    })
}

/// A case made of rounds of work, with retention set from the start: in
/// each round keys are enqueued, the newest session kept alive claims them
/// and some leases end, a key is locked (after runs, so locks meet parked,
/// backing-off and running keys, not only new ones), a few operations of any
/// kind come between, the clock moves on and a pass may run. With the whole mix few cases run
/// enough keys, far enough apart, for a pass to find runs past the period,
/// keys over the cap and idle keys to forget; these do.
fn rounds(max_ops: usize) -> impl Strategy<Value = Ops> {
    let enqueue = (0..KEYS, 0i32..3).prop_map(|(key, priority)| Op::Enqueue {
        key,
        after: 0,
        priority,
        bypass: false,
    });
    let complete = (0u8..4, end()).prop_map(|(lease, end)| Op::Complete { lease, end });
    let round = (
        vec(enqueue, 1..4),
        1u8..5,
        vec(complete, 0..4),
        0..KEYS,
        vec(op(), 0..3),
        0u8..4,
        prop::option::weighted(0.6, 2u8..6),
    )
        .prop_map(|(enqueues, max, completes, lock, others, advance, prune)| {
            let mut ops = enqueues;
            ops.push(Op::Heartbeat { session: 0 });
            ops.push(Op::Claim { session: 0, max });
            ops.extend(completes);
            ops.push(Op::Lock {
                session: 0,
                key: lock,
            });
            ops.extend(others);
            if advance > 0 {
                ops.push(Op::Advance(advance));
            }
            ops.extend(prune.map(|batch| Op::Prune { batch }));
            ops
        });
    let first = (6u8..9).prop_map(|ttl| Op::Start { ttl });
    (
        first,
        retention(),
        vec(round, 1..=max_ops.div_ceil(10).max(1)),
    )
        .prop_map(|(first, rules, rounds)| {
            let mut ops = vec![first, rules];
            ops.extend(rounds.into_iter().flatten());
            Ops(ops)
        })
}

/// A sequence of operations, printed one a line, numbered.
#[derive(Debug, Clone)]
pub(crate) struct Ops(pub Vec<Op>);

impl fmt::Display for Ops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, op) in self.0.iter().enumerate() {
            writeln!(f, "  #{n:<2} {op}")?;
        }
        Ok(())
    }
}
