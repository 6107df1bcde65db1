//! Input checks every engine applies before an enqueue writes anything.

use std::collections::HashSet;

use crate::store::error::StoreError;
use crate::store::key::{validate_key, validate_process};

/// The batch's distinct keys in first-seen order, after checking the process name
/// and every key: one bad key rejects the whole batch, so nothing is written.
pub(crate) fn checked_keys<'a>(
    process: &str,
    keys: &'a [String],
) -> Result<Vec<&'a str>, StoreError> {
    validate_process(process)?;
    let mut seen = HashSet::with_capacity(keys.len());
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        validate_key(key)?;
        if seen.insert(key.as_str()) {
            out.push(key.as_str());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_count_once_in_first_seen_order() {
        let keys = ["b", "a", "b"].map(String::from);
        assert_eq!(checked_keys("p", &keys).expect("valid"), ["b", "a"]);
    }

    #[test]
    fn one_bad_key_rejects_the_batch() {
        let keys = ["ok", ""].map(String::from);
        assert!(matches!(
            checked_keys("p", &keys),
            Err(StoreError::InvalidKey { .. })
        ));
    }
}
