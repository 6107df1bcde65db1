//! How a reconcile error is classified: transient (retry with backoff) or
//! permanent (park until the next change).
//!
//! Marking is by wrapping: [`permanent`] or [`transient`] wraps an error in a
//! marker type, and the runner finds the marker anywhere in the error's `source()`
//! chain — so a marked error keeps its class through `?`, `anyhow` context and
//! `thiserror` `#[source]` wrapping. (The Kubeflow persistence agent compared the
//! outermost error only, so any wrapped error counted as permanent and was dropped.)
//! An error with no marker is transient: never silently dropped.

use std::error::Error as StdError;
use std::fmt;

/// The error type reconcilers return: any error, boxed.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry after the process's backoff.
    Transient,
    /// Park the item until it is enqueued again.
    Permanent,
}

/// An error marked permanent: retrying will not help (bad input, a deleted
/// object). Build it with [`permanent`].
#[derive(Debug)]
pub struct Permanent(BoxError);

/// An error marked transient explicitly (the default for unmarked errors, but an
/// explicit mark wins over a `Permanent` deeper in the chain). Build it with
/// [`transient`].
#[derive(Debug)]
pub struct Transient(BoxError);

macro_rules! marker_impls {
    ($marker:ident) => {
        impl fmt::Display for $marker {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl StdError for $marker {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                self.0.source()
            }
        }
    };
}
marker_impls!(Permanent);
marker_impls!(Transient);

/// Marks `error` permanent.
///
/// ```
/// use drover::runner::{classify, permanent, ErrorClass};
///
/// let err = permanent(std::io::Error::other("object was deleted"));
/// assert_eq!(classify(&err), ErrorClass::Permanent);
/// ```
pub fn permanent(error: impl Into<BoxError>) -> Permanent {
    Permanent(error.into())
}

/// Marks `error` transient.
pub fn transient(error: impl Into<BoxError>) -> Transient {
    Transient(error.into())
}

/// The class of `error`: the outermost marker in its `source()` chain, or
/// [`ErrorClass::Transient`] if there is none.
#[must_use]
pub fn classify(error: &(dyn StdError + 'static)) -> ErrorClass {
    let mut next = Some(error);
    while let Some(err) = next {
        if err.is::<Permanent>() {
            return ErrorClass::Permanent;
        }
        if err.is::<Transient>() {
            return ErrorClass::Transient;
        }
        next = err.source();
    }
    ErrorClass::Transient
}

/// The store outcome a reconcile's result stands for: the action, or the error
/// classified by [`classify`] with its whole chain as the recorded error. Local
/// controllers and HTTP workers both report through it, so both classify alike.
#[must_use]
pub fn outcome_of(result: Result<super::Action, BoxError>) -> crate::store::Outcome {
    use crate::store::Outcome;
    match result {
        Ok(super::Action::Done) => Outcome::Done,
        Ok(super::Action::RequeueAfter(after)) => Outcome::RequeueAfter(after),
        Err(error) => match classify(&*error) {
            ErrorClass::Transient => Outcome::Transient(error_chain(&*error)),
            ErrorClass::Permanent => Outcome::Permanent(error_chain(&*error)),
        },
    }
}

/// The whole chain as one line, `outer: cause: root`, for the history's error.
#[must_use]
pub fn error_chain(error: &(dyn StdError + 'static)) -> String {
    crate::store::error_chain(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum SaveError {
        #[error("saving the run failed")]
        Save(#[source] BoxError),
    }

    fn io(msg: &str) -> std::io::Error {
        std::io::Error::other(msg.to_owned())
    }

    #[test]
    fn unmarked_errors_are_transient() {
        assert_eq!(classify(&io("connection reset")), ErrorClass::Transient);
    }

    #[test]
    fn a_permanent_mark_survives_thiserror_wrapping() {
        let err = SaveError::Save(permanent(io("bad manifest")).into());
        assert_eq!(classify(&err), ErrorClass::Permanent);
    }

    #[test]
    fn a_permanent_mark_survives_anyhow_context() {
        let err = anyhow::Error::new(permanent(io("bad manifest")))
            .context("reconciling default/web")
            .context("worker 3");
        let boxed: BoxError = err.into();
        assert_eq!(classify(&*boxed), ErrorClass::Permanent);
        assert_eq!(
            error_chain(&*boxed),
            "worker 3: reconciling default/web: bad manifest"
        );
    }

    #[test]
    fn the_outermost_mark_wins() {
        let inner: BoxError = permanent(io("looks permanent")).into();
        let err = SaveError::Save(transient(inner).into());
        assert_eq!(classify(&err), ErrorClass::Transient);
    }

    #[test]
    fn a_marker_displays_as_the_error_it_wraps() {
        let err = permanent(io("gone"));
        assert_eq!(err.to_string(), "gone");
    }
}
