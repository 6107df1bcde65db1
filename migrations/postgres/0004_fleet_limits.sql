-- Fleet controls (issue 15): per-process pause, cluster-wide concurrency limit
-- and cluster-wide rate limit, stored with the process so every node obeys the
-- same values at its next claim.
--
-- `concurrency`: at most this many of the process's keys running at once
-- (NULL: no limit). `rate_per_s` / `rate_burst`: a token bucket of runs
-- started per second (NULL rate: no limit); `rate_tokens` is the bucket's
-- content at `rate_tokens_at` on the database clock (NULL: full). A claim of a
-- process with any of these set locks the process row, so two claims of it
-- never decide at once; a claim of a process with none set never touches it
-- beyond a primary-key read.
ALTER TABLE drover_processes
    ADD COLUMN paused         BOOLEAN          NOT NULL DEFAULT false,
    ADD COLUMN concurrency    INTEGER,
    ADD COLUMN rate_per_s     DOUBLE PRECISION,
    ADD COLUMN rate_burst     INTEGER          NOT NULL DEFAULT 1,
    ADD COLUMN rate_tokens    DOUBLE PRECISION,
    ADD COLUMN rate_tokens_at TIMESTAMPTZ;
