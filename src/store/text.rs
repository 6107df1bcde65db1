//! Free text that drover stores but did not write itself — a run's error (a
//! command's stderr, a library error, an HTTP outcome), an operator's park
//! reason, a session's component name — made storable once, here, for every
//! engine: PostgreSQL refuses NUL in text (SQLSTATE 22021), and an unbounded
//! error would bloat every history page that shows it. Without this, one such
//! outcome failed its whole completion batch, again on every retry.

use std::borrow::Cow;

/// The most bytes of one stored text: a command's stderr tail or an error chain
/// fits many times over, and a history page of them stays small.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;

/// What replaces a NUL character: the Unicode replacement character, as
/// invalid UTF-8 becomes when decoded lossily.
const NUL_STAND_IN: &str = "\u{FFFD}";

/// `text` as drover stores it: every NUL replaced by U+FFFD and, past
/// [`MAX_TEXT_BYTES`], cut at a character boundary with a marker saying how
/// many bytes were cut (the marker counts within the limit). Borrowed when
/// nothing needed changing, which is the common case.
#[must_use]
pub fn clean_text(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_TEXT_BYTES && !text.contains('\0') {
        return Cow::Borrowed(text);
    }
    let text = text.replace('\0', NUL_STAND_IN);
    if text.len() <= MAX_TEXT_BYTES {
        return Cow::Owned(text);
    }
    // The marker is at most 40 bytes; cut leaves room for it.
    let mut cut = MAX_TEXT_BYTES - 40;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let marker = format!(" … [{} bytes cut]", text.len() - cut);
    Cow::Owned(format!("{}{marker}", &text[..cut]))
}

/// Bytes that should be text (a command's output) as a `String`, invalid
/// UTF-8 replaced by U+FFFD, then [`clean_text`]ed.
#[must_use]
pub fn text_from_bytes(bytes: &[u8]) -> String {
    clean_text(&String::from_utf8_lossy(bytes)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        assert!(matches!(
            clean_text("exit 1: boom"),
            Cow::Borrowed("exit 1: boom")
        ));
    }

    #[test]
    fn nul_becomes_the_replacement_character() {
        assert_eq!(clean_text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
    }

    #[test]
    fn long_text_is_cut_at_a_char_boundary_with_a_marker_within_the_limit() {
        let text = "é".repeat(MAX_TEXT_BYTES); // two bytes each
        let cleaned = clean_text(&text);
        assert!(cleaned.len() <= MAX_TEXT_BYTES, "{}", cleaned.len());
        assert!(
            cleaned.ends_with(" bytes cut]"),
            "{}",
            &cleaned[cleaned.len() - 30..]
        );
        let kept = cleaned.split(" … [").next().expect("a kept part");
        assert!(kept.chars().all(|c| c == 'é'));
        let cut: usize = cleaned
            .rsplit('[')
            .next()
            .and_then(|m| m.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("a byte count");
        assert_eq!(kept.len() + cut, text.len());
    }

    #[test]
    fn a_nul_that_grows_the_text_past_the_limit_is_cut_too() {
        let text = "\0".repeat(MAX_TEXT_BYTES);
        assert!(clean_text(&text).len() <= MAX_TEXT_BYTES);
    }

    #[test]
    fn invalid_utf8_bytes_are_replaced() {
        assert_eq!(text_from_bytes(b"ok \xff\0 end"), "ok \u{FFFD}\u{FFFD} end");
    }
}
