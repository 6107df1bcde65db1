//! The admin buttons: retry and park from the item page, then back to it.
//!
//! Browsers send Basic credentials with any form post to this origin, so a post
//! that another site's page makes must not act: the server's
//! [origin guard](crate::server::origin), a layer around every route, refuses
//! it with 403 before these handlers run.

use axum::extract::State;
use axum::response::Redirect;

use super::item_path;
use super::pages::HtmlError;
use crate::server::auth::{Authorized, Manage, Role};
use crate::server::error::ApiError;
use crate::server::extract::PathParams;
use crate::server::state::AppState;
use crate::store::{ItemPark, ItemRetry, StoreEngine as _};

/// `POST …/retry`: the item is pending at once.
pub(super) async fn retry(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Redirect, HtmlError> {
    auth?;
    let back = item_path(&process, &key);
    state
        .store
        .item_retry(ItemRetry {
            process,
            key,
            actor: Role::Admin.to_string(),
        })
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::NotFound("no such item".into()))?;
    Ok(Redirect::to(&back))
}

/// `POST …/park`: the item is parked until the next enqueue or retry.
pub(super) async fn park(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Redirect, HtmlError> {
    auth?;
    let back = item_path(&process, &key);
    let params = ItemPark {
        process,
        key,
        reason: "parked by an operator from the dashboard".into(),
        actor: Role::Admin.to_string(),
    };
    state
        .store
        .item_park(params)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::NotFound("no such item".into()))?;
    Ok(Redirect::to(&back))
}
