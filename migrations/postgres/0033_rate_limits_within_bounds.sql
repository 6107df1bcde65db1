-- A rate limit stays within the bounds the store takes (`MIN_RATE_PER_S`,
-- `MAX_RATE_PER_S`: 1e-9 to 1,000,000 runs per second).
--
-- Before the store refused rates below the least one, a rate such as 5e-324
-- could be stored; every later claim of its process failed in
-- drover_claim_gated's refill ("value out of range: underflow"), so the
-- process never ran again until its limit was changed. Such rates become the
-- least one (one run in about 32 years, as near the rate asked for as the
-- bucket can count), any above the most become the most, and a check keeps
-- hand-written SQL from storing them again.
UPDATE drover_processes SET rate_per_s = 1e-9 WHERE rate_per_s < 1e-9;
UPDATE drover_processes SET rate_per_s = 1e6 WHERE rate_per_s > 1e6;
ALTER TABLE drover_processes ADD CONSTRAINT drover_processes_rate_bounds
    CHECK (rate_per_s BETWEEN 1e-9 AND 1e6);
