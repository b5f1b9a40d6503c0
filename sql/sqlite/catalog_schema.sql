-- Tenant catalog: tenants/<tenant>/catalog.db (docs/design.md §5). cid -> day, expiry, seq.
-- Rebuildable from the shards; a row here whose shard row is missing was never acked.
CREATE TABLE IF NOT EXISTS catalog (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,   -- per-tenant acknowledgement order
    cid          TEXT NOT NULL UNIQUE,
    day          TEXT NOT NULL,
    timestamp    INTEGER NOT NULL,
    source       TEXT NOT NULL,
    digest       TEXT NOT NULL,                       -- sha256(content): identity check for collisions
    expires_at   INTEGER NOT NULL,
    parent_cid   TEXT,
    reserved_ms  INTEGER NOT NULL,
    thread       TEXT,                                -- its thread and place in it (docs/design.md §3)
    tpos         INTEGER
);
CREATE INDEX IF NOT EXISTS catalog_parent ON catalog(parent_cid) WHERE parent_cid IS NOT NULL;
CREATE INDEX IF NOT EXISTS catalog_expires ON catalog(expires_at);

-- One row per day shard: which shards can still hold live units.
CREATE TABLE IF NOT EXISTS days (
    day             TEXT PRIMARY KEY,
    max_expires_at  INTEGER NOT NULL,
    min_expires_at  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);
-- 2: threads (thread, tpos and their indexes; an older catalog is migrated: threads.migrate)
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', 2);
