//! DNS rebinding: an open server (no tokens, so every caller is an admin)
//! answers only requests addressed to it by a name a stranger cannot own.
//!
//! A page on `rebind.attacker.example` can make that name resolve to
//! 127.0.0.1 after it loaded; the browser then sends the page's requests to
//! drover as same-origin ones (`Host`, `Origin` and `Sec-Fetch-Site` all
//! agree), so the cross-origin guard ([`origin`](super::origin)) cannot tell,
//! and reads need no credentials at all. The name in `Host` is the tell: an
//! open server accepts only
//!
//! - an IP address (a page can only rebind a *name*; a page whose origin is an
//!   address is that address);
//! - `localhost` and names under `.localhost` (browsers resolve them to the
//!   loopback interface themselves, never through DNS: RFC 6761);
//! - the names given with [`ServerOptions::allowed_hosts`](super::ServerOptions::allowed_hosts)
//!   (`drover serve --allowed-host NAME`).
//!
//! Anything else is refused with 403 `host_not_allowed` before any work. A
//! request with no host at all is not a browser's and passes. A server with
//! tokens checks no host: a rebinding page holds no token.

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

use super::error::ApiError;
use super::state::AppState;

/// Middleware: refuses a request to an open server that names a host it does
/// not answer to.
pub(crate) async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.options.requires_tokens() {
        return next.run(req).await;
    }
    match request_host(req.uri(), req.headers()) {
        Some(host) if !allowed(&host, &state.options.allowed_hosts) => {
            ApiError::HostNotAllowed(host).into_response()
        }
        _ => next.run(req).await,
    }
}

/// The host name the request was sent to, without its port: the authority of
/// an absolute-form URI or HTTP/2's `:authority` first, else `Host`. `None`
/// when there is none (not a browser's request). A `Host` that is not text
/// comes back as it reads lossily, and so is refused.
fn request_host(uri: &Uri, headers: &HeaderMap) -> Option<String> {
    let authority = match uri.authority() {
        Some(authority) => authority.clone(),
        None => {
            let value = headers.get(header::HOST)?;
            match value
                .to_str()
                .ok()
                .and_then(|v| v.parse::<Authority>().ok())
            {
                Some(authority) => authority,
                None => return Some(String::from_utf8_lossy(value.as_bytes()).into_owned()),
            }
        }
    };
    Some(authority.host().to_owned())
}

/// Whether an open server answers to `host` (see the module doc).
fn allowed(host: &str, extra: &[String]) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || extra
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(&name))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn host_of(host: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(host).expect("header"));
        request_host(&Uri::from_static("/v1/processes"), &headers)
    }

    #[test]
    fn addresses_and_loopback_names_are_answered() {
        for host in [
            "127.0.0.1:7420",
            "127.0.0.1",
            "[::1]:7420",
            "10.1.2.3:80",
            "localhost:7420",
            "LOCALHOST",
            "localhost.",
            "drover.localhost:7420",
        ] {
            let name = host_of(host).expect("a host");
            assert!(allowed(&name, &[]), "{host} ({name})");
        }
    }

    #[test]
    fn other_names_are_refused_unless_allowed() {
        let name = host_of("rebind.attacker.example:7420").expect("a host");
        assert_eq!(name, "rebind.attacker.example");
        assert!(!allowed(&name, &[]));
        assert!(!allowed("localhost.attacker.example", &[]));
        assert!(!allowed("127.0.0.1.nip.io", &[]));
        assert!(allowed(&name, &["Rebind.Attacker.Example".to_owned()]));
    }

    #[test]
    fn the_absolute_uri_names_the_host_before_the_header() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("localhost"));
        let uri = Uri::from_static("http://evil.example:7420/v1/processes");
        assert_eq!(
            request_host(&uri, &headers).as_deref(),
            Some("evil.example")
        );
        assert_eq!(
            request_host(&Uri::from_static("/"), &HeaderMap::new()),
            None
        );
    }

    #[test]
    fn a_host_that_is_not_an_authority_is_refused() {
        let name = host_of("bad host").expect("a host");
        assert!(!allowed(&name, &[]));
    }
}
