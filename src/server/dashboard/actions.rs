//! The admin buttons: retry and park from the item page, then back to it.
//!
//! Browsers send Basic credentials with any form post to this origin, so a post
//! another site triggers is refused: a cross-site `Sec-Fetch-Site` or an
//! `Origin` that is not this host is a 403.

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::Redirect;

use super::item_path;
use super::pages::HtmlError;
use crate::server::auth::{Authorized, Manage, Role};
use crate::server::error::ApiError;
use crate::server::extract::PathParams;
use crate::server::state::AppState;
use crate::store::{ItemPark, ItemRetry, StoreEngine as _};

/// Refuses posts that another site's page made.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let cross_site = text("sec-fetch-site").is_some_and(|site| site == "cross-site");
    let foreign_origin = match (text(header::ORIGIN.as_str()), text(header::HOST.as_str())) {
        (Some(origin), Some(host)) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            origin_host != host
        }
        (Some(_), None) => true,
        _ => false,
    };
    if cross_site || foreign_origin {
        return Err(ApiError::CrossSite);
    }
    Ok(())
}

/// `POST …/retry`: the item is pending at once.
pub(super) async fn retry(
    auth: Result<Authorized<Manage>, ApiError>,
    State(state): State<AppState>,
    headers: HeaderMap,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Redirect, HtmlError> {
    auth?;
    same_origin(&headers)?;
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
    headers: HeaderMap,
    PathParams((process, key)): PathParams<(String, String)>,
) -> Result<Redirect, HtmlError> {
    auth?;
    same_origin(&headers)?;
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
