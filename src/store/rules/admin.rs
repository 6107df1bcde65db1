//! The rule every engine applies to an operator's retry, park or delete: only an
//! item no lease holds may be changed, so an operator never races a worker.

use crate::store::error::StoreError;

/// Decides from the item's stored state (`None` = no row) whether the action may
/// go ahead: `Ok(false)` when there is no item, [`StoreError::AlreadyLeased`] when
/// it is running, `Ok(true)` otherwise.
pub(crate) fn admit(process: &str, key: &str, stored: Option<&str>) -> Result<bool, StoreError> {
    match stored {
        None => Ok(false),
        Some("running") => Err(StoreError::AlreadyLeased {
            process: process.to_owned(),
            key: key.to_owned(),
        }),
        Some(_) => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_items_are_refused_and_missing_ones_reported() {
        assert!(!admit("p", "k", None).expect("no item"));
        assert!(admit("p", "k", Some("parked")).expect("parked"));
        assert!(matches!(
            admit("p", "k", Some("running")),
            Err(StoreError::AlreadyLeased { .. })
        ));
    }
}
