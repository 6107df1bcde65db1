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
        let path = format!("/v1/processes/{}/{action}", path_segment(process));
        let answer: PauseResponse = self
            .call(Method::POST, &path, None::<&()>, CALL_TIMEOUT)
            .await
            .map_err(Failure::into_store)?;
        Ok(answer.changed)
    }
}
