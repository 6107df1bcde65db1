-- Resync (issue 15): every idle key of a process becomes pending again once
-- per interval, at a low priority, as the informer's resync re-adds every
-- known object. NULL interval: never (the default).
ALTER TABLE drover_processes
    ADD COLUMN resync_every_ms BIGINT,
    ADD COLUMN resync_jitter   DOUBLE PRECISION NOT NULL DEFAULT 0.1,
    ADD COLUMN resync_priority INTEGER          NOT NULL DEFAULT -100;

-- Where each process's resync walk stands, shared by every node so a fleet
-- walks the keys once per pass, not once per node. Kept apart from
-- drover_processes, whose row claims may lock.
CREATE TABLE drover_resync (
    process            TEXT COLLATE "C" PRIMARY KEY
                       REFERENCES drover_processes (process) ON DELETE CASCADE,
    -- The pass in progress is past this key; NULL between passes.
    walk_key           TEXT COLLATE "C",
    -- When the current (or last) pass started.
    pass_started_at    TIMESTAMPTZ,
    -- The pass so far: the earliest time a key it saw, not yet due, is due,
    -- and how many keys it resynced.
    pass_next_due      TIMESTAMPTZ,
    pass_resynced      BIGINT NOT NULL DEFAULT 0,
    -- The last finished pass: the next key's due time, when it ended, and
    -- how many keys it resynced.
    next_due_at        TIMESTAMPTZ,
    last_pass_ended_at TIMESTAMPTZ,
    last_pass_resynced BIGINT NOT NULL DEFAULT 0
);
