//! How a name goes into a URL: the API's paths (a client calling
//! `/v1/processes/{process}/pause`) and the dashboard's links both put a
//! process name or a key in as one path segment, so any name round-trips.

/// A name as one URL path segment: every byte but RFC 3986's unreserved
/// characters percent-encoded.
pub(crate) fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::path_segment;

    #[test]
    fn a_name_is_one_path_segment_with_only_unreserved_characters_left() {
        assert_eq!(path_segment("provision"), "provision");
        assert_eq!(path_segment("ns/name"), "ns%2Fname");
        assert_eq!(path_segment("<a b>"), "%3Ca%20b%3E");
        assert_eq!(path_segment("ü"), "%C3%BC");
        assert_eq!(path_segment("a-b_c.d~"), "a-b_c.d~");
    }
}
