//! Text a worker or a caller wrote (a key, a process name, an error, an
//! actor), made safe to print on an operator's terminal.
//!
//! Keys, process names and errors may hold any character but NUL. Printed as
//! they are, a newline in one forges a line of its own (`… done by=cli`) and an
//! escape sequence recolours the terminal or moves its cursor. Every line a
//! command prints for a person goes through [`shown`]; `--json` output needs
//! nothing, since JSON escapes control characters itself.

/// `text` with its control characters (a newline, a carriage return, an
/// escape) written as Rust escapes (`\n`, `\r`, `\u{1b}`), so it can neither
/// start a line of its own nor send the terminal a command; and with the
/// invisible characters that reorder or hide text (bidirectional overrides
/// and isolates, zero-width ones) written as `\u{…}`, so a line cannot be made
/// to read as another.
pub(crate) fn shown(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else if invisible(c) {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// Format characters a terminal draws as nothing: zero-width spaces and
/// joiners, the bidirectional marks, embeddings, overrides and isolates, and
/// the byte-order mark.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}'
    )
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn text_shown_cannot_start_a_line_or_send_escapes() {
        assert_eq!(shown("vm-42/ü"), "vm-42/ü");
        assert_eq!(
            shown("k\n[other] forged\u{1b}[31mred\r"),
            "k\\n[other] forged\\u{1b}[31mred\\r"
        );
        assert_eq!(
            shown("vm-1\u{202E}kcab\u{200B}"),
            "vm-1\\u{202e}kcab\\u{200b}"
        );
    }
}
