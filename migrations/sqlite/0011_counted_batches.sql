-- The burn-down's hot path (issue 13): a claim or a completion of many keys
-- adjusts the item counts once per statement instead of once per row.
--
-- SQLite has no statement-level triggers, so migration 0007's trigger changed
-- a counts row for every item a claim started or a completion left idle: about
-- as much work as the claim itself. The store's batch statements now bump
-- `counts_mark` on the rows they change and update the counts themselves,
-- once, in the same transaction; the trigger skips exactly those rows (their
-- mark changed) and still counts every other writer's changes: other store
-- statements, the `drover_enqueue` view, `drover watch` triggers and
-- hand-written SQL leave the mark alone. A writer that changes the mark must
-- count the rows itself.
ALTER TABLE drover_items ADD COLUMN counts_mark INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER drover_items_counted_update;
CREATE TRIGGER drover_items_counted_update AFTER UPDATE OF state ON drover_items
    WHEN old.state <> new.state AND new.counts_mark = old.counts_mark
BEGIN
    UPDATE drover_item_counts SET n = n + CASE state WHEN new.state THEN 1 ELSE -1 END
    WHERE process = new.process AND state IN (old.state, new.state);
END;
