-- Completing a batch of leases joins them to their rows by (session, token).
-- With an index on the session alone, PostgreSQL's generic plan walked every
-- running row of the session once per lease in the batch (1,024 runs × 400
-- outcomes per batch: 25 ms per completion); with the token in the index each
-- lease is one probe, and reclaiming a session still uses the index's prefix.
DROP INDEX drover_items_leases;
CREATE INDEX drover_items_leases
    ON drover_items (lease_session, lease_token) WHERE state = 'running';

-- History is appended in time order and pruned or summarised by time ranges
-- only, so a block-range index serves those scans at a fraction of a B-tree's
-- cost on every insert.
DROP INDEX drover_history_at;
CREATE INDEX drover_history_at ON drover_history USING brin (at);

-- Listing running or parked keys by key needs an index, but one over every
-- state was a fourth index to maintain on each claim and enqueue, and with
-- statistics that had seen no running rows the planner chose it to look leases
-- up (a scan of every running row per completion). Pending keys, the bulk, are
-- listed through the (process, key) unique index instead.
DROP INDEX drover_items_state;
CREATE INDEX drover_items_settled ON drover_items (process, key) WHERE state <> 'pending';
