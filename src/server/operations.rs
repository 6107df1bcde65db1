//! What the API and the dashboard both ask of the store, written once: each
//! checks its input, calls the store and shapes the answer, so a route handler
//! and a dashboard page (or button) differ only in how they answer (JSON or
//! HTML), never in what they read or change.

use std::collections::HashMap;
use std::time::Duration;

use crate::api::{
    MAX_PAGE, PROCESS_PAGE, PauseResponse, ProcessList, ProcessListQuery, ProcessSummary,
    SESSION_PAGE, SessionListQuery, TriageQuery,
};
use crate::server::error::ApiError;
use crate::server::role::Role;
use crate::server::state::AppState;
use crate::store::{
    HistoryActivity, ItemTriage, MAX_NAME_BYTES, Page, ProcessPage, ProcessPause, SessionId,
    SessionInfo, SessionList, StoreEngine as _, TriagePage, validate_process,
};

/// The window of `recent_finished` / `recent_failed`.
pub(crate) const RECENT: Duration = Duration::from_secs(300);

/// `limit` checked against the page bounds (1–[`MAX_PAGE`]), `default` when
/// absent: a 400 naming `limit` otherwise, as for every list.
pub(crate) fn page_limit(limit: Option<u32>, default: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::field(
            "limit",
            format!("limit must be between 1 and {MAX_PAGE}"),
        ))
    }
}

/// Refuses a query parameter that stands for a name (or part of one) but
/// could not be one: longer than [`MAX_NAME_BYTES`] or holding a NUL. A 400
/// naming `field`, saying `rule`; absent is fine.
fn name_like((field, value): (&str, Option<&str>), rule: &str) -> Result<(), ApiError> {
    if value.is_some_and(|v| v.len() > MAX_NAME_BYTES || v.contains('\0')) {
        Err(ApiError::field(field, rule))
    } else {
        Ok(())
    }
}

/// One page of the processes by name, with their counts and recent
/// activity: both read a page of the store (the same range of the process
/// index), never every process.
pub(crate) async fn process_summaries(
    state: &AppState,
    query: ProcessListQuery,
) -> Result<ProcessList, ApiError> {
    let limit = page_limit(query.limit, PROCESS_PAGE)?;
    name_like(
        ("after", query.after.as_deref()),
        "after is a process name: at most 1024 bytes, without NUL",
    )?;
    let page = ProcessPage {
        after: query.after,
        limit,
    };
    let counts = state.store.process_counts(page.clone()).await?;
    let recent = match counts.items.last() {
        Some(last) => recent_activity(state, page, &last.process).await?,
        None => HashMap::new(),
    };
    let processes = counts
        .items
        .into_iter()
        .map(|c| {
            let (finished, failed) = recent.get(&c.process).copied().unwrap_or((0, 0));
            ProcessSummary::new(c, finished, failed)
        })
        .collect();
    Ok(ProcessList {
        processes,
        next: counts.next,
    })
}

/// The recent runs of the processes of `page`, up to `last` (the last
/// process its counts read): the same page again, and the pages after it
/// only if a process created between the two reads pushed `last` out.
async fn recent_activity(
    state: &AppState,
    mut page: ProcessPage,
    last: &str,
) -> Result<HashMap<String, (u64, u64)>, ApiError> {
    let mut recent = HashMap::new();
    loop {
        let activity = state
            .store
            .history_activity(HistoryActivity {
                window: RECENT,
                page: page.clone(),
            })
            .await?;
        let reached = activity
            .items
            .last()
            .is_none_or(|a| a.process.as_str() >= last);
        for a in activity.items {
            if a.process.as_str() <= last {
                recent.insert(a.process, (a.finished, a.failed));
            }
        }
        match activity.next {
            Some(next) if !reached => page.after = Some(next),
            _ => return Ok(recent),
        }
    }
}

/// One page of the sessions, oldest first, each with up to
/// [`LEASES_SHOWN`] of its leases: what `GET /v1/sessions` and the workers
/// page list.
pub(crate) async fn session_page(
    state: &AppState,
    query: SessionListQuery,
) -> Result<Page<SessionInfo, SessionId>, ApiError> {
    let limit = page_limit(query.limit, SESSION_PAGE)?;
    let page = state
        .store
        .session_list(SessionList {
            after: query.after.map(SessionId),
            limit,
            leases_per_session: LEASES_SHOWN,
        })
        .await?;
    Ok(page)
}

/// One page of the triage listing, its query checked.
pub(crate) async fn triage_page(
    state: &AppState,
    process: String,
    query: TriageQuery,
) -> Result<TriagePage, ApiError> {
    let limit = page_limit(query.limit, 100)?;
    validate_process(&process)?;
    name_like(
        ("prefix", query.prefix.as_deref()),
        "a key prefix is at most 1024 bytes, without NUL",
    )?;
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
