//! A caller's name (a process, a key, an error, a worker's host) as the
//! dashboard shows it: escaped by maud, and bidi-isolated, so a name holding
//! right-to-left text or a bidi override (U+202E) reorders only itself, never
//! the words around it ("Process … / …", "on HOST, pid 42").
//!
//! In the page, a name is a `<bdi>` element; where no element may go (the
//! `<title>`, an `<option>`), it is wrapped in U+2068 FIRST STRONG ISOLATE …
//! U+2069 POP DIRECTIONAL ISOLATE, which is what a browser puts around a
//! `<bdi>` before it orders the text. Either way, a PDI of the name's own
//! that closes nothing in it would close that isolate early and let the rest
//! of the name reorder the page; so such a name gets one more isolate for
//! each, and a PDI for each isolate the name leaves open. A name without
//! isolates of its own is shown as it is, so it copies as it is.

use maud::{Markup, html};

/// U+2068 FIRST STRONG ISOLATE.
const FSI: char = '\u{2068}';
/// U+2069 POP DIRECTIONAL ISOLATE.
const PDI: char = '\u{2069}';

/// `name` in a `<bdi>`, with its own isolates balanced.
pub(super) fn name(name: &str) -> Markup {
    html! { bdi { (balanced(name)) } }
}

/// `name` between FSI and PDI, with its own isolates balanced: for text
/// that cannot hold an element.
pub(super) fn isolated(name: &str) -> String {
    format!("{FSI}{}{PDI}", balanced(name))
}

/// `name` with an FSI before it for each PDI of its own that closes
/// nothing in it, and a PDI after it for each isolate it leaves open, so
/// that it closes exactly what it opens.
fn balanced(name: &str) -> String {
    let (mut open, mut stray) = (0_usize, 0_usize);
    for c in name.chars() {
        match c {
            '\u{2066}'..='\u{2068}' => open += 1,
            PDI if open > 0 => open -= 1,
            PDI => stray += 1,
            _ => {}
        }
    }
    let mut out = String::with_capacity(name.len() + 3 * (open + stray));
    out.extend(std::iter::repeat_n(FSI, stray));
    out.push_str(name);
    out.extend(std::iter::repeat_n(PDI, open));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_isolated_and_its_own_isolates_close_exactly_what_they_open() {
        assert_eq!(name("a<b").into_string(), "<bdi>a&lt;b</bdi>");
        assert_eq!(name("x\u{202E}y").into_string(), "<bdi>x\u{202E}y</bdi>");
        assert_eq!(isolated("p"), "\u{2068}p\u{2069}");
        // A stray PDI would close the isolate around it: one more opens.
        assert_eq!(balanced("a\u{2069}\u{202E}b"), "\u{2068}a\u{2069}\u{202E}b");
        // An isolate left open is closed.
        assert_eq!(balanced("\u{2067}a"), "\u{2067}a\u{2069}");
        assert_eq!(
            balanced("\u{2069}\u{2066}a\u{2069}\u{2067}"),
            "\u{2068}\u{2069}\u{2066}a\u{2069}\u{2067}\u{2069}"
        );
    }
}
