-- Shard schema 2 -> 3: the keys search filters on, derived from the metadata at push time
-- (service/unitkeys.py). Run in one write transaction, followed by the rows' keys (rows.migrate_shard).
ALTER TABLE units ADD COLUMN project TEXT;
ALTER TABLE units ADD COLUMN is_global INTEGER NOT NULL DEFAULT 0;
UPDATE meta SET value = 3 WHERE key = 'schema_version';
