-- One day shard: primary/YYYY-MM-DD.db (docs/design.md §5). Re-runnable: every new day runs it.
CREATE TABLE IF NOT EXISTS units (
    id          INTEGER PRIMARY KEY,
    cid         TEXT NOT NULL UNIQUE,
    seq         INTEGER NOT NULL,
    type        TEXT NOT NULL,
    source      TEXT NOT NULL,
    timestamp   INTEGER NOT NULL,
    ttl         INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    content     TEXT NOT NULL,
    metadata    TEXT,
    parent_cid  TEXT,
    pushed_ms   INTEGER NOT NULL,
    indexed     INTEGER NOT NULL DEFAULT 0,  -- 0 pending (the durable indexer queue), 1 in FTS5, 2 also in the
                                             -- read index, 3 in it but changed since (service/store/sqlite/readsync.py)
    ntok        INTEGER NOT NULL DEFAULT 0,  -- document length in tokens, for global BM25
    tokens      TEXT,                        -- space-joined tokens (service/tokenize.py), set when indexed
    project     TEXT,                        -- keys derived from the metadata at push time, for search
    is_global   INTEGER NOT NULL DEFAULT 0,  -- filters (service/unitkeys.py; schema 3)
    thread      TEXT,                        -- its thread and place in it, as the catalog has them (schema 3)
    tpos        INTEGER
);
CREATE INDEX IF NOT EXISTS units_pending ON units(id) WHERE indexed = 0;
CREATE INDEX IF NOT EXISTS units_expires ON units(expires_at);
CREATE INDEX IF NOT EXISTS units_parent ON units(parent_cid) WHERE parent_cid IS NOT NULL;
-- The read index's queue: rows in FTS5 that the read index lacks or holds in an older version.
CREATE INDEX IF NOT EXISTS units_unsynced ON units(id) WHERE indexed IN (1, 3);
-- Rows removed (DELETE, expiry purge) that the read index may still hold; n orders them.
CREATE TABLE IF NOT EXISTS read_deletes (n INTEGER PRIMARY KEY AUTOINCREMENT, id INTEGER NOT NULL);

-- Tokens are produced by service/tokenize.py; unicode61 with these tokenchars keeps each one whole.
-- External content (units.tokens): the tokens are stored once, and search reads them from units
-- to count term frequencies for the global BM25. Rows are added and removed explicitly
-- (INSERT rowid/tokens; 'delete' with the stored tokens), never by triggers.
CREATE VIRTUAL TABLE IF NOT EXISTS units_fts USING fts5(
    tokens, content = 'units', content_rowid = 'id',
    tokenize = "unicode61 remove_diacritics 0 tokenchars '-_.'"
);
CREATE VIRTUAL TABLE IF NOT EXISTS units_vocab USING fts5vocab(units_fts, row);

-- Small meta table: schema version, indexed document count and token total (global BM25 stats),
-- index version and the time the replica first fell behind.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', 3), ('ndocs', 0), ('ntokens', 0),
    ('index_version', 0), ('dirty_since_ms', 0);
