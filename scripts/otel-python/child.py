"""The command `drover work --exec` runs in tests/tracing.rs: a program that
uses the OpenTelemetry Python SDK as any user's would, to show that it joins
the run's trace.

It reads the run's W3C context from TRACEPARENT and TRACESTATE (the
environment-variable carrier of the OpenTelemetry specification: the
variable names are the header names in capitals), starts one span,
`python child`, as its child, and exports it over OTLP/HTTP to the endpoint
the OTEL_* variables it inherited from drover name. The key is its last
argument. It exits 0 once the span is exported, 1 if the export failed.
"""

import os
import sys

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult


class Recorded(OTLPSpanExporter):
    """The exporter, remembering whether every export succeeded."""

    ok = True

    def export(self, spans):
        result = super().export(spans)
        Recorded.ok = Recorded.ok and result is SpanExportResult.SUCCESS
        return result


def main():
    carrier = {
        name.lower(): os.environ[name]
        for name in ("TRACEPARENT", "TRACESTATE")
        if name in os.environ
    }
    parent = propagate.extract(carrier)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Recorded()))
    tracer = provider.get_tracer("drover-test-child")
    with tracer.start_as_current_span("python child", context=parent) as span:
        span.set_attribute("drover.key", sys.argv[-1])
    provider.shutdown()
    return 0 if Recorded.ok else 1


if __name__ == "__main__":
    sys.exit(main())
