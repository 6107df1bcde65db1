-- The item counts follow a TRUNCATE of drover_items. The counting triggers
-- (0007) are per statement on INSERT, UPDATE and DELETE, and a TRUNCATE fires
-- none of them: it empties the table in one step. The counts then kept what
-- was there, and since a limited process's claim reads its running count from
-- them (drover_running_count, 0016), runs that no longer existed would hold
-- its claims back for good. An operator who empties the table by hand (a
-- reset, a restore of a test database) now empties the counts with it, in the
-- same transaction.
CREATE FUNCTION drover_items_counted_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM drover_item_count_deltas;
    DELETE FROM drover_item_counts;
    RETURN NULL;
END $$;

CREATE TRIGGER drover_items_counted_truncate AFTER TRUNCATE ON drover_items
    FOR EACH STATEMENT EXECUTE FUNCTION drover_items_counted_truncate();
