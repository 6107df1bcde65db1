//! The operations on the model store (`tests/sim/model.rs`), on a clock the
//! case moves by hand: what every engine must answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use drover::backoff::Backoff;
use drover::store::{Lease, Outcome, Retention, StoreError};

use crate::aliases::Aliases;
use crate::log::Log;
use crate::model::{Model, State};
use crate::ops::{End, KEYS, Op, RATE_PER_S, TICK, UNIT};
use crate::view::{Answer, Gate, ItemView, Refusal, Snapshot};

/// The model of one case.
pub(crate) struct OnModel {
    model: Model,
    /// The model's clock, in milliseconds.
    ms: Arc<AtomicU64>,
    pub aliases: Aliases,
}

/// What a run's end is, as an outcome (the errors' words are the engines').
pub(crate) fn outcome(end: End) -> Outcome {
    match end {
        End::Done => Outcome::Done,
        End::RequeueAfter(u) => Outcome::RequeueAfter(UNIT * u32::from(u)),
        End::Transient => Outcome::Transient("boom".into()),
        End::Permanent => Outcome::Permanent("bad spec".into()),
    }
}

/// The retention an [`Op::Retention`] sets.
pub(crate) fn retention(keep: u8, per_key: u8, forget: Option<u8>) -> Retention {
    Retention {
        keep_runs_for: UNIT * u32::from(keep),
        keep_runs_per_key: u32::from(per_key),
        forget_idle_after: forget.map(|u| UNIT * u32::from(u)),
    }
}

/// Key `k{n}`.
pub(crate) fn key(n: u8) -> String {
    format!("k{}", n % KEYS)
}

fn refused(result: Result<(), StoreError>) -> Result<(), Refusal> {
    result.map_err(|e| Refusal::of(&e).expect("the model only refuses"))
}

impl OnModel {
    pub(crate) fn new(backoff: Backoff) -> Self {
        let ms = Arc::new(AtomicU64::new(0));
        Self {
            model: Model::new(Log::manual(Arc::clone(&ms)), backoff),
            ms,
            aliases: Aliases::default(),
        }
    }

    /// Moves the clock on by `by`.
    pub(crate) fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).expect("a short move");
        self.ms.fetch_add(ms, Ordering::SeqCst);
    }

    pub(crate) fn apply(&mut self, op: &Op) -> Answer {
        match op {
            Op::Enqueue {
                key: k,
                after,
                priority,
                bypass,
            } => {
                let (k, m) = (key(*k), &mut self.model);
                let dirty = m.items.get(&k).is_some_and(|i| i.state == State::Running);
                m.enqueue_with(&k, UNIT * u32::from(*after), *priority, *bypass);
                Answer::Enqueued {
                    dirty: u64::from(dirty),
                }
            }
            Op::EnqueueEach { after, priority } => {
                let mut dirty = 0;
                for k in 0..KEYS {
                    if k > 0 {
                        self.advance(TICK);
                    }
                    let (k, m) = (key(k), &mut self.model);
                    dirty += u64::from(m.items.get(&k).is_some_and(|i| i.state == State::Running));
                    m.enqueue_with(&k, UNIT * u32::from(*after), *priority, false);
                }
                Answer::Enqueued { dirty }
            }
            Op::Start { .. } | Op::Heartbeat { .. } | Op::Close { .. } | Op::Reclaim => {
                self.sessions(op)
            }
            Op::Claim { .. }
            | Op::Complete { .. }
            | Op::Batch(_)
            | Op::Release { .. }
            | Op::Lock { .. } => self.leases(op),
            Op::Advance(u) => {
                self.advance(UNIT * u32::from(*u));
                Answer::Set
            }
            Op::Retry(_)
            | Op::Park(_)
            | Op::Delete(_)
            | Op::Pause(_)
            | Op::Limit(_)
            | Op::Rate(_) => self.operator(op),
            Op::Retention {
                keep,
                per_key,
                forget,
            } => {
                self.model
                    .set_retention(retention(*keep, *per_key, *forget));
                Answer::Set
            }
            Op::Prune { .. } => {
                let pruned = self.model.retention_prune();
                Answer::Pruned {
                    runs: pruned.runs,
                    items: pruned.items,
                }
            }
        }
    }

    /// A session's start, heartbeat or close, or a reclaim.
    fn sessions(&mut self, op: &Op) -> Answer {
        let m = &mut self.model;
        match op {
            Op::Start { ttl } => {
                let session = m.session_start(0, UNIT * u32::from(*ttl));
                Answer::Started(self.aliases.add_session(session.id))
            }
            Op::Heartbeat { session } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(s) => match refused(m.session_heartbeat(s.0).map(|_| ())) {
                    Ok(()) => Answer::Renewed,
                    Err(r) => Answer::Refused(r),
                },
            },
            Op::Close { session } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(s) => Answer::Closed(m.session_close(s.0)),
            },
            _ => {
                let report = m.session_reclaim();
                Answer::Reclaimed {
                    sessions: report.sessions,
                    leases: report.leases,
                }
            }
        }
    }

    /// A claim, a completion (alone or in a batch, one after another as
    /// the batch's one transaction must look) or a release.
    fn leases(&mut self, op: &Op) -> Answer {
        let m = &mut self.model;
        let done = |result| match refused(result) {
            Ok(()) => Answer::Ok,
            Err(r) => Answer::Refused(r),
        };
        match op {
            Op::Claim { session, max } => {
                let Some(s) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                let now = m.now();
                let ready = m.items.values().any(|i| i.ready_by(now));
                match m.lease_claim(0, s.0, u32::from(*max)) {
                    Ok(claimed) => Answer::Claimed {
                        leases: self
                            .aliases
                            .add_leases(&claimed.leases)
                            .expect("the model's tokens increase"),
                        gate: ready.then(|| Gate::of(&claimed.gate)),
                    },
                    Err(e) => Answer::Refused(Refusal::of(&e).expect("a refusal")),
                }
            }
            Op::Complete { lease, end } => match self.aliases.lease(*lease) {
                None => Answer::Skipped,
                Some(l) => {
                    let end = outcome(*end);
                    let mut results = m.lease_complete_batch([(l, &end)]);
                    done(results.pop().expect("one answer"))
                }
            },
            Op::Batch(each) => {
                if self.aliases.leases.is_empty() {
                    return Answer::Skipped;
                }
                let batch: Vec<(Lease, End)> = each
                    .iter()
                    .map(|(l, end)| (self.aliases.lease(*l).expect("some").clone(), *end))
                    .collect();
                let outcomes: Vec<Outcome> = batch.iter().map(|(_, end)| outcome(*end)).collect();
                let results = m
                    .lease_complete_batch(batch.iter().map(|(l, _)| l).zip(&outcomes))
                    .into_iter()
                    .map(refused)
                    .collect();
                Answer::Batch(results)
            }
            Op::Release { lease } => match self.aliases.lease(*lease) {
                None => Answer::Skipped,
                Some(l) => done(m.lease_release(l)),
            },
            Op::Lock { session, key: k } => {
                let Some(s) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                match m.lease_lock(0, s.0, &key(*k)) {
                    Ok(lease) => {
                        let mut named = self
                            .aliases
                            .add_leases(&[lease])
                            .expect("the model's tokens increase");
                        Answer::Locked(named.remove(0))
                    }
                    Err(e) => Answer::Refused(Refusal::of(&e).expect("a refusal")),
                }
            }
            _ => unreachable!("not a lease's operation: {op}"),
        }
    }

    /// An operator's retry, park or delete, or a change of the process's
    /// fleet controls.
    fn operator(&mut self, op: &Op) -> Answer {
        let m = &mut self.model;
        match op {
            Op::Retry(k) => Answer::Admin(m.admin("retry", &key(*k))),
            Op::Park(k) => Answer::Admin(m.admin("park", &key(*k))),
            Op::Delete(k) => Answer::Admin(m.admin("delete", &key(*k))),
            Op::Pause(paused) => {
                let changed = m.paused != *paused;
                m.set_paused(*paused);
                Answer::Changed(changed)
            }
            Op::Limit(limit) => {
                m.set_limit(limit.map(u32::from));
                Answer::Set
            }
            Op::Rate(burst) => {
                m.set_rate(burst.map(|b| (RATE_PER_S, u32::from(b))));
                Answer::Set
            }
            _ => unreachable!("not an operator's operation: {op}"),
        }
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let m = &self.model;
        let now = m.now();
        let items = m
            .items
            .iter()
            .map(|(key, item)| {
                let state = match item.state {
                    State::Pending if item.backing_off(now) => "backoff",
                    State::Pending if item.ready_by(now) => "ready",
                    State::Pending => "waiting",
                    State::Running => "running",
                    State::Parked => "parked",
                    State::Idle => "idle",
                };
                let lease = item
                    .lease()
                    .map(|(s, t)| (self.aliases.session_of(s), self.aliases.token(t)));
                let view = ItemView {
                    state,
                    priority: item.priority,
                    failures: item.failures,
                    dirty: item.dirty(),
                    last_error: item.last_error.clone(),
                    lease,
                };
                (key.clone(), view)
            })
            .collect();
        let mut snapshot = Snapshot {
            items,
            ..Snapshot::default()
        };
        for row in &m.history {
            let lease = row.token.map(|t| self.aliases.token(t));
            snapshot
                .history
                .entry(row.key.clone())
                .or_default()
                .push((row.outcome, lease));
        }
        snapshot
    }
}
