//! The operator's calls a [`Client`] makes for the CLI (`drover pause
//! --server`): admin routes, with an admin's token.

use reqwest::Method;

use super::http::{CALL_TIMEOUT, Client, Failure};
use crate::api::{PauseResponse, path_segment};
use crate::store::StoreError;

impl Client {
    /// Pauses (`true`) or resumes (`false`) a process for every node, as
    /// [`process_pause`](crate::store::StoreEngine::process_pause) does;
    /// whether it changed anything. Needs an admin's token.
    pub async fn process_pause(&self, process: &str, paused: bool) -> Result<bool, StoreError> {
        let action = if paused { "pause" } else { "resume" };
        // A URL's path cannot carry a segment `.` or `..` (the HTTP client
        // removes it, `%2e` too, before it sends): such a name goes in the
        // query instead, on the route the server keeps for it.
        let path = if process == "." || process == ".." {
            format!("/v1/process/{action}?process={}", path_segment(process))
        } else {
            format!("/v1/processes/{}/{action}", path_segment(process))
        };
        let answer: PauseResponse = self
            .call(Method::POST, &path, None::<&()>, CALL_TIMEOUT)
            .await
            .map_err(Failure::into_store)?;
        Ok(answer.changed)
    }
}
