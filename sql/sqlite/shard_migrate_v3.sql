-- Shard schema 2 -> 3: the keys search filters on, derived from the metadata at push time
-- (service/unitkeys.py), and threads (each unit's thread and place in it, as the catalog has them). Run in one
-- write transaction, followed by the rows' keys and threads (rows.migrate_shard); the read index is rebuilt.
ALTER TABLE units ADD COLUMN project TEXT;
ALTER TABLE units ADD COLUMN is_global INTEGER NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN thread TEXT;
ALTER TABLE units ADD COLUMN tpos INTEGER;
UPDATE meta SET value = 3 WHERE key = 'schema_version';
