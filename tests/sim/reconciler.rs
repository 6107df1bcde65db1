//! The reconcilers of the world: each run logs its own start and end in
//! simulated time (the checkers judge rule 1 from these, not from the store),
//! takes a duration and returns an outcome chosen by the seed.

use std::sync::Arc;
use std::time::Duration;

use drover::runner::{Action, BoxError, Reconciler, Task, permanent};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use crate::backend::Shared;
use crate::log::{RunEnd, What};

pub(crate) struct SimReconciler {
    pub worker: u32,
    pub shared: Arc<Shared>,
    pub death: CancellationToken,
    /// The controller's run timeout, if any: no run lasts exactly this long, so a
    /// run's end never ties with its timeout (whose winner tokio would pick
    /// at random).
    pub timeout: Option<Duration>,
}

/// What a run will do.
struct Plan {
    lasts: Duration,
    outcome: Result<Action, &'static str>,
}

impl SimReconciler {
    fn plan(&self) -> Plan {
        let quiet = self.shared.quiet();
        let mut rng = self.shared.rng();
        let mut lasts = match rng.below(20) {
            _ if quiet => rng.ms(1, 300),
            0..=11 => rng.ms(1, 300),
            12..=15 => rng.ms(300, 2_000),
            _ => rng.ms(2_000, 8_000),
        };
        if self
            .timeout
            .is_some_and(|t| lasts.abs_diff(t) < Duration::from_millis(3))
        {
            lasts += Duration::from_millis(5);
        }
        let outcome = match rng.below(20) {
            _ if quiet => Ok(Action::Done),
            0..=14 => Ok(Action::Done),
            15 => Ok(Action::RequeueAfter(rng.ms(10, 1_000))),
            16..=18 => Err("transient"),
            _ => Err("permanent"),
        };
        Plan { lasts, outcome }
    }
}

/// Logs the run's end once: when it returns, stops, or is dropped.
struct Ending {
    shared: Arc<Shared>,
    worker: u32,
    key: String,
    token: i64,
    ended: bool,
}

impl Ending {
    fn end(&mut self, how: RunEnd) {
        if !self.ended {
            self.ended = true;
            self.shared.log.push(What::RunEnd {
                worker: self.worker,
                key: self.key.clone(),
                token: self.token,
                how,
            });
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.end(RunEnd::Dropped);
    }
}

impl Reconciler for SimReconciler {
    async fn reconcile(&self, task: Task) -> Result<Action, BoxError> {
        let plan = self.plan();
        let token = task.fencing_token().0;
        self.shared.log.push(What::RunStart {
            worker: self.worker,
            key: task.key().to_owned(),
            token,
        });
        let mut ending = Ending {
            shared: Arc::clone(&self.shared),
            worker: self.worker,
            key: task.key().to_owned(),
            token,
            ended: false,
        };
        tokio::select! {
            biased;
            () = self.death.cancelled() => {
                ending.end(RunEnd::Crashed);
                std::future::pending().await
            }
            () = task.cancelled() => {
                ending.end(RunEnd::Cancelled);
                Err("cancelled".into())
            }
            () = sleep(plan.lasts) => {
                let name = match plan.outcome {
                    Ok(Action::Done) => "done",
                    Ok(Action::RequeueAfter(_)) => "requeue_after",
                    Err("transient") => "transient",
                    Err(_) => "permanent",
                };
                ending.end(RunEnd::Returned(name));
                match plan.outcome {
                    Ok(action) => Ok(action),
                    Err("transient") => Err("transient failure".into()),
                    Err(_) => Err(permanent(std::io::Error::other("permanent failure")).into()),
                }
            }
        }
    }
}
