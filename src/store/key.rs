//! Key and process-name validation, shared by every engine so all of them accept
//! exactly the same names.

use super::error::StoreError;

/// The longest key or process name, in bytes (DESIGN.md: at most 1024 bytes).
pub const MAX_NAME_BYTES: usize = 1024;

/// Why a name is invalid, or `None` when it is fine.
fn problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.len() > MAX_NAME_BYTES {
        Some("must be at most 1024 bytes")
    } else if name.contains('\0') {
        Some("must not contain NUL")
    } else {
        None
    }
}

/// A name cut to 64 characters for error messages.
fn shown(name: &str) -> String {
    name.chars().take(64).collect()
}

/// Accepts a key that is non-empty, at most 1024 bytes and free of NUL; anything
/// else is [`StoreError::InvalidKey`].
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    match problem(key) {
        None => Ok(()),
        Some(reason) => Err(StoreError::InvalidKey {
            key: shown(key),
            reason,
        }),
    }
}

/// Accepts a process name under the same rules as a key; anything else is
/// [`StoreError::InvalidProcess`].
pub fn validate_process(process: &str) -> Result<(), StoreError> {
    match problem(process) {
        None => Ok(()),
        Some(reason) => Err(StoreError::InvalidProcess {
            process: shown(process),
            reason,
        }),
    }
}

/// Accepts a key prefix of a listing or a bulk action that some key could
/// start with: at most [`MAX_NAME_BYTES`] (no key is longer, so a longer one
/// could only match nothing, after reading for it) and free of NUL (no key
/// holds one); anything else is [`StoreError::InvalidArgument`].
#[cfg(feature = "_engine")] // the engines' listings and bulk actions
pub(crate) fn validate_key_prefix(prefix: &str) -> Result<(), StoreError> {
    if prefix.len() > MAX_NAME_BYTES {
        return Err(StoreError::InvalidArgument(format!(
            "a key prefix must be at most {MAX_NAME_BYTES} bytes, as a key is"
        )));
    }
    if prefix.contains('\0') {
        return Err(StoreError::InvalidArgument(
            "a key prefix cannot hold a NUL, as no key does".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_keys_are_accepted() {
        for key in [
            "a",
            "namespace/name",
            "machine-0042",
            "ü",
            &"k".repeat(1024),
        ] {
            assert!(validate_key(key).is_ok(), "{key}");
        }
    }

    #[test]
    fn empty_long_and_nul_keys_are_rejected() {
        for key in ["", "a\0b", &"k".repeat(1025)] {
            assert!(
                matches!(validate_key(key), Err(StoreError::InvalidKey { .. })),
                "{key:?}"
            );
        }
    }

    #[test]
    fn the_limit_counts_bytes_not_characters() {
        assert!(validate_key(&"ü".repeat(512)).is_ok());
        assert!(validate_key(&"ü".repeat(513)).is_err());
    }

    #[test]
    fn process_names_follow_the_key_rules() {
        assert!(validate_process("provision").is_ok());
        assert!(matches!(
            validate_process(""),
            Err(StoreError::InvalidProcess { .. })
        ));
    }
}
