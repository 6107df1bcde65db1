//! The operations on a real engine, through the `StoreEngine` seam, with the
//! engine's test clock moved in step with the model's.

use drover::backoff::Backoff;
use drover::store::{
    ItemDelete, ItemEnqueue, ItemList, ItemPark, ItemRetry, ItemState, LeaseClaim, LeaseComplete,
    LeaseLock, LeaseRelease, ProcessConfigure, ProcessPause, PruneCursor, RetentionPrune, RunList,
    SessionClose, SessionHeartbeat, SessionStart, Store, StoreEngine as _, StoreError,
};

use crate::aliases::Aliases;
use crate::model::PARK_REASON;
use crate::on_model::{key, outcome, retention};
use crate::ops::{End, KEYS, Op, RATE_PER_S, TICK, UNIT};
use crate::view::{Answer, Gate, ItemView, Refusal, Snapshot};

/// One engine's side of one case: a process of its own.
pub(crate) struct OnEngine {
    pub name: &'static str,
    store: Store,
    process: String,
    pub aliases: Aliases,
}

/// An operation's refusal as an answer, or its unexpected error.
fn refusal(e: &StoreError) -> Answer {
    Refusal::of(e).map_or_else(Answer::Failed, Answer::Refused)
}

/// A call's answer: `ok`'s of what it returned, or its refusal.
fn answer<T>(result: Result<T, StoreError>, ok: impl FnOnce(T) -> Answer) -> Answer {
    result.map_or_else(|e| refusal(&e), ok)
}

impl OnEngine {
    /// Makes `process` known with the case's backoff policy.
    pub(crate) async fn new(
        name: &'static str,
        store: Store,
        process: String,
        backoff: Backoff,
    ) -> Self {
        store
            .process_configure(ProcessConfigure::new(&process).backoff(backoff))
            .await
            .unwrap_or_else(|e| panic!("configure on {name}: {e}"));
        Self {
            name,
            store,
            process,
            aliases: Aliases::default(),
        }
    }

    /// Moves the engine's clock on by `by`.
    pub(crate) fn advance(&self, by: std::time::Duration) {
        self.store.clock().advance(by);
    }

    pub(crate) async fn apply(&mut self, op: &Op) -> Answer {
        match op {
            Op::Enqueue {
                key: k,
                after,
                priority,
                bypass,
            } => {
                let params = ItemEnqueue::new(&self.process, [key(*k)])
                    .after(UNIT * u32::from(*after))
                    .priority(*priority)
                    .bypass_backoff(*bypass);
                let report = self.store.item_enqueue(params).await;
                answer(report, |r| Answer::Enqueued { dirty: r.dirty })
            }
            Op::EnqueueEach { after, priority } => {
                let mut dirty = 0;
                for k in 0..KEYS {
                    if k > 0 {
                        self.advance(TICK);
                    }
                    let params = ItemEnqueue::new(&self.process, [key(k)])
                        .after(UNIT * u32::from(*after))
                        .priority(*priority);
                    match self.store.item_enqueue(params).await {
                        Ok(report) => dirty += report.dirty,
                        Err(e) => return refusal(&e),
                    }
                }
                Answer::Enqueued { dirty }
            }
            Op::Start { .. } | Op::Heartbeat { .. } | Op::Close { .. } | Op::Reclaim => {
                self.sessions(op).await
            }
            Op::Claim { .. }
            | Op::Complete { .. }
            | Op::Batch(_)
            | Op::Release { .. }
            | Op::Lock { .. } => self.leases(op).await,
            Op::Advance(u) => {
                self.advance(UNIT * u32::from(*u));
                Answer::Set
            }
            Op::Retry(_)
            | Op::Park(_)
            | Op::Delete(_)
            | Op::Pause(_)
            | Op::Limit(_)
            | Op::Rate(_) => self.operator(op).await,
            Op::Retention {
                keep,
                per_key,
                forget,
            } => {
                let rules = retention(*keep, *per_key, *forget);
                let params = ProcessConfigure::new(&self.process)
                    .keep_runs_for(rules.keep_runs_for)
                    .keep_runs_per_key(rules.keep_runs_per_key)
                    .forget_idle_after(rules.forget_idle_after);
                answer(self.store.process_configure(params).await, |()| Answer::Set)
            }
            Op::Prune { batch } => self.prune(u32::from(*batch)).await,
        }
    }

    /// A session's start, heartbeat or close, or a reclaim.
    async fn sessions(&mut self, op: &Op) -> Answer {
        let s = &self.store;
        match op {
            Op::Start { ttl } => {
                let params = SessionStart::new("differential", UNIT * u32::from(*ttl));
                match s.session_start(params).await {
                    Ok(started) => Answer::Started(self.aliases.add_session(started.id)),
                    Err(e) => refusal(&e),
                }
            }
            Op::Heartbeat { session } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(session) => answer(
                    s.session_heartbeat(SessionHeartbeat { session }).await,
                    |_| Answer::Renewed,
                ),
            },
            Op::Close { session } => match self.aliases.session(*session) {
                None => Answer::Skipped,
                Some(session) => answer(
                    s.session_close(SessionClose { session }).await,
                    Answer::Closed,
                ),
            },
            _ => answer(s.session_reclaim().await, |r| Answer::Reclaimed {
                sessions: r.sessions,
                leases: r.leases,
            }),
        }
    }

    /// A claim, a completion (alone or in a batch) or a release.
    async fn leases(&mut self, op: &Op) -> Answer {
        let s = &self.store;
        match op {
            Op::Claim { session, max } => {
                let Some(session) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                let params = LeaseClaim {
                    session,
                    process: self.process.clone(),
                    max: u32::from(*max),
                    trace_links: false,
                };
                match s.lease_claim(params).await {
                    Ok(claimed) => match self.aliases.add_leases(&claimed.leases) {
                        Ok(leases) => Answer::Claimed {
                            leases,
                            gate: Some(Gate::of(&claimed.gate)),
                        },
                        Err(broken) => Answer::Failed(broken),
                    },
                    Err(e) => refusal(&e),
                }
            }
            Op::Complete { lease, end } => match self.aliases.lease(*lease) {
                None => Answer::Skipped,
                Some(lease) => {
                    let outcome = outcome(*end);
                    let params = LeaseComplete {
                        lease,
                        outcome: &outcome,
                        trace_id: None,
                    };
                    answer(s.lease_complete(params).await, |()| Answer::Ok)
                }
            },
            Op::Batch(each) => self.batch(each).await,
            Op::Release { lease } => match self.aliases.lease(*lease) {
                None => Answer::Skipped,
                Some(lease) => answer(s.lease_release(LeaseRelease { lease }).await, |()| {
                    Answer::Ok
                }),
            },
            Op::Lock { session, key: k } => {
                let Some(session) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                let params = LeaseLock {
                    session,
                    process: self.process.clone(),
                    key: key(*k),
                };
                match s.lease_lock(params).await {
                    Ok(lease) => match self.aliases.add_leases(&[lease]) {
                        Ok(mut named) => Answer::Locked(named.remove(0)),
                        Err(broken) => Answer::Failed(broken),
                    },
                    Err(e) => refusal(&e),
                }
            }
            _ => unreachable!("not a lease's operation: {op}"),
        }
    }

    /// An operator's retry, park or delete, or a change of the process's
    /// fleet controls.
    async fn operator(&self, op: &Op) -> Answer {
        let (s, p) = (&self.store, self.process.clone());
        let actor = || "test".to_owned();
        match op {
            Op::Retry(k) => {
                let params = ItemRetry {
                    process: p,
                    key: key(*k),
                    actor: actor(),
                };
                admin(s.item_retry(params).await.map(|i| i.is_some()))
            }
            Op::Park(k) => {
                let params = ItemPark {
                    process: p,
                    key: key(*k),
                    reason: PARK_REASON.into(),
                    actor: actor(),
                };
                admin(s.item_park(params).await.map(|i| i.is_some()))
            }
            Op::Delete(k) => {
                let params = ItemDelete {
                    process: p,
                    key: key(*k),
                    actor: actor(),
                };
                admin(s.item_delete(params).await)
            }
            Op::Pause(paused) => {
                let params = ProcessPause {
                    process: p,
                    paused: *paused,
                    actor: actor(),
                };
                answer(s.process_pause(params).await, Answer::Changed)
            }
            Op::Limit(limit) => {
                let params = ProcessConfigure::new(p).concurrency(limit.map(u32::from));
                answer(s.process_configure(params).await, |()| Answer::Set)
            }
            Op::Rate(burst) => {
                let params = match burst {
                    Some(b) => ProcessConfigure::new(p)
                        .rate(Some(RATE_PER_S))
                        .burst(u32::from(*b)),
                    None => ProcessConfigure::new(p).rate(None),
                };
                answer(s.process_configure(params).await, |()| Answer::Set)
            }
            _ => unreachable!("not an operator's operation: {op}"),
        }
    }

    /// One whole retention pass in batches of `batch`, the cursor carried
    /// from each to the next; what the batches removed, summed. A pass that
    /// does not end (far more batches than the case has rows) is a failure.
    async fn prune(&self, batch: u32) -> Answer {
        const MOST_BATCHES: u32 = 1_000;
        let (mut runs, mut items) = (0, 0);
        let mut cursor = PruneCursor::default();
        for _ in 0..MOST_BATCHES {
            let params = RetentionPrune {
                process: self.process.clone(),
                batch,
                cursor,
            };
            match self.store.retention_prune(params).await {
                Ok(report) => {
                    runs += report.runs;
                    items += report.items;
                    if report.done {
                        return Answer::Pruned { runs, items };
                    }
                    cursor = report.cursor;
                }
                Err(e) => return refusal(&e),
            }
        }
        Answer::Failed(format!("a pass was not done after {MOST_BATCHES} batches"))
    }

    /// One completion batch; each lease's answer in order.
    async fn batch(&self, each: &[(u8, End)]) -> Answer {
        if self.aliases.leases.is_empty() {
            return Answer::Skipped;
        }
        let outcomes: Vec<_> = each.iter().map(|(_, end)| outcome(*end)).collect();
        let batch: Vec<LeaseComplete<'_>> = each
            .iter()
            .zip(&outcomes)
            .map(|((l, _), outcome)| LeaseComplete {
                lease: self.aliases.lease(*l).expect("some"),
                outcome,
                trace_id: None,
            })
            .collect();
        match self.store.lease_complete_batch(&batch).await {
            Ok(results) => {
                let mut each = Vec::with_capacity(results.len());
                for result in results {
                    match result {
                        Ok(()) => each.push(Ok(())),
                        Err(e) => match Refusal::of(&e) {
                            Ok(r) => each.push(Err(r)),
                            Err(words) => return Answer::Failed(words),
                        },
                    }
                }
                Answer::Batch(each)
            }
            Err(e) => refusal(&e),
        }
    }

    /// The process's items and history as they stand.
    pub(crate) async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let list = ItemList {
            process: self.process.clone(),
            state: None,
            after_key: None,
            limit: 1_000,
        };
        let items = self.store.item_list(list).await?;
        let now = self.store.clock_now().await?;
        let runs = RunList {
            process: Some(self.process.clone()),
            limit: 1_000,
            ..RunList::default()
        };
        let runs = self.store.run_list(runs).await?;
        let mut snapshot = Snapshot::default();
        for item in items {
            let state = match item.state {
                ItemState::Pending if item.ready_at <= now => "ready",
                ItemState::Pending => "waiting",
                ItemState::Backoff => "backoff",
                ItemState::Running => "running",
                ItemState::Parked => "parked",
                ItemState::Idle => "idle",
            };
            let lease = item
                .lease_session
                .zip(item.lease_token)
                .map(|(s, t)| (self.aliases.session_of(s.0), self.aliases.token(t.0)));
            let view = ItemView {
                state,
                priority: item.priority,
                failures: item.failures,
                dirty: item.dirty,
                last_error: item.last_error,
                lease,
            };
            snapshot.items.insert(item.key, view);
        }
        for run in runs.into_iter().rev() {
            let lease = run.token.map(|t| self.aliases.token(t.0));
            snapshot
                .history
                .entry(run.key)
                .or_default()
                .push((run.outcome, lease));
        }
        Ok(snapshot)
    }

    /// Ends every session the case started, so the next case's reclaims
    /// find none of them.
    pub(crate) async fn close_sessions(&self) {
        for session in &self.aliases.sessions {
            let _ = self
                .store
                .session_close(SessionClose { session: *session })
                .await;
        }
    }
}

/// An operator's action's answer: `done`, `no such key`, or its refusal.
fn admin(result: Result<bool, StoreError>) -> Answer {
    match result {
        Ok(true) => Answer::Admin("done"),
        Ok(false) => Answer::Admin("no such key"),
        Err(StoreError::AlreadyLeased { .. }) => Answer::Admin("refused: running"),
        Err(e) => refusal(&e),
    }
}
