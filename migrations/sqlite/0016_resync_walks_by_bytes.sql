-- A resync walk on SQLite goes on from the exact bytes of the last key it
-- read, kept in hex (src/store/sqlite/resync.rs): a key that is not UTF-8 is
-- read with U+FFFD, which sorts before its bad bytes, so a walk kept as the
-- key as read met the same key again, and one such key failed every tick.
-- A walk under way goes on from where it was.
UPDATE drover_resync SET walk_key = hex(walk_key) WHERE walk_key IS NOT NULL;
