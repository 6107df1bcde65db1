//! `GET /v1/processes/{process}/series`: the data behind the process page's
//! charts, for those who chart elsewhere (or not at all).

use axum::Json;
use axum::extract::State;

use crate::api::ErrorBody;
use crate::api::SeriesBody;
use crate::server::auth::{Authorized, Read};
use crate::server::error::ApiError;
use crate::server::extract::PathParams;
use crate::server::operations::SERIES_WINDOW;
use crate::server::state::AppState;
use crate::store::{ProcessSeries, StoreEngine as _, validate_process};

/// Runs per minute by outcome over the last hour (from the runs table;
/// operator actions are not counted) and the queue depth over the same hour
/// (sampled by `drover serve` about once a minute).
#[utoipa::path(
    get, operation_id = "get_series", path = "/v1/processes/{process}/series", tag = "read",
    security(("bearer" = [])),
    params(("process" = String, Path, description = "The process")),
    responses(
        (status = 200, description = "The last hour's series", body = SeriesBody),
        (status = 404, description = "Unknown process", body = ErrorBody),
    )
)]
pub(crate) async fn get(
    _: Authorized<Read>,
    State(state): State<AppState>,
    PathParams(process): PathParams<String>,
) -> Result<Json<SeriesBody>, ApiError> {
    validate_process(&process)?;
    let series = state
        .store
        .process_series(ProcessSeries {
            process,
            window: SERIES_WINDOW,
        })
        .await?;
    Ok(Json(series.into()))
}
