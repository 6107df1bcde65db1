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

use super::item_path;
use super::layout::HtmlError;
use crate::api::path_segment;
use crate::server::auth::{Authorized, Manage};
use crate::server::error::ApiError;
use crate::server::extract::{PathParams, body_of};
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
    auth?;
    let back = item_path(&process, &key);
    let actor = Role::Admin.to_string();
    let store = &state.store;
    let acted = match action.as_str() {
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

/// The form of an error group's buttons.
#[derive(Debug, Deserialize)]
struct GroupForm {
    signature: String,
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
    // The caller is checked before the body is read: refused, it sends
    // nothing the server waits for or holds.
    auth?;
    let body = body_of(request, &state).await?;
    let form: GroupForm = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ApiError::field("signature", format!("a form with a signature: {e}")))?;
    let back = format!("/ui/processes/{}", path_segment(&process));
    state.slow_reads.forget(&process);
    let filter = ItemFilter::new(process).error_signature(form.signature);
    let actor = Role::Admin.to_string();
    let store = &state.store;
    match action.as_str() {
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
    auth?;
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => return Err(ApiError::NotFound("no such action".into()).into()),
    };
    let back = format!("/ui/processes/{}", path_segment(&process));
    process_pause(&state, process, paused).await?;
    Ok(Redirect::to(&back))
}
