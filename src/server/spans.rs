//! One span per HTTP request (DESIGN.md rule 14), after the OpenTelemetry
//! HTTP server conventions: named `{method} {route}` with the route template
//! (`POST /v1/processes/{process}/items`, never the raw path, so no key is in
//! a span name), kind server, the caller's W3C context (`traceparent`,
//! `tracestate`) as its parent, `http.request.method` (`_OTHER` for a method
//! HTTP does not define, named `HTTP`, with `http.request.method_original`), `http.route`,
//! `url.path`, `url.scheme`, `http.response.status_code`, and an error status
//! for a 5xx answer.
//!
//! With no subscriber interested in [`HTTP_TARGET`] the span is disabled:
//! nothing below reads a header or records a field.

use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, Method, Response};
use tower_http::trace::{DefaultOnResponse, OnResponse as _};
use tracing::Span;
use tracing::field::Empty;

use crate::store::TraceContext;

/// The target of the requests' spans: a subscriber enables it (at `INFO`)
/// to record them; `drover serve` does when it exports traces.
pub const HTTP_TARGET: &str = "drover::http";

/// The request's span (made before its handler runs, inside the router, so
/// the route template is known).
pub(super) fn request_span<B>(req: &Request<B>) -> Span {
    // A method is any token the caller chose: one HTTP does not define is
    // `_OTHER` (with the original beside it) and `HTTP` in the span's name,
    // as the conventions say, so invented methods make no new span names.
    let (method, original) = match *req.method() {
        Method::CONNECT
        | Method::DELETE
        | Method::GET
        | Method::HEAD
        | Method::OPTIONS
        | Method::PATCH
        | Method::POST
        | Method::PUT
        | Method::TRACE => (req.method().as_str(), None),
        _ => ("_OTHER", Some(req.method().as_str())),
    };
    let named = if original.is_some() { "HTTP" } else { method };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let span = tracing::info_span!(
        target: HTTP_TARGET,
        "request",
        otel.name = %match route {
            Some(route) => format!("{named} {route}"),
            // No route (a 404): the method alone, as the conventions say.
            None => named.to_owned(),
        },
        otel.kind = "server",
        otel.status_code = Empty,
        "http.request.method" = method,
        "http.request.method_original" = original,
        "http.route" = route,
        "url.path" = req.uri().path(),
        "url.scheme" = "http",
        "http.response.status_code" = Empty,
        "error.type" = Empty,
    );
    #[cfg(feature = "otel")]
    if !span.is_disabled()
        && let Some(parent) = incoming(req.headers())
    {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let cx = opentelemetry::Context::new().with_remote_span_context(parent.span_context());
        // Fails only without an OpenTelemetry layer, where there is no
        // trace to join.
        span.set_parent(cx).ok();
    }
    span
}

/// Records the answer's status on the request's span (an error status for
/// a 5xx, which is the server's failure; a 4xx is the caller's), then logs
/// it as tower-http does by default.
pub(super) fn record_response<B>(response: &Response<B>, latency: Duration, span: &Span) {
    if !span.is_disabled() {
        let status = response.status();
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            span.record("otel.status_code", "error");
            span.record("error.type", status.as_str());
        }
    }
    DefaultOnResponse::default().on_response(response, latency, span);
}

/// The W3C trace context a request carries (`traceparent`, `tracestate`),
/// taken as W3C asks: a malformed `traceparent` is ignored (the request goes
/// on without a context), a malformed `tracestate` alone is dropped (the
/// request stays in its caller's trace).
pub(super) fn incoming(headers: &HeaderMap) -> Option<TraceContext> {
    let parent = headers.get("traceparent")?.to_str().ok()?;
    // A value that is not visible ASCII is no tracestate: dropped.
    let state = headers.get("tracestate").and_then(|s| s.to_str().ok());
    match TraceContext::received(parent, state) {
        Ok((trace, dropped)) => {
            if let Some(e) = dropped {
                tracing::debug!(error = %e, "tracestate ignored");
            }
            Some(trace)
        }
        Err(e) => {
            tracing::debug!(error = %e, "traceparent ignored");
            None
        }
    }
}

/// The trace context an enqueue keeps for its keys' next run: the request's
/// own span when it is part of an OpenTelemetry trace (a child of the
/// caller's context, or a new trace's root when the request had none), so
/// the run links to the request that asked for it; otherwise the caller's
/// context as it came, for a worker that traces even when this server does
/// not.
pub(crate) fn enqueue_context(headers: &HeaderMap) -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    if let Some(own) = TraceContext::current() {
        return Some(own);
    }
    incoming(headers)
}
