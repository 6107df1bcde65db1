//! The operator's calls a [`Client`] makes for the CLI (`drover pause
//! --server`): admin routes, with an admin's token.

use reqwest::Method;

use super::http::{CALL_TIMEOUT, Client, Failure};
use crate::api::PauseResponse;
use crate::store::StoreError;

impl Client {
    /// Pauses (`true`) or resumes (`false`) a process for every node, as
    /// [`process_pause`](crate::store::StoreEngine::process_pause) does;
    /// whether it changed anything. Needs an admin's token.
    pub async fn process_pause(&self, process: &str, paused: bool) -> Result<bool, StoreError> {
        let action = if paused { "pause" } else { "resume" };
        let path = format!("/v1/processes/{}/{action}", path_segment(process));
        let answer: PauseResponse = self
            .call(Method::POST, &path, None::<&()>, CALL_TIMEOUT)
            .await
            .map_err(Failure::into_store)?;
        Ok(answer.changed)
    }
}

/// A name as one URL path segment: every byte but the unreserved ones
/// percent-encoded.
fn path_segment(name: &str) -> String {
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
    fn a_process_name_is_one_path_segment() {
        assert_eq!(path_segment("provision"), "provision");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(path_segment("ü"), "%C3%BC");
    }
}
