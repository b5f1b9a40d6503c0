-- <data>/streams.db: the open listen streams of every worker, so that the limits per API key
-- and per tenant hold over all gunicorn workers. A worker refreshes seen_ms of its rows every few seconds;
-- rows of a worker that died stop being counted once they are older than service/hub.py's STALE_MS.
CREATE TABLE IF NOT EXISTS listeners (
    id       TEXT PRIMARY KEY,
    tenant   TEXT NOT NULL,
    key_id   TEXT NOT NULL,                -- first 12 hex digits of the key's hash, as logged
    owner    TEXT NOT NULL,                -- the worker holding it (random per process)
    kind     TEXT NOT NULL,                -- 'listen' (MCP) or 'stream' (GET /mcp/stream)
    seen_ms  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS listeners_tenant ON listeners(tenant);
CREATE INDEX IF NOT EXISTS listeners_key ON listeners(key_id);
