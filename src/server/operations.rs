//! What the API and the dashboard both ask of the store, written once: each
//! checks its input, calls the store and shapes the answer, so a route handler
//! and a dashboard page (or button) differ only in how they answer (JSON or
//! HTML), never in what they read or change.

use std::collections::HashMap;
use std::time::Duration;

use crate::api::{MAX_PAGE, PauseResponse, ProcessSummary, TriageQuery};
use crate::server::error::ApiError;
use crate::server::role::Role;
use crate::server::state::AppState;
use crate::store::{
    HistoryActivity, ItemTriage, MAX_NAME_BYTES, ProcessPause, StoreEngine as _, TriagePage,
    validate_process,
};

/// The window of `recent_finished` / `recent_failed`.
pub(crate) const RECENT: Duration = Duration::from_secs(300);

/// Counts and recent activity per process.
pub(crate) async fn process_summaries(state: &AppState) -> Result<Vec<ProcessSummary>, ApiError> {
    let counts = state.store.process_counts().await?;
    let activity = state
        .store
        .history_activity(HistoryActivity { window: RECENT })
        .await?;
    let recent: HashMap<_, _> = activity
        .into_iter()
        .map(|a| (a.process, (a.finished, a.failed)))
        .collect();
    Ok(counts
        .into_iter()
        .map(|c| {
            let (finished, failed) = recent.get(&c.process).copied().unwrap_or((0, 0));
            ProcessSummary::new(c, finished, failed)
        })
        .collect())
}

/// One page of the triage listing, its query checked.
pub(crate) async fn triage_page(
    state: &AppState,
    process: String,
    query: TriageQuery,
) -> Result<TriagePage, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::field("limit", "limit must be between 1 and 1000"));
    }
    validate_process(&process)?;
    if query
        .prefix
        .as_ref()
        .is_some_and(|p| p.len() > MAX_NAME_BYTES || p.contains('\0'))
    {
        return Err(ApiError::field(
            "prefix",
            "a key prefix is at most 1024 bytes, without NUL",
        ));
    }
    let after = query
        .after
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: crate::store::StoreError| ApiError::field("after", e.to_string()))?;
    let page = state
        .store
        .item_triage(ItemTriage {
            process,
            state: query.state.map(Into::into),
            key_prefix: query.prefix,
            after,
            limit,
        })
        .await?;
    Ok(page)
}

/// Pauses or resumes `process`, as the admin role.
pub(crate) async fn process_pause(
    state: &AppState,
    process: String,
    paused: bool,
) -> Result<PauseResponse, ApiError> {
    validate_process(&process)?;
    let params = ProcessPause {
        process: process.clone(),
        paused,
        actor: Role::Admin.to_string(),
    };
    let changed = state.store.process_pause(params).await?;
    Ok(PauseResponse {
        process,
        paused,
        changed,
    })
}

/// The window the charts and the series route cover.
pub(crate) const SERIES_WINDOW: Duration = Duration::from_secs(3600);

/// The most leases listed per session.
pub(crate) const LEASES_SHOWN: u32 = 100;
