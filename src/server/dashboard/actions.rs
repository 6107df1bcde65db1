//! The admin buttons: retry and park from the item page, then back to it;
//! retry, park or delete every key of an error group from the process page,
//! then back to that.
//!
//! Browsers send Basic credentials with any form post to this origin, so a post
//! that another site's page makes must not act: the server's
//! [origin guard](crate::server::origin), a layer around every route, refuses
//! it with 403 before these handlers run.

use axum::extract::{Request, State};
use axum::response::Redirect;
use serde::Deserialize;

use super::item::{ItemName, ProcessName};
use super::item_path;
use super::layout::{HtmlError, process_path};
use crate::server::auth::{Authorized, Manage};
use crate::server::error::ApiError;
use crate::server::extract::{PathParams, QueryParams, body_of};
use crate::server::operations::process_pause;
use crate::server::role::Role;
use crate::server::state::AppState;
use crate::store::{
    Item, ItemFilter, ItemPark, ItemRetry, ItemsDelete, ItemsPark, ItemsRetry, StoreEngine as _,
    StoreError,
};

/// `POST /ui/processes/{process}/items/{key}/{retry|park}`: the item is
/// pending at once, or parked until the next enqueue or retry.
pub(super) async fn item(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, key, action)): PathParams<(String, String, String)>,
) -> Result<Redirect, HtmlError> {
    act(auth?, &state, process, key, &action).await
}

/// `POST /ui/item/{retry|park}?process=…&key=…`: the same, for names a
/// browser cannot send as path segments (see [`item_path`]).
pub(super) async fn item_by_query(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams(action): PathParams<String>,
    QueryParams(name): QueryParams<ItemName>,
) -> Result<Redirect, HtmlError> {
    act(auth?, &state, name.process, name.key, &action).await
}

/// Retries or parks the item `key` of `process`, then back to its page.
async fn act(
    _auth: Authorized<Manage>,
    state: &AppState,
    process: String,
    key: String,
    action: &str,
) -> Result<Redirect, HtmlError> {
    let back = item_path(&process, &key);
    let actor = Role::Admin.to_string();
    let store = &state.store;
    let acted = match action {
        "retry" => {
            let params = ItemRetry {
                process,
                key,
                actor,
            };
            store.item_retry(params).await
        }
        "park" => {
            let params = ItemPark {
                process,
                key,
                reason: "parked by an operator from the dashboard".into(),
                actor,
            };
            store.item_park(params).await
        }
        _ => return Err(ApiError::NotFound("no such action".into()).into()),
    };
    back_to_item(acted, &back)
}

/// What an item's button answers once the store acted: back to the item's
/// page, or 404 when there was no such item (and the error page when the
/// store refused, as for a running key).
fn back_to_item(
    acted: Result<Option<Item>, StoreError>,
    back: &str,
) -> Result<Redirect, HtmlError> {
    acted
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::NotFound("no such item".into()))?;
    Ok(Redirect::to(back))
}

/// The form of an error group's buttons: the signature as text (a
/// program's post), or percent-encoded, as the dashboard's buttons send it
/// (a browser sends a form field's line breaks as CRLF, whatever they were).
#[derive(Debug, Deserialize)]
struct GroupForm {
    signature: Option<String>,
    signature_encoded: Option<String>,
}

impl GroupForm {
    /// The signature the form names.
    fn signature(self) -> Result<String, ApiError> {
        match (self.signature, self.signature_encoded) {
            (Some(text), None) => Ok(text),
            (None, Some(encoded)) => percent_decoded(&encoded).ok_or_else(|| {
                ApiError::field(
                    "signature_encoded",
                    "a percent-encoded UTF-8 signature (%XX for every byte but A-Z a-z 0-9 - . _ ~)",
                )
            }),
            _ => Err(ApiError::field(
                "signature",
                "a form with a signature (or a signature_encoded)",
            )),
        }
    }
}

/// `text` with every `%XX` replaced by its byte, if the result is UTF-8 and
/// every `%` is followed by two hex digits: how the dashboard's forms send
/// a caller's text whose line breaks a browser would rewrite (a group's
/// signature, the key search's process).
pub(super) fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(b);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `POST /ui/processes/{process}/errors/{retry|park|delete}`: every failing
/// key of the error group named by the form's `signature`, as the API's bulk
/// actions do it.
pub(super) async fn group(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, action)): PathParams<(String, String)>,
    request: Request,
) -> Result<Redirect, HtmlError> {
    act_on_group(auth, &state, process, &action, request).await
}

/// `POST /ui/process/errors/{retry|park|delete}?process=…`: the same, for
/// a process named `.` or `..` (see [`process_path`]).
pub(super) async fn group_by_query(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams(action): PathParams<String>,
    QueryParams(name): QueryParams<ProcessName>,
    request: Request,
) -> Result<Redirect, HtmlError> {
    act_on_group(auth, &state, name.process, &action, request).await
}

/// Acts on every key of the group the form names, then back to the
/// process's page.
async fn act_on_group(
    auth: Result<Authorized<Manage>, ApiError>,
    state: &AppState,
    process: String,
    action: &str,
    request: Request,
) -> Result<Redirect, HtmlError> {
    // The caller is checked before the body is read: refused, it sends
    // nothing the server waits for or holds.
    auth?;
    let body = body_of(request, state).await?;
    let form: GroupForm = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ApiError::field("signature", format!("a form with a signature: {e}")))?;
    let signature = form.signature()?;
    let back = process_path(&process, &[]);
    state.slow_reads.forget(&process);
    let filter = ItemFilter::new(process).error_signature(signature);
    let actor = Role::Admin.to_string();
    let store = &state.store;
    match action {
        "retry" => {
            store
                .items_retry_where(ItemsRetry::new(filter, actor))
                .await
        }
        "park" => {
            let reason = "parked by an operator from the dashboard";
            store
                .items_park_where(ItemsPark::new(filter, actor, reason))
                .await
        }
        "delete" => {
            store
                .items_delete_where(ItemsDelete::new(filter, actor))
                .await
        }
        _ => return Err(ApiError::NotFound("no such action".into()).into()),
    }
    .map_err(ApiError::from)?;
    Ok(Redirect::to(&back))
}

/// `POST /ui/processes/{process}/{pause|resume}`: pauses or resumes it, then
/// back to its page.
pub(super) async fn switch(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, action)): PathParams<(String, String)>,
) -> Result<Redirect, HtmlError> {
    flip(auth?, &state, process, &action).await
}

/// `POST /ui/process/{pause|resume}?process=…`: the same, for a process
/// named `.` or `..` (see [`process_path`]).
pub(super) async fn switch_by_query(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams(action): PathParams<String>,
    QueryParams(name): QueryParams<ProcessName>,
) -> Result<Redirect, HtmlError> {
    flip(auth?, &state, name.process, &action).await
}

/// Pauses or resumes `process`, then back to its page.
async fn flip(
    _auth: Authorized<Manage>,
    state: &AppState,
    process: String,
    action: &str,
) -> Result<Redirect, HtmlError> {
    let paused = match action {
        "pause" => true,
        "resume" => false,
        _ => return Err(ApiError::NotFound("no such action".into()).into()),
    };
    let back = process_path(&process, &[]);
    process_pause(state, process, paused).await?;
    Ok(Redirect::to(&back))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::path_segment;

    #[test]
    fn a_percent_encoded_signature_decodes_to_its_text_and_a_malformed_one_to_none() {
        let text = "exit <n>\r\nstderr: <key> 100% full\n";
        assert_eq!(percent_decoded(&path_segment(text)).as_deref(), Some(text));
        for bad in ["%", "%4", "%zz", "%C3", "%%41"] {
            assert_eq!(percent_decoded(bad), None, "{bad}");
        }
    }
}
