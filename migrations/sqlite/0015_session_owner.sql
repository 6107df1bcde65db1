-- Who may act on a session (DESIGN.md rule 13): a fingerprint of the bearer
-- token that started it through `drover serve` (see src/server/owner.rs),
-- NULL for sessions started otherwise (a library worker on the database).
-- The server refuses heartbeats, claims, completions and closes of a session
-- from any other token.
ALTER TABLE drover_sessions ADD COLUMN owner TEXT;
