//! What a completion's caller hears back, by position in its batch: the
//! store's answers, and for the server's metrics which call wrote each
//! outcome. Apart from `parts.rs` (engines only) because the store's face
//! (`any.rs`) names them whatever engines are built.

use crate::store::StoreError;

/// Each lease's answer, by position in the batch.
pub(crate) type Answers = Vec<Result<(), StoreError>>;

/// Which call wrote a completion the store answered `Ok`: a count of
/// outcomes (the server's metrics) must count a retried one once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "_engine"),
    expect(dead_code, reason = "only an engine writes completions")
)]
pub(crate) enum Written {
    /// This call wrote it.
    Now,
    /// An earlier try of the same completion did (its answer was lost);
    /// this one changed nothing.
    Earlier,
}

/// Each lease's answer, by position in the batch, telling a retried
/// completion from one written now.
pub(crate) type Settlements = Vec<Result<Written, StoreError>>;

/// `settlements` as the store's callers get them.
pub(crate) fn answers(settlements: Settlements) -> Answers {
    settlements.into_iter().map(|s| s.map(drop)).collect()
}
