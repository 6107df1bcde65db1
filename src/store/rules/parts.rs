//! A completion batch that one outcome makes fail is written in parts, so the
//! other outcomes land and only the bad one is answered with the error.
//!
//! Written once for both engines: each says which of its errors may come from
//! one outcome's data ([`CompleteOnce::from_data`]) and how to write one
//! transaction ([`CompleteOnce::complete_once`]); this file does the halving.
//!
//! It also answers a retried completion as written when its first try was
//! ([`answer_the_recorded`]): the caller that retries after a commit whose
//! answer it never heard (`CommitUnknown`, a cut link, an HTTP timeout) finds
//! its lease ended by its own first try, and was told `LeaseLost`, counted
//! its run lost and warned so, though the outcome was recorded.

use std::collections::HashSet;
use std::future::Future;
use std::ops::Range;

use crate::store::StoreError;
use crate::store::error::error_chain;
use crate::store::params::LeaseComplete;
use crate::store::text::clean_text;
use crate::store::types::{Lease, Outcome, RunOutcome};

pub(crate) use super::written::{Answers, Settlements, Written};

/// An engine's one-transaction completion.
pub(crate) trait CompleteOnce: Sync {
    /// Writes `batch` in one transaction, as
    /// [`lease_complete_batch`](crate::store::StoreEngine::lease_complete_batch) does
    /// (with the engine's own retries of lost races).
    fn complete_once(
        &self,
        batch: &[LeaseComplete<'_>],
    ) -> impl Future<Output = Result<Answers, StoreError>> + Send;

    /// Whether `e` may be caused by one outcome's data (a value the database
    /// refuses), so that splitting the batch can isolate it. Connection,
    /// contention and unknown-commit errors are never such.
    fn from_data(e: &StoreError) -> bool;

    /// Which of `leases` have their run recorded under their token and
    /// session with their outcome, as `(token, session, outcome)`: a read of
    /// the runs, made only for leases a batch refused. The session is part
    /// of it so that a caller naming another session's lease learns nothing
    /// of that session's runs from its answer.
    fn recorded(
        &self,
        leases: &[(&Lease, RunOutcome)],
    ) -> impl Future<Output = Result<HashSet<(i64, i64, String)>, StoreError>> + Send;
}

/// Writes `batch`; when a transaction fails with an error that
/// [`CompleteOnce::from_data`] blames on the data, halves it and writes each
/// half the same way, down to the failing outcome alone. That one is tried once
/// more with its error text replaced by a note (so its key still backs off or
/// parks as its outcome says), and answered with the error if even that fails.
///
/// Any other error is the outer error while nothing was written; once a part
/// has committed it becomes the answer of every lease not yet written instead.
pub(crate) async fn complete_in_parts<E: CompleteOnce>(
    engine: &E,
    batch: &[LeaseComplete<'_>],
) -> Result<Settlements, StoreError> {
    complete_callers_in_parts(engine, batch, &[batch.len()]).await
}

/// [`complete_in_parts`] for a batch made of several callers' batches, one
/// after the other, `callers` long each (a store's completion group): one
/// caller's repeat of a lease is the caller's own, another caller's is
/// not (see [`answer_the_recorded`]).
pub(crate) async fn complete_callers_in_parts<E: CompleteOnce>(
    engine: &E,
    batch: &[LeaseComplete<'_>],
    callers: &[usize],
) -> Result<Settlements, StoreError> {
    debug_assert_eq!(callers.iter().sum::<usize>(), batch.len());
    let mut answers: Vec<Option<Result<(), StoreError>>> = batch.iter().map(|_| None).collect();
    let mut todo = Vec::with_capacity(1);
    todo.push(0..batch.len());
    let mut written = false;
    while let Some(part) = todo.pop() {
        match engine.complete_once(&batch[part.clone()]).await {
            Ok(got) => {
                for (slot, answer) in answers[part].iter_mut().zip(got) {
                    *slot = Some(answer);
                }
                written = true;
            }
            Err(e) if E::from_data(&e) && part.len() > 1 => {
                tracing::warn!(error = %e, outcomes = part.len(), "a completion batch failed; writing it in halves");
                let mid = part.start + part.len() / 2;
                todo.extend([mid..part.end, part.start..mid]);
            }
            Err(e) if E::from_data(&e) => {
                let answer = alone(engine, &batch[part.start], e).await;
                written |= answer.is_ok();
                answers[part.start] = Some(answer);
            }
            Err(e) if !written => return Err(e),
            Err(e) => {
                todo.push(part);
                unwritten(&mut answers, &todo, &e);
                break;
            }
        }
    }
    let mut answers: Answers = answers
        .into_iter()
        .map(|a| a.expect("each lease is in one part, which is written or answered"))
        .collect();
    let earlier = answer_the_recorded(engine, batch, callers, &mut answers).await;
    Ok(answers
        .into_iter()
        .enumerate()
        .map(|(n, answer)| {
            answer.map(|()| {
                if earlier.contains(&n) {
                    Written::Earlier
                } else {
                    Written::Now
                }
            })
        })
        .collect())
}

/// Answers `Ok` each lease of `batch` that was refused (`LeaseLost`,
/// `SessionExpired`) although its run is recorded under its token and
/// session with the outcome it asks for: an earlier try of the same
/// completion committed, and this one changes nothing, as a refusal would
/// not, but says the truth. A lease whose token its own caller's batch
/// settled at another position stays refused (a repeat within one batch is
/// the caller's); a retry from another caller that met its first try in the
/// same group is answered as any retry. So does one whose run ended
/// otherwise (reclaimed: `expired`; given back: `canceled`). When the read
/// fails, the refusals stand: they are what the caller got before. Returns
/// the positions it answered so.
async fn answer_the_recorded<E: CompleteOnce>(
    engine: &E,
    batch: &[LeaseComplete<'_>],
    callers: &[usize],
    answers: &mut Answers,
) -> HashSet<usize> {
    let mut earlier = HashSet::new();
    let mut refused: Vec<usize> = (0..batch.len())
        .filter(|&n| {
            answers[n]
                .as_ref()
                .is_err_and(StoreError::is_lease_rejection)
        })
        .collect();
    if refused.is_empty() {
        // The common batch: nothing to look up.
        return earlier;
    }
    let caller: Vec<usize> = callers
        .iter()
        .enumerate()
        .flat_map(|(c, &len)| std::iter::repeat_n(c, len))
        .collect();
    let settled: HashSet<(usize, i64)> = batch
        .iter()
        .zip(answers.iter())
        .enumerate()
        .filter(|(_, (_, answer))| answer.is_ok())
        .map(|(n, (params, _))| (caller[n], params.lease.token.0))
        .collect();
    refused.retain(|&n| !settled.contains(&(caller[n], batch[n].lease.token.0)));
    if refused.is_empty() {
        return earlier;
    }
    let asked: Vec<(&Lease, RunOutcome)> = refused
        .iter()
        .map(|&n| (batch[n].lease, RunOutcome::of(batch[n].outcome)))
        .collect();
    let recorded = match engine.recorded(&asked).await {
        Ok(recorded) => recorded,
        Err(e) => {
            tracing::debug!(error = %e, "cannot tell whether refused completions were recorded by an earlier try");
            return earlier;
        }
    };
    for n in refused {
        let lease = batch[n].lease;
        let asked = (
            lease.token.0,
            lease.session.0,
            RunOutcome::of(batch[n].outcome).as_str().to_owned(),
        );
        if recorded.contains(&asked) {
            tracing::debug!(key = %lease.key, "a retried completion was recorded by its earlier try");
            answers[n] = Ok(());
            earlier.insert(n);
        }
    }
    earlier
}

/// The last try for one outcome the database refused: the same outcome with
/// its error text replaced by a note naming the refusal.
async fn alone<E: CompleteOnce>(
    engine: &E,
    params: &LeaseComplete<'_>,
    refused: StoreError,
) -> Result<(), StoreError> {
    let note = clean_text(&format!(
        "[drover could not store this run's error: {}]",
        error_chain(&refused)
    ))
    .into_owned();
    let outcome = match params.outcome {
        Outcome::Transient(_) => Outcome::Transient(note),
        Outcome::Permanent(_) => Outcome::Permanent(note),
        Outcome::Done | Outcome::RequeueAfter(_) => return Err(refused),
    };
    let one = [LeaseComplete {
        lease: params.lease,
        outcome: &outcome,
        trace_id: params.trace_id,
    }];
    tracing::error!(key = %params.lease.key, error = %refused, "an outcome could not be stored; storing it without its error text");
    match engine.complete_once(&one).await {
        Ok(mut got) => got.pop().unwrap_or(Err(refused)),
        Err(_) => Err(refused),
    }
}

/// Answers every lease of the `todo` parts with a copy of `e`.
fn unwritten(
    answers: &mut [Option<Result<(), StoreError>>],
    todo: &[Range<usize>],
    e: &StoreError,
) {
    for part in todo {
        for slot in &mut answers[part.clone()] {
            *slot = Some(Err(e.duplicate()));
        }
    }
}
