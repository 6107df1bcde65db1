-- One index over the running rows instead of two, as SQLite's 0013 did
-- (issue 39's PostgreSQL burn-down).
--
-- A claim's update cannot be HOT (it changes `state`, which the partial
-- indexes name), so it writes an entry into every index whose condition the
-- running row meets: the primary key, the unique `(process, key)`, the lease
-- index `(lease_session, lease_token)` and the index of running and parked keys
-- by `(process, key)`. That last one was one of the eight index entries a key's
-- claim → completion → run row wrote (one write-ahead-log record and a random
-- leaf page each), for queries that need it rarely:
--   - listing running keys in key order reads them from the lease index and
--     sorts them: they are as many as the fleet's runs;
--   - the concurrency gate counts one process's running rows the same way.
-- Parked keys keep an index in key order for the dashboard and the API's lists;
-- parking is rare, so keeping it costs the hot path nothing but the test of
-- its condition.
DROP INDEX drover_items_settled;
CREATE INDEX drover_items_parked ON drover_items (process, key) WHERE state = 'parked';
