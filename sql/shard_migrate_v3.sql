-- Shard schema 2 -> 3: threads. Each unit's thread and place in it, as the catalog has them (filled by
-- rows.migrate_shard after these statements; the read index is rebuilt with them). One write transaction.
ALTER TABLE units ADD COLUMN thread TEXT;
ALTER TABLE units ADD COLUMN tpos INTEGER;
UPDATE meta SET value = 3 WHERE key = 'schema_version';
