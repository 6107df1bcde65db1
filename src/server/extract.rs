//! Request extractors that turn every malformed input into an [`ApiError`] naming
//! the field at fault (axum's own rejections are plain text and name no field).

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::header::CONTENT_LENGTH;
use axum::http::request::Parts;
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::state::AppState;
use crate::store::SessionId;
use crate::store::form_decoded;

/// A JSON body, parsed whatever its content type (so `curl -d` works), within the
/// server's body limit (413 beyond it).
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = body_of(req, state).await?;
        parse_json(&bytes).map(Self)
    }
}

/// The body of `req`, within the server's body limit (413 beyond it) and
/// its client timeout (408 past it). For a
/// handler that checks its caller itself before reading the body (a
/// dashboard form, whose refusal is a page), so that no body is read for a
/// caller refused.
///
/// A body declared over the limit (its `Content-Length`) but not over
/// [`DRAIN_MOST`] is read to its end, and dropped, before it is answered,
/// so the connection stays usable. Answered at once, the connection was
/// closed after the 413 with the body unread, without a word to the client,
/// whose pool sent its next request on it: a broken pipe, so drover's worker
/// could not tell "too large, send less" from a lost request.
pub(crate) async fn body_of(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let limit = u64::try_from(state.options.body_limit).unwrap_or(u64::MAX);
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > limit
    {
        if declared <= DRAIN_MOST {
            // Ends at the body's end, or at its deadline (the client timeout).
            let mut body = req.into_body().into_data_stream();
            while let Some(Ok(_)) = body.next().await {}
        }
        return Err(ApiError::PayloadTooLarge {
            limit: state.options.body_limit,
        });
    }
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge {
                limit: state.options.body_limit,
            }
        } else if timed_out(&e) {
            ApiError::RequestTimeout(state.options.client_timeout)
        } else {
            ApiError::field("body", e.body_text())
        }
    })
}

/// The largest body over the limit that is read to its end before its 413
/// (see [`body_of`]): a batch a client sized for a larger limit, several
/// times over. A bigger one is answered at once, and its connection cut.
const DRAIN_MOST: u64 = 8 * 1024 * 1024;

/// Whether `e` is the body's deadline passing (`RequestBodyDeadlineLayer`),
/// somewhere in its chain of causes.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Parses JSON, reporting the path of the first bad field (`keys[2]`).
///
/// An integer may be written with a fraction of zero or an exponent (`7.0`,
/// `1e3`): JSON Schema calls those integers, and some encoders write every
/// number so (Python's `json` a float, jq after arithmetic). serde refuses
/// them for integer fields, so a body it refuses is read again with such
/// numbers made integers; the common body is parsed once, as before.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body is an object; serde would also read a struct from an array
    // of its fields in order (`[null, null]`), which no caller means.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::field("body", "the body must be a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let first = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        bad(&path, &inner.to_string())
    });
    let value = match first {
        Ok(value) => value,
        Err(refused) => {
            let Some(rewritten) = with_integral_numbers(bytes) else {
                return Err(refused);
            };
            return serde_path_to_error::deserialize(rewritten)
                .map_err(|e| bad(&e.path().to_string(), &e.into_inner().to_string()));
        }
    };
    de.end()
        .map_err(|e| ApiError::field("body", e.to_string()))?;
    Ok(value)
}

/// `bytes` as JSON with every number that has no fractional part made an
/// integer, or `None` if it is not JSON or has no such number (then the first
/// error stands; otherwise the rewritten body's error is the one to report).
fn with_integral_numbers(bytes: &[u8]) -> Option<serde_json::Value> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    make_integral(&mut value).then_some(value)
}

/// Rewrites each float in `value` that is a whole number within `i64` or
/// `u64` as that integer; whether any was rewritten.
fn make_integral(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            // Exact bounds: 2^63 and 2^64 are the first floats out of range.
            let integer = if f.fract() != 0.0 {
                None
            } else if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
                Some(Value::from(f as i64))
            } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                Some(Value::from(f as u64))
            } else {
                None
            };
            integer.map(|i| *value = i).is_some()
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |any, v| make_integral(v) | any),
        Value::Object(fields) => fields
            .values_mut()
            .fold(false, |any, v| make_integral(v) | any),
        _ => false,
    }
}

/// Query parameters, with a bad one named in the 400.
///
/// A name or value whose percent-encoding is not UTF-8 (`%FF`) is refused,
/// as such a path segment is: decoded lossily it would be U+FFFD, another
/// name than the caller's, and a pause by query paused (and created) that.
#[derive(Debug)]
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        not_utf8_parameter(query).map_or(Ok(()), |field| {
            Err(ApiError::field(
                field.clone(),
                format!("{field}: the query parameter is not percent-encoded UTF-8"),
            ))
        })?;
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(Self)
            .map_err(|e| bad(&e.path().to_string(), &e.into_inner().to_string()))
    }
}

/// The first query parameter (its name, or `query` when the name itself is
/// at fault) whose name or value does not percent-decode to UTF-8, as
/// `application/x-www-form-urlencoded` reads it (`+` a space, a `%` without
/// two hex digits kept as it is).
fn not_utf8_parameter(query: &str) -> Option<String> {
    let utf8 = |text: &str| String::from_utf8(form_decoded(text)).ok();
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .find_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match utf8(name) {
                None => Some("query".to_owned()),
                Some(name) => utf8(value).is_none().then_some(name),
            }
        })
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
        // serde names a missing field, or one given twice (`?limit=5&limit=6`),
        // only in its message: "missing field `keys`", "duplicate field `limit`".
        let named = message
            .strip_prefix("missing field `")
            .or_else(|| message.strip_prefix("duplicate field `"))
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name.to_owned());
        ApiError::BadRequest {
            field: named,
            message: message.to_owned(),
        }
    } else {
        ApiError::field(path, format!("{path}: {message}"))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Body {
        attempt: u32,
        session: i64,
        #[serde(default)]
        big: u64,
        #[serde(default)]
        rate: f64,
    }

    fn parsed(text: &str) -> Result<Body, String> {
        parse_json::<Body>(text.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn integers_written_as_whole_floats_are_integers() {
        let expected = Body {
            attempt: 7946,
            session: -136_698_584,
            big: 18_000_000_000_000_000_000,
            rate: 2.0,
        };
        let text = r#"{"attempt": 7946.0, "session": -136698584.0, "big": 1.8e19, "rate": 2.0}"#;
        assert_eq!(parsed(text), Ok(expected));
        let exponent = parsed(r#"{"attempt": 1e3, "session": 0}"#).expect("1e3 is 1000");
        assert_eq!(exponent.attempt, 1000);
    }

    #[test]
    fn a_fraction_or_a_number_out_of_range_is_refused_naming_the_field() {
        for (text, field) in [
            (r#"{"attempt": 1.5, "session": 0}"#, "attempt"),
            (r#"{"attempt": 1, "session": 1e19}"#, "session"),
            (r#"{"attempt": 5e9, "session": 0}"#, "attempt"),
            (r#"{"attempt": 1, "session": 0, "big": -1.0}"#, "big"),
        ] {
            let error = parsed(text).expect_err(text);
            assert!(error.contains(field), "{text}: {error}");
        }
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        for text in ["[7946, 0]", "  [null, null]", "7", "\"text\"", "null", ""] {
            let error = parsed(text).expect_err(text);
            assert!(error.contains("JSON object"), "{text}: {error}");
        }
        assert!(parsed(" \n{\"attempt\": 1, \"session\": 0}").is_ok());
    }

    #[test]
    fn an_outcome_refuses_unknown_fields_whatever_its_type() {
        for text in [
            r#"{"type": "done", "extra": 1}"#,
            r#"{"type": "transient", "error": "e", "extra": 1}"#,
        ] {
            let error = parse_json::<crate::api::OutcomeBody>(text.as_bytes())
                .expect_err(text)
                .to_string();
            assert!(error.contains("unknown field `extra`"), "{text}: {error}");
        }
        let done = parse_json::<crate::api::OutcomeBody>(br#"{"type": "done"}"#);
        assert!(
            matches!(done, Ok(crate::api::OutcomeBody::Done {})),
            "{done:?}"
        );
    }

    #[test]
    fn a_body_refused_for_another_reason_is_refused_for_that_reason() {
        let error =
            parsed(r#"{"attempt": 1.0, "session": 0, "extra": 1}"#).expect_err("unknown field");
        assert!(error.contains("unknown field `extra`"), "{error}");
        let error = parsed(r#"{"attempt": 1, "session": 0} trailing"#).expect_err("trailing");
        assert!(error.contains("trailing"), "{error}");
    }
}
