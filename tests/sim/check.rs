//! The invariants, judged over a world's log.

use std::collections::BTreeMap;

use crate::log::{Event, RunEnd, What};
use crate::model::RECORDED;
use crate::world::{CONVERGE_WITHIN, Ran};

/// A broken invariant: what, and the event where it showed.
#[derive(Debug)]
pub(crate) struct Violation {
    pub rule: &'static str,
    pub detail: String,
    pub seq: usize,
    pub key: Option<String>,
}

fn broke(rule: &'static str, e: &Event, key: Option<&str>, detail: String) -> Violation {
    Violation {
        rule,
        detail,
        seq: e.seq,
        key: key.map(str::to_owned),
    }
}

/// Every checker, in order; the first violation found.
pub(crate) fn all(ran: &Ran) -> Result<(), Violation> {
    one_run_at_a_time(&ran.events)?;
    accepted_outcomes_are_the_runs_own(&ran.events)?;
    paused_starts_nothing(&ran.events)?;
    limit_holds(&ran.events, ran.shape.limit)?;
    retention_forgets_only_idle_keys(&ran.events)?;
    every_enqueue_is_followed_by_a_run(&ran.events)?;
    converges(ran)
}

/// Rule 1, from the reconcilers' own log: no two runs of one key overlap.
pub(crate) fn one_run_at_a_time(events: &[Event]) -> Result<(), Violation> {
    let mut open: BTreeMap<&str, (i64, u32, usize)> = BTreeMap::new();
    for e in events {
        match &e.what {
            What::RunStart { worker, key, token } => {
                if let Some((other, w, seq)) = open.get(key.as_str()) {
                    return Err(broke(
                        "rule 1: one run at a time",
                        e,
                        Some(key),
                        format!(
                            "run {token} of {key} started on worker {worker} while run {other} \
                             (worker {w}, started at #{seq}) had not ended"
                        ),
                    ));
                }
                open.insert(key, (*token, *worker, e.seq));
            }
            What::RunEnd { key, token, .. }
                if open.get(key.as_str()).is_some_and(|(t, ..)| t == token) =>
            {
                open.remove(key.as_str());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Fencing: the store accepts an outcome or a release only from the key's
/// current lease, and an accepted outcome is the one its run returned (or a
/// timeout's transient failure); a stale completion changes nothing.
pub(crate) fn accepted_outcomes_are_the_runs_own(events: &[Event]) -> Result<(), Violation> {
    let mut current: BTreeMap<&str, i64> = BTreeMap::new();
    let mut ended: BTreeMap<i64, &RunEnd> = BTreeMap::new();
    for e in events {
        match &e.what {
            What::Claim { key, token, .. } => {
                current.insert(key, *token);
            }
            What::RunEnd { token, how, .. } => {
                ended.insert(*token, how);
            }
            What::Complete {
                key,
                token,
                outcome,
                result,
                ..
            } if !result.starts_with("refused") && *result != RECORDED => {
                if current.get(key.as_str()) != Some(token) {
                    return Err(broke(
                        "fencing",
                        e,
                        Some(key),
                        format!("a stale completion (token {token}) was accepted"),
                    ));
                }
                let fits = match ended.get(token) {
                    Some(RunEnd::Returned(returned)) => returned == outcome,
                    Some(RunEnd::Cancelled | RunEnd::Dropped) => *outcome == "transient",
                    Some(RunEnd::Crashed) | None => false,
                };
                if !fits {
                    return Err(broke(
                        "fencing",
                        e,
                        Some(key),
                        format!(
                            "outcome {outcome} of token {token} accepted, but its run ended {:?}",
                            ended.get(token)
                        ),
                    ));
                }
                current.remove(key.as_str());
            }
            What::Release { key, token, result } if *result != "refused" => {
                if current.get(key.as_str()) != Some(token) {
                    return Err(broke(
                        "fencing",
                        e,
                        Some(key),
                        format!("a stale release (token {token}) was accepted"),
                    ));
                }
                current.remove(key.as_str());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Rule 10: while the process is paused nothing is claimed, and no run starts
/// but one whose lease was claimed before the pause.
pub(crate) fn paused_starts_nothing(events: &[Event]) -> Result<(), Violation> {
    let mut paused_at: Option<usize> = None;
    let mut claimed_at: BTreeMap<i64, usize> = BTreeMap::new();
    for e in events {
        match &e.what {
            What::Pause => paused_at = Some(e.seq),
            What::Resume => paused_at = None,
            What::Claim { key, token, .. } => {
                if paused_at.is_some() {
                    return Err(broke("pause", e, Some(key), "claimed while paused".into()));
                }
                claimed_at.insert(*token, e.seq);
            }
            What::RunStart { key, token, .. } => {
                if let Some(paused) = paused_at
                    && claimed_at.get(token).is_none_or(|c| *c > paused)
                {
                    return Err(broke(
                        "pause",
                        e,
                        Some(key),
                        format!("run {token} started while paused"),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Rule 10: the concurrency limit is never exceeded, counting the runs the
/// reconcilers themselves say are going.
pub(crate) fn limit_holds(events: &[Event], limit: Option<u32>) -> Result<(), Violation> {
    let Some(limit) = limit else { return Ok(()) };
    let mut going: BTreeMap<i64, ()> = BTreeMap::new();
    for e in events {
        match &e.what {
            What::RunStart { key, token, .. } => {
                going.insert(*token, ());
                if going.len() > limit as usize {
                    return Err(broke(
                        "concurrency limit",
                        e,
                        Some(key),
                        format!("{} runs going, limit {limit}", going.len()),
                    ));
                }
            }
            What::RunEnd { token, .. } => {
                going.remove(token);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Rule 3: every enqueue is followed by a run of its key that starts after
/// it, unless an operator parked or deleted the key in between.
pub(crate) fn every_enqueue_is_followed_by_a_run(events: &[Event]) -> Result<(), Violation> {
    let mut owed: BTreeMap<&str, &Event> = BTreeMap::new();
    for e in events {
        match &e.what {
            What::Enqueue { key, .. } => {
                owed.entry(key).or_insert(e);
            }
            What::RunStart { key, .. } => {
                owed.remove(key.as_str());
            }
            What::Admin {
                action: "park" | "delete",
                key,
                result: "done",
            } => {
                owed.remove(key.as_str());
            }
            _ => {}
        }
    }
    match owed.into_iter().next() {
        Some((key, e)) => Err(broke(
            "rule 3: nothing lost",
            e,
            Some(key),
            format!("this enqueue of {key} was never followed by a run"),
        )),
        None => Ok(()),
    }
}

/// A key's state in the store, as the log tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    Pending,
    /// Held by a lease of this session.
    Running(i64),
    Parked,
    Idle,
}

/// Rule 10's retention, with rules 2–4: a retention pass forgets only idle
/// keys, never one that is pending (enqueued, handed back, or waiting out a
/// backoff), running (dirty or not) or parked: its work would be lost. Each
/// key's state is followed from the log alone, not read from the model, so
/// a model that forgot the wrong key is caught.
pub(crate) fn retention_forgets_only_idle_keys(events: &[Event]) -> Result<(), Violation> {
    let mut keys: BTreeMap<&str, Stored> = BTreeMap::new();
    for e in events {
        match &e.what {
            What::Enqueue { key, state, .. } if *state != "dirty" => {
                keys.insert(key, Stored::Pending);
            }
            What::Claim { session, key, .. } => {
                keys.insert(key, Stored::Running(*session));
            }
            What::Complete { key, result, .. } => {
                let next = match *result {
                    "pending" => Stored::Pending,
                    "parked" => Stored::Parked,
                    "idle" => Stored::Idle,
                    _ => continue,
                };
                keys.insert(key, next);
            }
            What::Release { key, result, .. } if *result != "refused" => {
                keys.insert(key, Stored::Pending);
            }
            What::Reclaim { keys: taken, .. } => {
                for (key, _) in taken {
                    keys.insert(key, Stored::Pending);
                }
            }
            What::SessionClose { session, .. } => {
                for state in keys.values_mut() {
                    if *state == Stored::Running(*session) {
                        *state = Stored::Pending;
                    }
                }
            }
            What::Admin {
                action,
                key,
                result: "done",
            } => match *action {
                "retry" => {
                    keys.insert(key, Stored::Pending);
                }
                "park" => {
                    keys.insert(key, Stored::Parked);
                }
                _ => {
                    keys.remove(key.as_str());
                }
            },
            What::Prune { forgot, .. } => {
                for key in forgot {
                    match keys.remove(key.as_str()) {
                        Some(Stored::Idle) => {}
                        state => {
                            return Err(broke(
                                "retention: only idle keys are forgotten",
                                e,
                                Some(key),
                                format!("{key} was forgotten while {state:?}"),
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Liveness: once the faults stop, every key converges within
/// [`CONVERGE_WITHIN`].
pub(crate) fn converges(ran: &Ran) -> Result<(), Violation> {
    if ran.converged_at.is_some() {
        return Ok(());
    }
    let last = ran.events.last().expect("a world logs");
    Err(Violation {
        rule: "liveness",
        detail: format!(
            "not converged {CONVERGE_WITHIN:?} after the faults stopped at {:.3}s: {}",
            ran.quiet_at.as_secs_f64(),
            ran.unconverged.join(", ")
        ),
        seq: last.seq,
        key: ran
            .unconverged
            .first()
            .and_then(|k| k.split(':').next())
            .map(str::to_owned),
    })
}
