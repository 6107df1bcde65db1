-- Fleet controls (issue 15), as on PostgreSQL: per-process pause, cluster-wide
-- concurrency limit and rate limit (a token bucket on the database clock;
-- `rate_tokens` at `rate_tokens_at` in milliseconds, NULL: full). Claims run in
-- one `BEGIN IMMEDIATE` writer transaction, so reading these, counting the
-- running keys and claiming cannot interleave with another claim.
ALTER TABLE drover_processes ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE drover_processes ADD COLUMN concurrency INTEGER;
ALTER TABLE drover_processes ADD COLUMN rate_per_s REAL;
ALTER TABLE drover_processes ADD COLUMN rate_burst INTEGER NOT NULL DEFAULT 1;
ALTER TABLE drover_processes ADD COLUMN rate_tokens REAL;
ALTER TABLE drover_processes ADD COLUMN rate_tokens_at INTEGER;
