-- Whose turn it is to prune each process (issue 39: many nodes on one
-- database). Every controller on a database and every `drover serve` runs a
-- pruner, and each walked every process's history in full, so N nodes read
-- (and tried to delete) N times what one needs. A pruner now prunes a
-- process only while it holds the process's turn: it takes the turn when
-- nobody holds it or the holder's has run out, and renews its own at each
-- tick; a holder that stops renewing (a node gone) loses the turn when
-- `held_until` passes, and the next node's tick takes it. Kept apart from
-- drover_processes, whose row claims may lock.
CREATE TABLE drover_prune_turns (
    process TEXT COLLATE "C" PRIMARY KEY
            REFERENCES drover_processes (process) ON DELETE CASCADE,
    -- The pruner holding the turn (a random number each pruner draws).
    holder  BIGINT      NOT NULL,
    -- On the database clock: the turn is free from then on.
    held_until TIMESTAMPTZ NOT NULL
);
