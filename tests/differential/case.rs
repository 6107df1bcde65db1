//! One differential case: the same operations, one at a time, on the model
//! and on every engine, each answer and the state after each operation
//! compared with the model's. The first difference ends the case.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use drover::backoff::Backoff;
use drover::store::Store;

use crate::on_engine::OnEngine;
use crate::on_model::OnModel;
use crate::ops::{Op, TICK, UNIT};

/// The backoff of every case: 1, 2, 4 units, then 8 at most; no jitter.
pub(crate) fn backoff() -> Backoff {
    Backoff::new(UNIT, 2.0, UNIT * 8).expect("a valid policy")
}

/// How a case went wrong: where, and the model's answers up to there.
#[derive(Debug)]
pub(crate) struct Divergence {
    pub report: String,
}

/// How many answers of each kind the model gave, over the whole run.
pub(crate) static TALLY: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Runs `ops` on the model and on each of `engines`.
pub(crate) async fn run(engines: &[(&'static str, Store)], ops: &[Op]) -> Result<(), Divergence> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let process = format!("diff{}", CASE.fetch_add(1, Ordering::SeqCst));
    let mut model = OnModel::new(backoff());
    let mut sides = Vec::with_capacity(engines.len());
    for (name, store) in engines {
        sides.push(OnEngine::new(name, store.clone(), process.clone(), backoff()).await);
    }
    let result = lockstep(&mut model, &mut sides, ops).await;
    for side in &sides {
        side.close_sessions().await;
    }
    result
}

async fn lockstep(
    model: &mut OnModel,
    sides: &mut [OnEngine],
    ops: &[Op],
) -> Result<(), Divergence> {
    let mut trace = String::new();
    for (n, op) in ops.iter().enumerate() {
        model.advance(TICK);
        let names = model.aliases.names(op);
        let want = model.apply(op);
        let want_after = model.snapshot();
        let _ = writeln!(trace, "  #{n:<2} {:<48} -> {want}", format!("{op} {names}"));
        *TALLY
            .lock()
            .expect("not poisoned")
            .entry(want.kind())
            .or_default() += 1;
        for side in sides.iter_mut() {
            side.advance(TICK);
            let got = side.apply(op).await.compared_with(&want);
            let problem = if got == want {
                match side.snapshot().await {
                    Ok(after) => want_after.difference(&after),
                    Err(e) => Some(format!("reading the state failed: {e}")),
                }
            } else {
                Some(format!("answer: model {want}\n       engine {got}"))
            };
            if let Some(problem) = problem {
                let report = format!(
                    "{} diverged from the model at #{n} ({op} {names}):\n       {problem}\n\
                     the model's answers up to there:\n{trace}",
                    side.name
                );
                return Err(Divergence { report });
            }
        }
    }
    Ok(())
}
