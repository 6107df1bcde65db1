//! A completion batch that one outcome makes fail is written in parts, so the
//! other outcomes land and only the bad one is answered with the error.
//!
//! Written once for both engines: each says which of its errors may come from
//! one outcome's data ([`CompleteOnce::from_data`]) and how to write one
//! transaction ([`CompleteOnce::complete_once`]); this file does the halving.

use std::future::Future;
use std::ops::Range;

use crate::store::StoreError;
use crate::store::error::error_chain;
use crate::store::params::LeaseComplete;
use crate::store::text::clean_text;
use crate::store::types::Outcome;

/// Each lease's answer, by position in the batch.
pub(crate) type Answers = Vec<Result<(), StoreError>>;

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
) -> Result<Answers, StoreError> {
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
    Ok(answers
        .into_iter()
        .map(|a| a.expect("each lease is in one part, which is written or answered"))
        .collect())
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
