//! The operations on the model store (`tests/sim/model.rs`), on a clock the
//! case moves by hand: what every engine must answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use drover::backoff::Backoff;
use drover::store::{Lease, Outcome, StoreError};

use crate::log::Log;
use crate::model::{Model, State};
use crate::ops::{End, KEYS, Op, UNIT};
use crate::view::{Aliases, Answer, ItemView, Refusal, Snapshot};

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
        let m = &mut self.model;
        match op {
            Op::Enqueue {
                key: k,
                after,
                priority,
                bypass,
            } => {
                let k = key(*k);
                let dirty = m.items.get(&k).is_some_and(|i| i.state == State::Running);
                m.enqueue_with(&k, UNIT * u32::from(*after), *priority, *bypass);
                Answer::Enqueued {
                    dirty: u64::from(dirty),
                }
            }
            Op::Start { ttl } => {
                let session = m.session_start(0, UNIT * u32::from(*ttl));
                Answer::Started(self.aliases.add_session(session.id))
            }
            Op::Heartbeat { session } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(s) => match m.session_heartbeat(s.0) {
                    Ok(_) => Answer::Renewed,
                    Err(e) => Answer::Refused(Refusal::of(&e).expect("a refusal")),
                },
            },
            Op::Close { session } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(s) => Answer::Closed(m.session_close(s.0)),
            },
            Op::Claim { session, max } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(s) => {
                    let now = m.now();
                    let ready = m.items.values().any(|i| i.ready_by(now));
                    match m.lease_claim(0, s.0, u32::from(*max)) {
                        Ok(claimed) => Answer::Claimed {
                            leases: self
                                .aliases
                                .add_leases(&claimed.leases)
                                .expect("the model's tokens increase"),
                            gate: ready.then_some((
                                claimed.gate.paused,
                                claimed.gate.concurrency_limited,
                            )),
                        },
                        Err(e) => Answer::Refused(Refusal::of(&e).expect("a refusal")),
                    }
                }
            },
            Op::Complete { lease, end } => match self.aliases.lease(*lease) {
                None => Answer::Skipped,
                Some(l) => match refused(m.lease_complete(l, &outcome(*end))) {
                    Ok(()) => Answer::Ok,
                    Err(r) => Answer::Refused(r),
                },
            },
            Op::Batch(each) => {
                if self.aliases.leases.is_empty() {
                    return Answer::Skipped;
                }
                let batch: Vec<(Lease, End)> = each
                    .iter()
                    .map(|(l, end)| (self.aliases.lease(*l).expect("some").clone(), *end))
                    .collect();
                let results = batch
                    .iter()
                    .map(|(l, end)| refused(m.lease_complete(l, &outcome(*end))))
                    .collect();
                Answer::Batch(results)
            }
            Op::Release { lease } => match self.aliases.lease(*lease) {
                None => Answer::Skipped,
                Some(l) => match refused(m.lease_release(l)) {
                    Ok(()) => Answer::Ok,
                    Err(r) => Answer::Refused(r),
                },
            },
            Op::Advance(u) => {
                self.advance(UNIT * u32::from(*u));
                Answer::Set
            }
            Op::Reclaim => {
                let report = m.session_reclaim();
                Answer::Reclaimed {
                    sessions: report.sessions,
                    leases: report.leases,
                }
            }
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
