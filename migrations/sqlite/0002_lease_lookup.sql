-- Completing a batch of leases looks each up by (session, token); the token in
-- the index makes that one probe per lease, and reclaiming a session still uses
-- the index's prefix (as on PostgreSQL).
DROP INDEX drover_items_leases;
CREATE INDEX drover_items_leases
    ON drover_items (lease_session, lease_token) WHERE state = 'running';

-- Listing running or parked keys by key: an index over those states only, so
-- claims and enqueues of pending keys do not maintain it (as on PostgreSQL).
DROP INDEX drover_items_state;
CREATE INDEX drover_items_settled ON drover_items (process, key) WHERE state <> 'pending';
