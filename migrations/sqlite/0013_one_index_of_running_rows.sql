-- One index over the running rows instead of two (issue 13's burn-down).
--
-- A claim puts each key it starts into every index whose condition its row
-- now meets, and the completion takes it out again. Running rows were in two:
-- the lease index `(lease_session, lease_token)` and the index of running and
-- parked keys by `(process, key)`. Keeping the second cost about 8 % of a
-- burn-down's instructions per key (drover's own statements, valgrind), for
-- queries that need it rarely or not at all:
--   - an enqueue counting the batch's running keys probes the unique
--     `(process, key)` index per key instead;
--   - the concurrency gate reads the running count from `drover_item_counts`,
--     exact in every transaction, instead of counting rows;
--   - listing running keys in key order reads them from the lease index and
--     sorts them: they are as many as the fleet's runs.
-- Parked keys keep an index in key order for the dashboard and the API's
-- lists; parking is rare, so keeping it costs the hot path nothing but the
-- test of its condition.
DROP INDEX drover_items_settled;
CREATE INDEX drover_items_parked ON drover_items (process, key) WHERE state = 'parked';
