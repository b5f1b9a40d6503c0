-- (Test data: schema version 3 of the PostgreSQL backend, below these three lines verbatim as main had it at
-- commit eb47249, for tests/test_postgresql.py::test_a_database_made_before_threads_gets_them_at_start. Do not
-- edit: an upgrade must keep working from exactly this.)
-- Context Mode Service on PostgreSQL (docs/design.md §5, §8, "Scale-out").
-- Re-runnable: every service process runs it at start (under an advisory lock).
-- Every table leads with the tenant column: it is the distribution key if the schema moves to Citus
-- (catalog, units, pending and the statistics would be distributed by tenant and co-located).

CREATE TABLE IF NOT EXISTS cms_meta (key text PRIMARY KEY, value bigint NOT NULL);
INSERT INTO cms_meta(key, value) VALUES ('schema_version', 1) ON CONFLICT (key) DO NOTHING;

-- One row per tenant: the per-tenant acknowledgement order. A push locks this row for its transaction,
-- so seqs are assigned in commit order. ``version`` counts every change of the tenant's units (push,
-- duplicate, delete, forget): a default search reads the standby only once it has replayed the version
-- the primary had when the search began (read-your-writes, deletes included).
CREATE TABLE IF NOT EXISTS tenants (
    tenant    text PRIMARY KEY,
    last_seq  bigint NOT NULL DEFAULT 0,
    version   bigint NOT NULL DEFAULT 0
);

-- Per tenant, a count of the indexer's and the janitor's commits (tokens, statistics, purges): with
-- tenants.version it tells whether the standby has replayed everything a search of the tenant on the
-- primary would see (kept apart from tenants so that indexing never waits for a push's row lock).
CREATE TABLE IF NOT EXISTS index_marks (
    tenant   text PRIMARY KEY,
    version  bigint NOT NULL DEFAULT 0
);

-- cid -> day, seq and identity (digest = sha256(content)) for duplicate and collision checks.
CREATE TABLE IF NOT EXISTS catalog (
    tenant      text   NOT NULL,
    cid         text   NOT NULL,
    seq         bigint NOT NULL,
    day         date   NOT NULL,
    timestamp   bigint NOT NULL,
    source      text   NOT NULL,
    digest      text   NOT NULL,
    expires_at  bigint NOT NULL,
    parent_cid  text,
    PRIMARY KEY (tenant, cid)
);
CREATE UNIQUE INDEX IF NOT EXISTS catalog_seq ON catalog (tenant, seq);
CREATE INDEX IF NOT EXISTS catalog_parent ON catalog (tenant, parent_cid) WHERE parent_cid IS NOT NULL;
CREATE INDEX IF NOT EXISTS catalog_expires ON catalog (expires_at);

-- Which days of a tenant can still hold live units (the day files of the SQLite backend).
CREATE TABLE IF NOT EXISTS tenant_days (
    tenant          text   NOT NULL,
    day             date   NOT NULL,
    min_expires_at  bigint NOT NULL,
    max_expires_at  bigint NOT NULL,
    PRIMARY KEY (tenant, day)
);

-- The units, one partition per day (units_pYYYYMMDD, created on first use; the janitor drops a
-- partition once every unit in it has expired): what a unit is, as pushed.
CREATE TABLE IF NOT EXISTS units (
    tenant      text   NOT NULL,
    day         date   NOT NULL,
    cid         text   NOT NULL,
    seq         bigint NOT NULL,
    type        text   NOT NULL,
    source      text   NOT NULL,
    timestamp   bigint NOT NULL,
    ttl         bigint NOT NULL,
    expires_at  bigint NOT NULL,
    content     text   NOT NULL,
    metadata    text,
    parent_cid  text,
    pushed_ms   bigint NOT NULL,
    PRIMARY KEY (tenant, day, cid)
) PARTITION BY RANGE (day);
CREATE INDEX IF NOT EXISTS units_expires ON units (expires_at);

-- What search reads: one row per indexed unit with the columns the search filters use and its term
-- frequencies (tfs: each of the unit's tokens, as service/tokenize.py made them and never re-parsed by
-- PostgreSQL, -> its count; BM25's tf is one key lookup). One table over every live day, not a
-- partition per day: planning a search over ~30 partitions cost ~9 ms, more than running it (the
-- lesson of the SQLite backend's read index, docs/design.md §11). A GIN index over tfs' keys finds
-- the units holding a query's terms (``?|`` any, ``?&`` every). fastupdate on, and the indexer empties
-- the pending list (gin_clean_pending_list) in every batch's transaction: its entries go into the tree
-- sorted and merged per term, at about half the server CPU and a quarter of the WAL of inserting
-- each unit's keys one by one (fastupdate off, schema version 1), and searches never read a long
-- pending list (left to autovacuum, one took ~60 ms instead of ~4 ms at 20k units).
CREATE TABLE IF NOT EXISTS unit_terms (
    tenant      text    NOT NULL,
    cid         text    NOT NULL,
    day         date    NOT NULL,
    seq         bigint  NOT NULL,
    type        text    NOT NULL,
    source      text    NOT NULL,
    timestamp   bigint  NOT NULL,
    expires_at  bigint  NOT NULL,
    parent_cid  text,
    ntok        integer NOT NULL,
    tfs         jsonb   NOT NULL,
    -- cid first: no index serves "tenant = ..." alone, so a search never ANDs a bitmap of all the
    -- tenant's rows with the terms' (that grew with the tenant: ~3 ms at 20k units, ~15 ms at 100k)
    PRIMARY KEY (cid, tenant)
);
CREATE INDEX IF NOT EXISTS unit_terms_tfs ON unit_terms USING gin (tfs) WITH (fastupdate = on);

-- The durable index queue: a row per acked, not yet indexed unit, with the columns search filters use
-- (read-your-writes reads the queue alone). Any node's indexer claims rows with FOR UPDATE SKIP LOCKED,
-- indexes them and deletes them in one transaction.
CREATE TABLE IF NOT EXISTS pending (
    tenant      text   NOT NULL,
    cid         text   NOT NULL,
    day         date   NOT NULL,
    seq         bigint NOT NULL,
    pushed_ms   bigint NOT NULL,
    type        text   NOT NULL,
    source      text   NOT NULL,
    timestamp   bigint NOT NULL,
    expires_at  bigint NOT NULL,
    parent_cid  text,
    PRIMARY KEY (tenant, cid)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);
-- (a queue: every row is deleted soon after it is written; vacuumed by count, not by share, so scans
-- of it, on the standby too, do not wade through dead rows)
CREATE INDEX IF NOT EXISTS pending_order ON pending (pushed_ms);
-- The lowest seq still queued: every unit below it is indexed or gone, so a node's read index may take
-- every indexed unit up to there (service/store/postgresql/readsync.py).
CREATE INDEX IF NOT EXISTS pending_seq ON pending (tenant, seq);

-- BM25 statistics of the indexed units: documents with at least one token and their token total per
-- tenant and day, each term's document frequency per tenant.
CREATE TABLE IF NOT EXISTS day_stats (
    tenant   text   NOT NULL,
    day      date   NOT NULL,
    ndocs    bigint NOT NULL DEFAULT 0,
    ntokens  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day)
);
-- Document frequencies per tenant, not per tenant and day (schema version 1): a day's units leave the
-- statistics one by one as they are deleted or expire (the janitor purges them before it forgets a
-- day), and a batch of units spread over days upserts each of its terms once, not once per day.
-- (Version 1's table is summed into this one at the upgrade.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('term_df') AND attname = 'day'
               AND NOT attisdropped) THEN
        ALTER TABLE term_df RENAME TO term_df_v1;
        ALTER INDEX term_df_pkey RENAME TO term_df_v1_pkey;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS term_df (
    tenant  text   NOT NULL,
    term    text   NOT NULL,
    df      bigint NOT NULL,
    PRIMARY KEY (tenant, term)
);
DO $$
BEGIN
    IF to_regclass('term_df_v1') IS NOT NULL THEN
        INSERT INTO term_df(tenant, term, df)
        SELECT tenant, term, sum(df) FROM term_df_v1 GROUP BY tenant, term HAVING sum(df) > 0;
        DROP TABLE term_df_v1;
    END IF;
END $$;

-- --- Live context and the tool registry ---------------------------------
-- Every node's listeners hear every node's changes: new units are the catalog's seq order (the feed),
-- other changes are rows of live_events, written in the transaction of the change they record (a
-- re-push, a delete, a forget, a tool registered, updated or deleted), so a row exists iff the change
-- committed. ``tenants.last_event`` numbers them per tenant under the tenant's row lock: rows become
-- visible in the order of their numbers, so a reader at position n never skips a row committed later.
-- NOTIFY (channel cms_live, payload the tenant name) only wakes the listening nodes (service/store/postgresql/live.py).
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS last_event bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS live_events (
    tenant  text   NOT NULL,
    n       bigint NOT NULL,
    uri     text   NOT NULL,                -- context://units/{cid} or context://tools/{name}
    kind    text   NOT NULL,                -- 'changed' or 'deleted'
    at_ms   bigint NOT NULL,
    PRIMARY KEY (tenant, n)
);
CREATE INDEX IF NOT EXISTS live_events_at ON live_events (at_ms);     -- the janitor prunes by age

-- The open streams of every node's workers, so the limits per API key and per tenant hold over all of
-- them; a worker refreshes seen_ms of its rows every few seconds, a dead one's rows stop counting.
CREATE TABLE IF NOT EXISTS live_listeners (
    tenant   text   NOT NULL,
    id       text   NOT NULL,
    key_id   text   NOT NULL,
    owner    text   NOT NULL,               -- the worker holding it (random per process)
    kind     text   NOT NULL,               -- 'listen' (MCP) or 'stream' (GET /mcp/stream)
    seen_ms  bigint NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- The tool registry: as the SQLite backend's tools.db (sql/sqlite/registry_schema.sql), one table for every
-- tenant. Token columns are service/tokenize.py's tokens (space-joined) per field group; ``terms`` the
-- distinct tokens of all three, whose GIN index finds a query's candidates and document frequencies.
CREATE TABLE IF NOT EXISTS tools (
    tenant         text    NOT NULL,
    name           text    NOT NULL,
    title          text,
    description    text    NOT NULL,
    endpoint       text,
    auth_type      text    NOT NULL,
    tags           text    NOT NULL,        -- JSON array of strings
    metadata       text,                    -- JSON object
    input_schema   text    NOT NULL,        -- JSON Schema 2020-12
    output_schema  text,
    version        integer NOT NULL,
    created_ms     bigint  NOT NULL,
    updated_ms     bigint  NOT NULL,
    t_name         text    NOT NULL,
    t_text         text    NOT NULL,
    t_schema       text    NOT NULL,
    n_name         integer NOT NULL,
    n_text         integer NOT NULL,
    n_schema       integer NOT NULL,
    terms          text[]  NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE INDEX IF NOT EXISTS tools_terms ON tools USING gin (terms);

-- --- Upgrades of a database made by an earlier schema version (each step re-runnable) ------------
-- Version 2 (the indexer's throughput): term_df per tenant (above); the GIN index over tfs takes its
-- entries through the pending list, emptied by the indexer at each batch.
ALTER INDEX unit_terms_tfs SET (fastupdate = on);
UPDATE cms_meta SET value = 2 WHERE key = 'schema_version' AND value < 2;
-- Version 3 (a read index on every node): pending_seq (above).
UPDATE cms_meta SET value = 3 WHERE key = 'schema_version' AND value < 3;
