//! Cross-origin protection: another site's page must not be able to make a
//! browser change state on drover.
//!
//! A browser attaches what it holds for this server — the Basic credentials of
//! the dashboard's login prompt, or nothing at all on an open server, which
//! needs none — to any request to it, whichever page makes it. And an HTML form
//! on any site can post a `text/plain` body that parses as JSON, which the API
//! reads whatever the content type (so that `curl -d` works). So every
//! state-changing request (any method but `GET`, `HEAD` and `OPTIONS`) that a
//! browser marks as coming from another origin is refused, by the rule of Go
//! 1.25's `net/http.CrossOriginProtection`:
//!
//! 1. `Sec-Fetch-Site` present (current browsers, over HTTPS or to localhost):
//!    `same-origin` and `none` (typed or bookmarked by the user) pass;
//!    `same-site` and `cross-site` are refused.
//! 2. Otherwise `Origin` present (older browsers, or plain HTTP to another
//!    host): it passes only when its `host[:port]` is the request's host; a
//!    `null` origin (a sandboxed frame, a file) is refused.
//! 3. Neither: not a browser request, or a same-origin one from a browser too
//!    old to say — curl, drover's client and other programs pass untouched.
//!
//! The `Origin` check cannot see the scheme (the `Host` header has none), so an
//! `http://` page posting to the same host and port over HTTPS passes; HSTS
//! closes that gap, and browsers that send `Sec-Fetch-Site` never reach it.
//! Reads are never refused, so they must never change state.
//!
//! [`guard`] is a layer around every route, so it decides before
//! authentication and before the body is read: a refused request costs no
//! database work and never touches the handler.

use axum::extract::Request;
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

use super::error::{ApiError, CrossOrigin};

/// The fetch-metadata header naming where the request came from.
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Middleware: answers a cross-origin state-changing request with 403
/// `cross_origin` and passes every other one on.
pub(crate) async fn guard(req: Request, next: Next) -> Response {
    match check(req.method(), req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refused) => ApiError::CrossOrigin(refused).into_response(),
    }
}

/// The rule (see the module doc): `Ok` when the request may go on.
pub(crate) fn check(method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), CrossOrigin> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    // As Go's `Header.Get`: the first value, and an empty one counts as absent.
    let present = |name| headers.get(name).filter(|v| !v.is_empty());
    let text = |value: &HeaderValue| value.to_str().ok().map(str::to_owned);
    if let Some(site) = present(SEC_FETCH_SITE) {
        return match site.as_bytes() {
            b"same-origin" | b"none" => Ok(()),
            _ => Err(CrossOrigin::FetchSite(text(site))),
        };
    }
    let Some(origin) = present(header::ORIGIN) else {
        return Ok(());
    };
    let host = request_host(uri, headers);
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .filter(|(scheme, _)| !scheme.is_empty())
        .map(|(_, host)| host);
    match (origin_host, host) {
        (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(CrossOrigin::Origin {
            origin: text(origin),
            host: host.map(str::to_owned),
        }),
    }
}

/// The host the request was sent to, with its port when one was given: the
/// authority of an absolute-form URI or HTTP/2's `:authority`, which take
/// precedence over `Host` (RFC 9112 §3.2.2, RFC 9113 §8.3.1), else `Host`.
fn request_host<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    let from_uri = uri.authority().map(Authority::as_str).map(|authority| {
        authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host)
    });
    from_uri.or_else(|| headers.get(header::HOST)?.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_post(pairs: &[(&'static str, &str)]) -> Result<(), CrossOrigin> {
        check_with(&Method::POST, "/v1/processes/x/items", pairs)
    }

    fn check_with(
        method: &Method,
        uri: &str,
        pairs: &[(&'static str, &str)],
    ) -> Result<(), CrossOrigin> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).expect("visible ASCII"));
        }
        check(method, &uri.parse().expect("uri"), &headers)
    }

    #[test]
    fn sec_fetch_site_passes_only_same_origin_and_none() {
        assert_eq!(check_post(&[("sec-fetch-site", "same-origin")]), Ok(()));
        assert_eq!(check_post(&[("sec-fetch-site", "none")]), Ok(()));
        for site in ["cross-site", "same-site", "Same-Origin", "garbage"] {
            assert_eq!(
                check_post(&[("sec-fetch-site", site)]),
                Err(CrossOrigin::FetchSite(Some(site.into()))),
                "{site}"
            );
        }
    }

    #[test]
    fn sec_fetch_site_decides_even_when_origin_matches() {
        let pairs = [
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://drover:7420"),
            ("host", "drover:7420"),
        ];
        assert!(check_post(&pairs).is_err());
        let pairs = [
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://evil.example"),
            ("host", "drover:7420"),
        ];
        assert_eq!(check_post(&pairs), Ok(()));
    }

    #[test]
    fn origin_passes_only_when_it_is_the_host() {
        let same = [("origin", "http://drover:7420"), ("host", "drover:7420")];
        assert_eq!(check_post(&same), Ok(()));
        let https = [
            ("origin", "https://Drover.example"),
            ("host", "drover.example"),
        ];
        assert_eq!(check_post(&https), Ok(()), "hosts compare without case");
        let evil = [("origin", "http://evil.example"), ("host", "drover:7420")];
        assert_eq!(
            check_post(&evil),
            Err(CrossOrigin::Origin {
                origin: Some("http://evil.example".into()),
                host: Some("drover:7420".into()),
            })
        );
    }

    #[test]
    fn the_port_is_part_of_the_origin() {
        let other_port = [("origin", "http://drover:8080"), ("host", "drover:7420")];
        assert!(check_post(&other_port).is_err());
        let no_port = [("origin", "http://drover"), ("host", "drover:7420")];
        assert!(check_post(&no_port).is_err());
        let default_port = [("origin", "http://drover"), ("host", "drover")];
        assert_eq!(check_post(&default_port), Ok(()));
    }

    #[test]
    fn an_ipv6_host_matches_its_bracketed_origin() {
        let same = [("origin", "http://[::1]:7420"), ("host", "[::1]:7420")];
        assert_eq!(check_post(&same), Ok(()));
        let other = [("origin", "http://[::2]:7420"), ("host", "[::1]:7420")];
        assert!(check_post(&other).is_err());
    }

    #[test]
    fn a_null_or_schemeless_origin_is_refused() {
        for origin in ["null", "drover:7420", "://drover:7420"] {
            let pairs = [("origin", origin), ("host", "drover:7420")];
            assert!(check_post(&pairs).is_err(), "{origin}");
        }
    }

    #[test]
    fn an_origin_without_a_host_to_match_is_refused() {
        let refused = check_post(&[("origin", "http://drover:7420")]);
        assert_eq!(
            refused,
            Err(CrossOrigin::Origin {
                origin: Some("http://drover:7420".into()),
                host: None,
            })
        );
    }

    #[test]
    fn an_absolute_uri_names_the_host_before_the_host_header() {
        let pairs = [("origin", "http://drover:7420"), ("host", "elsewhere")];
        let absolute = "http://drover:7420/v1/sessions";
        assert_eq!(check_with(&Method::POST, absolute, &pairs), Ok(()));
        let with_user = "http://me@drover:7420/v1/sessions";
        assert_eq!(check_with(&Method::POST, with_user, &pairs), Ok(()));
    }

    #[test]
    fn requests_without_browser_headers_pass() {
        assert_eq!(check_post(&[]), Ok(()));
        assert_eq!(check_post(&[("host", "drover:7420")]), Ok(()));
        assert_eq!(
            check_post(&[("sec-fetch-site", ""), ("origin", "")]),
            Ok(()),
            "empty headers count as absent"
        );
    }

    #[test]
    fn safe_methods_pass_whatever_the_headers_say() {
        let pairs = [("sec-fetch-site", "cross-site"), ("origin", "null")];
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert_eq!(check_with(&method, "/", &pairs), Ok(()), "{method}");
        }
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(check_with(&method, "/", &pairs).is_err(), "{method}");
        }
    }

    #[test]
    fn the_refusal_names_what_the_browser_sent() {
        let site = CrossOrigin::FetchSite(Some("cross-site".into()));
        assert_eq!(site.to_string(), "Sec-Fetch-Site is cross-site");
        let origin = CrossOrigin::Origin {
            origin: Some("null".into()),
            host: Some("drover:7420".into()),
        };
        assert_eq!(
            origin.to_string(),
            "Origin null is not this server (drover:7420)"
        );
    }
}
