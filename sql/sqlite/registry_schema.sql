-- tenants/<tenant>/tools.db: the tenant's tool registry. Tools are described, never called:
-- the endpoint is stored as text and no credential is ever stored (only auth_type).
CREATE TABLE IF NOT EXISTS tools (
    id             INTEGER PRIMARY KEY,
    name           TEXT NOT NULL UNIQUE,
    title          TEXT,
    description    TEXT NOT NULL,
    endpoint       TEXT,
    auth_type      TEXT NOT NULL,
    tags           TEXT NOT NULL,       -- JSON array of strings
    metadata       TEXT,                -- JSON object
    input_schema   TEXT NOT NULL,       -- JSON Schema 2020-12
    output_schema  TEXT,
    version        INTEGER NOT NULL,    -- 1 on registration, +1 per update
    created_ms     INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL,
    -- service/tokenize.py tokens, space-joined, one column per field group (weighted by the search)
    t_name         TEXT NOT NULL,       -- name (and its parts) and title
    t_text         TEXT NOT NULL,       -- description and tags
    t_schema       TEXT NOT NULL,       -- property names, titles and descriptions of both schemas
    n_name         INTEGER NOT NULL,    -- their lengths in tokens, for BM25's length normalization
    n_text         INTEGER NOT NULL,
    n_schema       INTEGER NOT NULL
);
-- As the unit shards: FTS5 over our own tokens (unicode61 with these tokenchars keeps each one whole),
-- external content, rows added and removed explicitly.
CREATE VIRTUAL TABLE IF NOT EXISTS tools_fts USING fts5(
    t_name, t_text, t_schema, content = 'tools', content_rowid = 'id',
    tokenize = "unicode61 remove_diacritics 0 tokenchars '-_.'"
);
CREATE VIRTUAL TABLE IF NOT EXISTS tools_vocab USING fts5vocab(tools_fts, row);
