//! Which OTLP transport the trace export takes, read as OpenTelemetry's
//! standard variables say: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
//! `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`.
//!
//! A value drover cannot export with is refused with the reason, never
//! replaced by another transport: a collector listening for gRPC would not
//! understand HTTP, and spans sent to it would be lost without a word.

use std::fmt;

/// The signal's own variable, read first.
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// The variable for every signal, read when the traces' own is unset.
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";

/// An OTLP transport this binary exports traces with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Protobuf over HTTP/1.1 POSTs to `…/v1/traces`: the default.
    HttpProtobuf,
    /// gRPC (HTTP/2) to the collector's `TraceService`.
    #[cfg(feature = "otlp-grpc")]
    Grpc,
}

/// A protocol variable's value drover does not export with.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    variable: &'static str,
    value: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let accepted = if cfg!(feature = "otlp-grpc") {
            "http/protobuf or grpc"
        } else {
            "http/protobuf (this drover was built without the `otlp-grpc` feature)"
        };
        write!(
            f,
            "{}={:?} is not supported, use {accepted}",
            self.variable, self.value
        )
    }
}

impl Protocol {
    /// The protocol the environment asks for.
    pub(crate) fn from_env() -> Result<Self, Refused> {
        let var = |name| std::env::var(name).ok();
        Self::chosen(var(TRACES_PROTOCOL).as_deref(), var(PROTOCOL).as_deref())
    }

    /// The protocol named by the traces' variable, else the generic one
    /// (an empty value counts as unset, as the SDKs read it).
    fn chosen(traces: Option<&str>, generic: Option<&str>) -> Result<Self, Refused> {
        let (variable, value) = match (set(traces), set(generic)) {
            (Some(value), _) => (TRACES_PROTOCOL, value),
            (None, Some(value)) => (PROTOCOL, value),
            (None, None) => return Ok(Self::HttpProtobuf),
        };
        match value {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            #[cfg(feature = "otlp-grpc")]
            "grpc" => Ok(Self::Grpc),
            _ => Err(Refused {
                variable,
                value: value.to_owned(),
            }),
        }
    }
}

/// The value, unless unset or blank.
fn set(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_means_http_protobuf() {
        assert_eq!(Protocol::chosen(None, None), Ok(Protocol::HttpProtobuf));
        assert_eq!(
            Protocol::chosen(Some(""), Some(" ")),
            Ok(Protocol::HttpProtobuf)
        );
    }

    #[cfg(feature = "otlp-grpc")]
    #[test]
    fn the_traces_variable_wins_over_the_generic_one() {
        assert_eq!(
            Protocol::chosen(Some("grpc"), Some("http/protobuf")),
            Ok(Protocol::Grpc)
        );
        assert_eq!(
            Protocol::chosen(Some("http/protobuf"), Some("grpc")),
            Ok(Protocol::HttpProtobuf)
        );
        assert_eq!(Protocol::chosen(None, Some("grpc")), Ok(Protocol::Grpc));
        assert_eq!(Protocol::chosen(Some(""), Some("grpc")), Ok(Protocol::Grpc));
    }

    #[test]
    fn an_unknown_value_is_refused_naming_its_variable_and_what_is_accepted() {
        let refused = Protocol::chosen(None, Some("http/json")).expect_err("refused");
        let line = refused.to_string();
        assert!(
            line.starts_with(r#"OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported"#),
            "{line}"
        );
        assert!(line.contains("http/protobuf"), "{line}");
        // The traces' own variable is named when it is the one read.
        let refused = Protocol::chosen(Some("GRPC"), Some("grpc")).expect_err("case matters");
        assert!(
            refused
                .to_string()
                .starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=")
        );
    }
}
