//! What a viewer token does not see: fencing tokens (DESIGN.md rule 13).
//!
//! A viewer may watch the workers and the runs, but a fencing token with its
//! session id is what a completion carries, so it is shown only to the roles
//! that may act on leases. (A session's acts are also refused to every token
//! but its own, see `owner.rs`; this keeps the tokens from leaking at all.)

use super::auth::Authorized;
use super::role::Role;
use crate::api::{ItemBody, ItemDetailBody, RunBody, SessionListBody};

/// Whether `auth`'s caller is shown fencing tokens.
pub(crate) fn shows_tokens<C>(auth: &Authorized<C>) -> bool {
    auth.role >= Role::Worker
}

/// `sessions` without their leases' fencing tokens unless `shown`.
pub(crate) fn sessions(mut sessions: SessionListBody, shown: bool) -> SessionListBody {
    if !shown {
        for lease in sessions
            .sessions
            .iter_mut()
            .flat_map(|s| s.leases.iter_mut())
        {
            lease.token = None;
        }
    }
    sessions
}

/// `runs` without their fencing tokens unless `shown`.
pub(crate) fn runs(mut runs: Vec<RunBody>, shown: bool) -> Vec<RunBody> {
    if !shown {
        for run in &mut runs {
            run.token = None;
        }
    }
    runs
}

/// `detail` without its fencing tokens unless `shown`.
pub(crate) fn item(mut detail: ItemDetailBody, shown: bool) -> ItemDetailBody {
    if !shown {
        detail.item.lease_token = None;
        detail.runs = runs(detail.runs, false);
    }
    detail
}

/// `items` (a page of the item list or of triage) without their leases'
/// fencing tokens unless `shown`.
pub(crate) fn items(mut items: Vec<ItemBody>, shown: bool) -> Vec<ItemBody> {
    if !shown {
        for item in &mut items {
            item.lease_token = None;
        }
    }
    items
}
