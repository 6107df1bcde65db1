//! The operations on a real engine, through the `StoreEngine` seam, with the
//! engine's test clock moved in step with the model's.

use drover::backoff::Backoff;
use drover::store::{
    ItemDelete, ItemEnqueue, ItemList, ItemPark, ItemRetry, ItemState, LeaseClaim, LeaseComplete,
    LeaseRelease, ProcessConfigure, ProcessPause, RunList, SessionClose, SessionHeartbeat,
    SessionStart, Store, StoreEngine as _, StoreError,
};

use crate::model::PARK_REASON;
use crate::on_model::{key, outcome};
use crate::ops::{End, Op, UNIT};
use crate::view::{Aliases, Answer, ItemView, Refusal, Snapshot};

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
        let p = self.process.clone();
        match op {
            Op::Enqueue {
                key: k,
                after,
                priority,
                bypass,
            } => {
                let params = ItemEnqueue::new(p, [key(*k)])
                    .after(UNIT * u32::from(*after))
                    .priority(*priority)
                    .bypass_backoff(*bypass);
                match self.store.item_enqueue(params).await {
                    Ok(report) => Answer::Enqueued {
                        dirty: report.dirty,
                    },
                    Err(e) => refusal(&e),
                }
            }
            Op::Start { ttl } => {
                let params = SessionStart::new("differential", UNIT * u32::from(*ttl));
                match self.store.session_start(params).await {
                    Ok(s) => Answer::Started(self.aliases.add_session(s.id)),
                    Err(e) => refusal(&e),
                }
            }
            Op::Heartbeat { session } => {
                let Some(session) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                let params = SessionHeartbeat { session };
                match self.store.session_heartbeat(params).await {
                    Ok(_) => Answer::Renewed,
                    Err(e) => refusal(&e),
                }
            }
            Op::Close { session } => {
                let Some(session) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                match self.store.session_close(SessionClose { session }).await {
                    Ok(n) => Answer::Closed(n),
                    Err(e) => refusal(&e),
                }
            }
            Op::Claim { session, max } => {
                let Some(session) = self.aliases.session(*session) else {
                    return Answer::Skipped;
                };
                let params = LeaseClaim {
                    session,
                    process: p,
                    max: u32::from(*max),
                };
                match self.store.lease_claim(params).await {
                    Ok(claimed) => match self.aliases.add_leases(&claimed.leases) {
                        Ok(leases) => Answer::Claimed {
                            leases,
                            gate: Some((claimed.gate.paused, claimed.gate.concurrency_limited)),
                        },
                        Err(broken) => Answer::Failed(broken),
                    },
                    Err(e) => refusal(&e),
                }
            }
            Op::Complete { lease, end } => {
                let Some(lease) = self.aliases.lease(*lease) else {
                    return Answer::Skipped;
                };
                let outcome = outcome(*end);
                let params = LeaseComplete {
                    lease,
                    outcome: &outcome,
                };
                match self.store.lease_complete(params).await {
                    Ok(()) => Answer::Ok,
                    Err(e) => refusal(&e),
                }
            }
            Op::Batch(each) => self.batch(each).await,
            Op::Release { lease } => {
                let Some(lease) = self.aliases.lease(*lease) else {
                    return Answer::Skipped;
                };
                match self.store.lease_release(LeaseRelease { lease }).await {
                    Ok(()) => Answer::Ok,
                    Err(e) => refusal(&e),
                }
            }
            Op::Advance(u) => {
                self.advance(UNIT * u32::from(*u));
                Answer::Set
            }
            Op::Reclaim => match self.store.session_reclaim().await {
                Ok(report) => Answer::Reclaimed {
                    sessions: report.sessions,
                    leases: report.leases,
                },
                Err(e) => refusal(&e),
            },
            Op::Retry(k) => {
                let params = ItemRetry {
                    process: p,
                    key: key(*k),
                    actor: "test".into(),
                };
                admin(self.store.item_retry(params).await.map(|i| i.is_some()))
            }
            Op::Park(k) => {
                let params = ItemPark {
                    process: p,
                    key: key(*k),
                    reason: PARK_REASON.into(),
                    actor: "test".into(),
                };
                admin(self.store.item_park(params).await.map(|i| i.is_some()))
            }
            Op::Delete(k) => {
                let params = ItemDelete {
                    process: p,
                    key: key(*k),
                    actor: "test".into(),
                };
                admin(self.store.item_delete(params).await)
            }
            Op::Pause(paused) => {
                let params = ProcessPause {
                    process: p,
                    paused: *paused,
                    actor: "test".into(),
                };
                match self.store.process_pause(params).await {
                    Ok(changed) => Answer::Changed(changed),
                    Err(e) => refusal(&e),
                }
            }
            Op::Limit(limit) => {
                let params = ProcessConfigure::new(p).concurrency(limit.map(u32::from));
                match self.store.process_configure(params).await {
                    Ok(()) => Answer::Set,
                    Err(e) => refusal(&e),
                }
            }
        }
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
            let lease = item.lease_session.zip(item.lease_token).map(|(s, t)| {
                (self.aliases.session_of(s.0), self.aliases.token(t.0))
            });
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
