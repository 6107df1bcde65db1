//! Trace contexts carried from an enqueue to the run it causes (DESIGN.md
//! rule 14): W3C `traceparent`/`tracestate` as text, so the store needs no
//! tracing crate. An item keeps the contexts of the enqueues coalesced into its
//! next run, at most the first and the last [`TRACE_LINKS_KEPT`], and counts
//! the rest; a claim moves them to the run, whose span links to each (a run
//! that ends without an outcome, released or expired, gives them back to the
//! key's next run, which does the work they asked for). A run
//! that ends keeps its own span's [`TraceId`] in its history row, so the
//! dashboard and the API can point at it in a tracing UI.

/// How many of the first, and how many of the last, enqueues' contexts an
/// item keeps for its next run; the ones between are only counted
/// ([`TraceLinks::dropped`]). A key enqueued ten thousand times between two
/// runs stores 16 contexts, not ten thousand, and a trace still shows the
/// change that first asked for the run and the latest ones.
pub const TRACE_LINKS_KEPT: usize = 8;

/// One W3C trace context (<https://www.w3.org/TR/trace-context/>): a valid
/// `traceparent` (version `00`, non-zero trace and span ids) and an optional
/// `tracestate`, kept as given (at most 512 bytes, printable ASCII).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// Why a trace context was refused: W3C says a receiver ignores a malformed
/// header and carries on, so callers log this and enqueue without a context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid trace context: {0}")]
pub struct InvalidTraceContext(&'static str);

/// The longest `tracestate` kept (W3C asks for 512 bytes to be supported).
const MAX_TRACESTATE_BYTES: usize = 512;

impl TraceContext {
    /// Checks `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero)
    /// and `tracestate` (printable ASCII, at most 512 bytes; an empty one is
    /// dropped).
    pub fn new(traceparent: &str, tracestate: Option<&str>) -> Result<Self, InvalidTraceContext> {
        let traceparent = traceparent.trim();
        let parts: Vec<&str> = traceparent.split('-').collect();
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let [version, trace_id, span_id, flags] = parts[..] else {
            return Err(InvalidTraceContext("traceparent is not four fields"));
        };
        if version != "00" || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
            return Err(InvalidTraceContext(
                "traceparent is not 00-<32 hex>-<16 hex>-<2 hex>",
            ));
        }
        if trace_id.bytes().all(|b| b == b'0') || span_id.bytes().all(|b| b == b'0') {
            return Err(InvalidTraceContext("traceparent has an all-zero id"));
        }
        let tracestate = tracestate.map(str::trim).filter(|s| !s.is_empty());
        if let Some(state) = tracestate
            && (state.len() > MAX_TRACESTATE_BYTES
                || !state.bytes().all(|b| (b' '..=b'~').contains(&b)))
        {
            return Err(InvalidTraceContext(
                "tracestate is over 512 bytes or not printable ASCII",
            ));
        }
        Ok(Self {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate.map(str::to_owned),
        })
    }

    /// A context received from a carrier (HTTP headers, the environment),
    /// as W3C asks a receiver to take it: a malformed `traceparent` is
    /// refused, a malformed `tracestate` is dropped and the `traceparent`
    /// kept (the trace goes on without the vendors' state). The second value
    /// says why the `tracestate` was dropped, for the caller to log.
    pub fn received(
        traceparent: &str,
        tracestate: Option<&str>,
    ) -> Result<(Self, Option<InvalidTraceContext>), InvalidTraceContext> {
        match Self::new(traceparent, tracestate) {
            Ok(context) => Ok((context, None)),
            Err(e) => Self::new(traceparent, None).map(|context| (context, Some(e))),
        }
    }

    /// The `traceparent` value.
    #[must_use]
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, if any.
    #[must_use]
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32 hex digits of the trace id.
    #[must_use]
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// Whether the caller sampled its span (the `sampled` flag): only then
    /// is it exported, and only then is its trace id worth keeping.
    #[must_use]
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }

    /// The stored form: the `traceparent`, then a space and the `tracestate`
    /// when there is one (a `traceparent` has no space).
    #[cfg(feature = "_engine")]
    pub(crate) fn stored(&self) -> String {
        match &self.tracestate {
            Some(state) => format!("{} {state}", self.traceparent),
            None => self.traceparent.clone(),
        }
    }

    /// Reads [`stored`](Self::stored) text back; `None` if it is not valid
    /// (a hand-written row), so a bad link never fails a run.
    #[cfg(feature = "_engine")]
    pub(crate) fn from_stored(text: &str) -> Option<Self> {
        let (parent, state) = match text.split_once(' ') {
            Some((parent, state)) => (parent, Some(state)),
            None => (text, None),
        };
        Self::new(parent, state).ok()
    }
}

/// A W3C trace id: 16 bytes, not all zero, written as 32 lowercase hex
/// digits (the form `traceparent` and every tracing UI use). A run's history
/// row keeps the trace id of the run's exported span; an unreadable stored
/// value reads as none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(u128);

impl TraceId {
    /// Reads 32 lowercase hex digits, not all zero.
    pub fn parse(hex: &str) -> Result<Self, InvalidTraceContext> {
        let digits = hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        match u128::from_str_radix(hex, 16) {
            Ok(id) if digits && id != 0 => Ok(Self(id)),
            _ => Err(InvalidTraceContext(
                "a trace id is 32 lowercase hex digits, not all zero",
            )),
        }
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl serde::Serialize for TraceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The contexts of the enqueues a run absorbed: the first and the last
/// [`TRACE_LINKS_KEPT`] in the order they came, and how many between were
/// dropped. Empty when no enqueue carried a context (tracing off).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceLinks {
    /// The kept contexts, oldest first.
    pub links: Vec<TraceContext>,
    /// How many contexts were dropped between the first and the last kept.
    pub dropped: u64,
}

/// The stored JSON of [`TraceLinks`] (`{"links": [...], "dropped": n}`), as
/// the engines' SQL appends to it.
#[cfg(feature = "_engine")]
#[derive(Debug, serde::Deserialize)]
struct Stored {
    links: Vec<String>,
    #[serde(default)]
    dropped: u64,
}

impl TraceLinks {
    /// Reads the stored JSON; `None` (no column value) or unreadable JSON is
    /// empty: a link is a help for debugging, never a reason to fail a run.
    #[cfg(feature = "_engine")]
    pub(crate) fn from_json(json: Option<&str>) -> Self {
        let Some(stored) = json.and_then(|j| serde_json::from_str::<Stored>(j).ok()) else {
            return Self::default();
        };
        Self {
            links: stored
                .links
                .iter()
                .filter_map(|s| TraceContext::from_stored(s))
                .collect(),
            dropped: stored.dropped,
        }
    }

    /// Whether there is nothing to link to.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.links.is_empty() && self.dropped == 0
    }
}

/// The bridge to OpenTelemetry's types, for the spans the runner builds and
/// the context an enqueue takes from the current `tracing` span.
#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::TraceContext;

    impl TraceContext {
        /// The context of the current `tracing` span, when it is recorded
        /// into an OpenTelemetry trace; `None` when tracing is off (a
        /// disabled span costs one check).
        #[must_use]
        pub fn current() -> Option<Self> {
            let span = tracing::Span::current();
            if span.is_disabled() {
                return None;
            }
            Self::of_span(&span.context().span().span_context().clone())
        }

        /// The context of an OpenTelemetry span, if it is valid.
        #[must_use]
        pub fn of_span(span: &SpanContext) -> Option<Self> {
            if !span.is_valid() {
                return None;
            }
            let traceparent = format!(
                "00-{}-{}-{:02x}",
                span.trace_id(),
                span.span_id(),
                span.trace_flags().to_u8()
            );
            let state = span.trace_state().header();
            Self::new(&traceparent, Some(&state)).ok()
        }

        /// As an OpenTelemetry span context (remote), to link or parent to.
        #[must_use]
        pub fn span_context(&self) -> SpanContext {
            let p = &self.traceparent;
            // `new` checked the fields' lengths and hex digits.
            let trace_id = TraceId::from_hex(&p[3..35]).unwrap_or(TraceId::INVALID);
            let span_id = SpanId::from_hex(&p[36..52]).unwrap_or(SpanId::INVALID);
            let flags = u8::from_str_radix(&p[53..55], 16).unwrap_or(0);
            let state = self
                .tracestate
                .as_deref()
                .and_then(|s| s.parse::<TraceState>().ok())
                .unwrap_or_default();
            SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    #[cfg(feature = "_engine")]
    fn a_valid_traceparent_keeps_its_state_and_trace_id() {
        let ctx = TraceContext::new(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            TraceContext::from_stored(&ctx.stored()).as_ref(),
            Some(&ctx)
        );
        let bare = TraceContext::new(PARENT, Some("")).unwrap();
        assert_eq!(bare.tracestate(), None);
        assert_eq!(bare.stored(), PARENT);
    }

    #[test]
    fn a_received_context_drops_a_malformed_tracestate_and_keeps_its_traceparent() {
        let long = "k=".to_owned() + &"v".repeat(600);
        for bad in [long.as_str(), "k=caf\u{e9}", "k=\tv"] {
            let (ctx, dropped) = TraceContext::received(PARENT, Some(bad)).expect(bad);
            assert_eq!(
                (ctx.traceparent(), ctx.tracestate()),
                (PARENT, None),
                "{bad:?}"
            );
            assert!(dropped.is_some(), "{bad:?}");
        }
        let (ctx, dropped) = TraceContext::received(PARENT, Some("k=v")).expect("valid");
        assert_eq!((ctx.tracestate(), dropped.is_none()), (Some("k=v"), true));
        assert!(TraceContext::received("00-nonsense", Some("k=v")).is_err());
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(TraceContext::new(bad, None).is_err(), "{bad:?}");
        }
        assert!(TraceContext::new(PARENT, Some("a=\u{1}")).is_err());
    }

    #[test]
    fn a_trace_id_is_32_lowercase_hex_digits_not_all_zero() {
        let id = TraceId::parse("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        assert_eq!(id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let small = TraceId::parse("0000000000000000000000000000000a").unwrap();
        assert_eq!(small.to_string(), "0000000000000000000000000000000a");
        for bad in [
            "",
            "00000000000000000000000000000000",
            "4BF92F3577B34DA6A3CE929D0E0E4736",
            "+bf92f3577b34da6a3ce929d0e0e4736",
            "4bf92f3577b34da6a3ce929d0e0e473",
            "4bf92f3577b34da6a3ce929d0e0e47360",
        ] {
            assert!(TraceId::parse(bad).is_err(), "{bad:?}");
        }
        let ctx = TraceContext::new(PARENT, None).unwrap();
        assert!(ctx.sampled());
        let unsampled = TraceContext::new(&PARENT.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.sampled());
    }
}
