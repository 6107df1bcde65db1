//! [`TraceUrl`]: where the dashboard links a run's trace id, a template of the
//! user's tracing UI (`https://tracing.example/trace/{trace_id}`), checked
//! when it is built.

use crate::store::TraceId;

/// The placeholder a [`TraceUrl`] replaces with a run's trace id.
const PLACEHOLDER: &str = "{trace_id}";

/// A link template to a tracing UI: an `http` or `https` URL with a host,
/// holding `{trace_id}` (each occurrence is replaced by the run's 32 hex
/// digits), without spaces, quotes, angle brackets or control characters.
/// Jaeger's is `http://jaeger:16686/trace/{trace_id}`, Grafana Tempo's
/// Explore and Honeycomb's take the id in a query string alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceUrl(String);

/// Why a trace URL template was refused; its message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid trace URL template {template:?}: {reason}")]
pub struct TraceUrlError {
    template: String,
    reason: &'static str,
}

impl TraceUrl {
    /// Checks `template`: scheme `http` or `https`, a host, `{trace_id}`
    /// somewhere, and no character a URL must not hold as it is.
    pub fn parse(template: &str) -> Result<Self, TraceUrlError> {
        let refuse = |reason| TraceUrlError {
            template: template.to_owned(),
            reason,
        };
        let lower = template.to_ascii_lowercase();
        let Some(rest) = ["https://", "http://"]
            .iter()
            .find_map(|scheme| lower.strip_prefix(scheme))
        else {
            return Err(refuse("it must start with http:// or https://"));
        };
        if rest.is_empty() || rest.starts_with(['/', '?', '#']) {
            return Err(refuse("it must name a host after the scheme"));
        }
        if !template.contains(PLACEHOLDER) {
            return Err(refuse(
                "it must contain {trace_id}, where the run's trace id goes",
            ));
        }
        if template
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '<' | '>'))
        {
            return Err(refuse(
                "it must not contain spaces, quotes, angle brackets or control characters",
            ));
        }
        Ok(Self(template.to_owned()))
    }

    /// The link to `trace_id`'s trace.
    #[must_use]
    pub fn link(&self, trace_id: TraceId) -> String {
        self.0.replace(PLACEHOLDER, &trace_id.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_becomes_a_link_with_the_trace_id() {
        let url = TraceUrl::parse("https://ui.example/trace/{trace_id}?x={trace_id}").unwrap();
        let id = TraceId::parse("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        assert_eq!(
            url.link(id),
            "https://ui.example/trace/4bf92f3577b34da6a3ce929d0e0e4736?x=4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(TraceUrl::parse("HTTP://jaeger:16686/trace/{trace_id}").is_ok());
    }

    #[test]
    fn a_template_without_the_placeholder_or_not_http_is_refused() {
        for (bad, says) in [
            ("https://ui.example/trace/", "{trace_id}"),
            ("https://ui.example/trace/{traceid}", "{trace_id}"),
            ("javascript:alert(1)//{trace_id}", "http"),
            ("ftp://ui.example/{trace_id}", "http"),
            ("ui.example/{trace_id}", "http"),
            ("https:///{trace_id}", "host"),
            ("https://", "host"),
            ("https://ui.example/{trace_id} x", "spaces"),
            ("https://ui.example/\"{trace_id}", "quotes"),
            ("https://ui.example/<{trace_id}>", "angle"),
        ] {
            let e = TraceUrl::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
