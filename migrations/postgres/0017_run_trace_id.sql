-- A run's trace id (issue 38, "see it"): the 32 hex digits of the trace of
-- the run's exported span, written with its history row when the run ends,
-- so the dashboard and the API can link to the run in a tracing UI. NULL
-- when the worker did not trace the run, which is always the case with
-- tracing off (nothing more is written then). A nullable column without a
-- default: adding it rewrites nothing.
ALTER TABLE drover_runs ADD COLUMN trace_id text;
