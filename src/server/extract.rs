//! Request extractors that turn every malformed input into an [`ApiError`] naming
//! the field at fault (axum's own rejections are plain text and name no field).

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::state::AppState;
use crate::store::SessionId;

/// A JSON body, parsed whatever its content type (so `curl -d` works), within the
/// server's body limit (413 beyond it).
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge {
                    limit: state.options.body_limit,
                }
            } else {
                ApiError::field("body", e.body_text())
            }
        })?;
        parse_json(&bytes).map(Self)
    }
}

/// Parses JSON, reporting the path of the first bad field (`keys[2]`).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        bad(&path, &inner.to_string())
    })?;
    de.end()
        .map_err(|e| ApiError::field("body", e.to_string()))?;
    Ok(value)
}

/// Query parameters, with a bad one named in the 400.
#[derive(Debug)]
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(Self)
            .map_err(|e| bad(&e.path().to_string(), &e.into_inner().to_string()))
    }
}

/// Path parameters; a segment that is not valid percent-encoded UTF-8 is a 400.
#[derive(Debug)]
pub(crate) struct PathParams<T>(pub(crate) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| Self(v))
            .map_err(|e: PathRejection| ApiError::field("path", e.body_text()))
    }
}

/// A session id from its path segment.
pub(crate) fn session_id(segment: &str) -> Result<SessionId, ApiError> {
    segment
        .parse()
        .map(SessionId)
        .map_err(|_| ApiError::field("session", format!("{segment:?} is not a session id")))
}

/// A 400 for a deserialisation error at `path` (`.` = the whole value).
fn bad(path: &str, message: &str) -> ApiError {
    if path == "." || path.is_empty() {
        // serde names a missing field only in its message: "missing field `keys`".
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name.to_owned());
        ApiError::BadRequest {
            field: missing,
            message: message.to_owned(),
        }
    } else {
        ApiError::field(path, format!("{path}: {message}"))
    }
}
