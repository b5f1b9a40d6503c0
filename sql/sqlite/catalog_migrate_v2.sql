-- Catalog schema 1 -> 2: threads. The columns; threads.migrate then assigns every unit its thread
-- and place, in acknowledgement order, by the push's rules (metadata.session aside: the catalog holds no
-- metadata). One write transaction.
ALTER TABLE catalog ADD COLUMN thread TEXT;
ALTER TABLE catalog ADD COLUMN tpos INTEGER;
UPDATE meta SET value = 2 WHERE key = 'schema_version';
