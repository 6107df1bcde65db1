#!/usr/bin/env bash
# Creates a Python virtual environment with the OpenTelemetry SDK and its
# OTLP/HTTP exporter at the versions pinned in requirements.txt (every
# package, so a new release upstream changes nothing here), for
# tests/tracing.rs's test of a command that joins its run's trace.
#
#   scripts/otel-python/setup.sh [VENV]     (default: target/otel-python)
#
# Prints the line that points the test at it:
#   DROVER_TEST_OTEL_PYTHON=VENV/bin/python
# Running it again on an existing environment only reinstalls what differs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-$here/../../target/otel-python}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
venv="$(cd "$venv" && pwd)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
# What the test checks first: the SDK and the exporter import.
"$venv/bin/python" -c 'import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter'
echo "DROVER_TEST_OTEL_PYTHON=$venv/bin/python"
