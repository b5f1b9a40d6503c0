-- Named statements of the PostgreSQL backend (service/store/postgresql/). Parameters are psycopg's %(name)s; a
-- statement with {name} fields is a template for identifiers (a day partition's name), filled by
-- psycopg.sql with quoted identifiers and literals, never with request text. A unit's columns come as
-- @unit_... lists from service/units.py, written out as the file loads (service/store/statements.py).

-- --- set-up and locks ---------------------------------------------------------------------------

-- name: advisory_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: advisory_try_lock
SELECT pg_try_advisory_xact_lock(%(key)s) AS ok;

-- name: schema_present
-- The schema script runs in one transaction: its last table existing means all of them do (a database
-- made before a table was added runs the re-runnable script again) ...
SELECT to_regclass('tools') IS NOT NULL AS ok;

-- name: meta_present
-- Whether the database holds any version of the schema (the upgrade reads its version, a new one has none).
SELECT to_regclass('cms_meta') IS NOT NULL AS ok;

-- name: schema_version
-- ... and its version, the last upgrade step it ran (schema.sql's end; a database made by an earlier
-- version runs the script again, which upgrades it).
SELECT value AS version FROM cms_meta WHERE key = 'schema_version';

-- name: keys_backfill_rows
-- Schema version 4: the units stored before it whose metadata may name a project or global (their keys are
-- derived in Python, by the rule every push follows: service/unitkeys.py).
SELECT tenant, day::text AS day, cid, metadata FROM units
WHERE metadata IS NOT NULL AND (strpos(metadata, '"project"') > 0 OR strpos(metadata, '"global"') > 0);

-- name: keys_backfill_units
UPDATE units SET project = %(project)s, is_global = %(is_global)s
WHERE tenant = %(tenant)s AND day = %(day)s AND cid = %(cid)s;

-- name: keys_backfill_pending
UPDATE pending SET project = %(project)s, is_global = %(is_global)s WHERE tenant = %(tenant)s AND cid = %(cid)s;

-- name: keys_backfill_terms
UPDATE unit_terms SET project = %(project)s, is_global = %(is_global)s WHERE tenant = %(tenant)s AND cid = %(cid)s;

-- name: writable_probe
UPDATE cms_meta SET value = value WHERE key = 'schema_version';

-- name: partition_create
-- A day partition made as a table of its own, then attached (partition_attach): ``CREATE TABLE ... PARTITION
-- OF`` takes an ACCESS EXCLUSIVE lock on units until the push commits, which stalled every tenant's searches
-- (a search waiting out its statement timeout was refused as too costly); attaching takes SHARE UPDATE
-- EXCLUSIVE, which reads and writes do not wait for. (The attach makes the primary key's index.)
CREATE TABLE IF NOT EXISTS {part} (LIKE units INCLUDING DEFAULTS);

-- name: partition_attach
ALTER TABLE units ATTACH PARTITION {part} FOR VALUES FROM ({lo}) TO ({hi});

-- name: partitions_missing
-- Which of these day partitions (names from validated days) units lacks, as of this statement's snapshot:
-- the catalog rows themselves, not ``to_regclass``, whose answer comes from the session's cache of names
-- and missed a partition the janitor dropped while the push waited for the partition lock (a 500 in CI:
-- "no partition of relation units found for row").
SELECT n AS name FROM unnest(%(names)s::text[]) AS n
WHERE NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                  WHERE i.inhparent = 'units'::regclass AND c.relname = n);

-- name: advisory_lock_shared
-- A push's hold on the day partitions it found: the janitor drops one only under this key held exclusively.
SELECT pg_advisory_xact_lock_shared(%(key)s);

-- name: partitions
SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'units'::regclass ORDER BY c.relname;

-- name: partition_has_rows
SELECT EXISTS (SELECT 1 FROM {part}) AS b;

-- name: day_live_anywhere
SELECT EXISTS (SELECT 1 FROM tenant_days WHERE day = %(day)s) AS b;

-- name: partition_lock
-- The locks a push takes, in its order (the parent table, then the partition).
LOCK TABLE units, {part} IN ACCESS EXCLUSIVE MODE;

-- name: partition_drop
DROP TABLE {part};

-- --- tenants and days ---------------------------------------------------------------------------

-- name: tenant_lock
INSERT INTO tenants(tenant) VALUES (%(tenant)s) ON CONFLICT (tenant) DO UPDATE SET last_seq = tenants.last_seq
RETURNING last_seq;

-- name: tenant_set_seq
UPDATE tenants SET last_seq = %(seq)s, version = version + 1 WHERE tenant = %(tenant)s;

-- name: tenant_hold
-- A delete or forget takes the tenant's row first, as a push does (tenant_lock): one lock order, so a
-- push waiting for a catalog row the delete holds never holds the row the delete then needs.
SELECT 1 AS held FROM tenants WHERE tenant = %(tenant)s FOR NO KEY UPDATE;

-- name: tenant_bump
-- A change that assigns no seq (delete, forget): default searches must not read a standby without it.
UPDATE tenants SET version = version + 1 WHERE tenant = %(tenant)s;

-- name: tenant_seq
SELECT coalesce((SELECT last_seq FROM tenants WHERE tenant = %(tenant)s), 0) AS seq;

-- name: tenant_version
-- Every change a search of the tenant can see: pushes, deletes and forgets, index and purge commits.
-- (A standby replays a prefix of the primary's history: a sum at least the primary's means both are.)
SELECT coalesce((SELECT version FROM tenants WHERE tenant = %(tenant)s), 0)
     + coalesce((SELECT version FROM index_marks WHERE tenant = %(tenant)s), 0) AS version;

-- name: index_mark
INSERT INTO index_marks(tenant, version) VALUES (%(tenant)s, 1)
ON CONFLICT (tenant) DO UPDATE SET version = index_marks.version + 1;

-- name: tenant_names
SELECT tenant FROM tenants ORDER BY tenant;

-- name: tenant_versions
-- Every tenant with tenant_version's sum: a node's maintenance passes over a tenant's read index only when it
-- moved since the tenant's last pass found nothing left (or a unit in the index may have expired since).
SELECT t.tenant, t.version + coalesce(m.version, 0) AS version
FROM tenants t LEFT JOIN index_marks m ON m.tenant = t.tenant ORDER BY t.tenant;

-- name: tenants_expiring
-- The tenants that may hold an expired unit (a day's min_expires_at is never later than its first unit's expiry).
SELECT DISTINCT tenant FROM tenant_days WHERE min_expires_at <= %(now)s ORDER BY tenant;

-- name: days_count
SELECT count(*) AS n FROM tenant_days WHERE tenant = %(tenant)s;

-- name: days_known
SELECT day::text AS day FROM tenant_days WHERE tenant = %(tenant)s AND day = ANY(%(days)s::date[]);

-- name: days_upsert
INSERT INTO tenant_days(tenant, day, min_expires_at, max_expires_at)
VALUES (%(tenant)s, %(day)s, %(lo)s, %(hi)s)
ON CONFLICT (tenant, day) DO UPDATE SET
    min_expires_at = least(tenant_days.min_expires_at, excluded.min_expires_at),
    max_expires_at = greatest(tenant_days.max_expires_at, excluded.max_expires_at);

-- name: days_live
SELECT day::text AS day FROM tenant_days
WHERE tenant = %(tenant)s AND max_expires_at > %(now)s AND day BETWEEN %(first)s AND %(last)s ORDER BY day;

-- --- push ---------------------------------------------------------------------------------------

-- name: catalog_many
SELECT cid, seq, day::text AS day, timestamp, source, digest, expires_at, thread, tpos FROM catalog
WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s);

-- name: catalog_threads_last
-- Read with catalog_many (one round trip): the highest place taken in each thread a batch's units may join
-- without a look at time (service/store/postgresql/threads.py): those asked for (their CIDs, the threads their
-- metadata.session names) and those of the stored units and parents it names; NULL where a thread has none.
SELECT t.thread, (SELECT max(c.tpos) FROM catalog c WHERE c.tenant = %(tenant)s AND c.thread = t.thread) AS last
FROM (SELECT unnest(%(threads)s::text[])
      UNION
      SELECT coalesce(thread, cid) FROM catalog WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s)) AS t(thread);

-- name: catalog_thread_last
-- The highest place taken in a thread (a new unit takes the next).
SELECT max(tpos) AS last FROM catalog WHERE tenant = %(tenant)s AND thread = %(thread)s;

-- name: catalog_source_previous
-- The thread of a source's latest unit with a timestamp in [lo, hi] (a unit with no parent joins it, with
-- CONTEXT_THREAD_GAP_S: through catalog_source_ts).
SELECT thread FROM catalog WHERE tenant = %(tenant)s AND source = %(source)s AND timestamp BETWEEN %(lo)s AND %(hi)s
ORDER BY timestamp DESC, seq DESC LIMIT 1;

-- name: catalog_gap_index_present
SELECT to_regclass('catalog_source_ts') IS NOT NULL AS ok;

-- name: catalog_index_source_ts
CREATE INDEX IF NOT EXISTS catalog_source_ts ON catalog (tenant, source, timestamp);

-- name: catalog_insert
INSERT INTO catalog(tenant, cid, seq, day, timestamp, source, digest, expires_at, parent_cid, thread, tpos)
VALUES (%(tenant)s, %(cid)s, %(seq)s, %(day)s, %(timestamp)s, %(source)s, %(digest)s, %(expires_at)s, %(parent_cid)s,
        %(thread)s, %(tpos)s);

-- name: catalog_update_mutable
UPDATE catalog SET expires_at = %(expires_at)s, parent_cid = %(parent_cid)s WHERE tenant = %(tenant)s AND cid = %(cid)s;

-- name: unit_insert
INSERT INTO units(tenant, day, @unit_columns, pushed_ms)
VALUES (%(tenant)s, %(day)s, @unit_params, %(pushed_ms)s);

-- name: unit_update_mutable
UPDATE units SET @unit_repushed
WHERE tenant = %(tenant)s AND day = %(day)s AND cid = %(cid)s;

-- name: pending_insert
INSERT INTO pending(tenant, cid, day, seq, pushed_ms, type, source, timestamp, expires_at, parent_cid, project,
                    is_global)
VALUES (%(tenant)s, %(cid)s, %(day)s, %(seq)s, %(pushed_ms)s, %(type)s, %(source)s, %(timestamp)s, %(expires_at)s,
        %(parent_cid)s, %(project)s, %(is_global)s);

-- name: pending_update_mutable
UPDATE pending SET type = %(type)s, expires_at = %(expires_at)s, parent_cid = %(parent_cid)s,
    project = %(project)s, is_global = %(is_global)s
WHERE tenant = %(tenant)s AND cid = %(cid)s;

-- name: unit_terms_update_mutable
UPDATE unit_terms SET type = %(type)s, expires_at = %(expires_at)s, parent_cid = %(parent_cid)s,
    project = %(project)s, is_global = %(is_global)s
WHERE tenant = %(tenant)s AND cid = %(cid)s;

-- --- reads --------------------------------------------------------------------------------------

-- name: catalog_day
SELECT day::text AS day FROM catalog WHERE tenant = %(tenant)s AND cid = %(cid)s AND expires_at > %(now)s;

-- name: units_by_day_cids
-- With the days given, only their partitions are read (pruned when planned).
SELECT @unit_columns FROM units
WHERE tenant = %(tenant)s AND day = ANY(%(days)s::date[]) AND cid = ANY(%(cids)s);

-- name: catalog_places
-- The live units at these places of their threads (the neighbors a search's ranking reads,
-- service/store/postgresql/engine.py), by catalog_thread.
SELECT c.cid, c.day::text AS day FROM unnest(%(threads)s::text[], %(tposes)s::int[]) AS p(thread, tpos)
JOIN catalog c ON c.tenant = %(tenant)s AND c.thread = p.thread AND c.tpos = p.tpos
WHERE c.expires_at > %(now)s;

-- name: unit_terms_of
-- The indexed units' lengths and term frequencies, by CID.
SELECT cid, ntok, tfs FROM unit_terms WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s);

-- name: catalog_window
-- The live units of each of these units' threads up to %(n)s places before and after it (by catalog_thread).
SELECT h.cid AS around, c.cid, c.day::text AS day, c.tpos - h.tpos AS shift FROM catalog h
JOIN catalog c ON c.tenant = h.tenant AND c.thread = h.thread AND c.tpos BETWEEN h.tpos - %(n)s AND h.tpos + %(n)s
WHERE h.tenant = %(tenant)s AND h.cid = ANY(%(cids)s) AND c.cid <> h.cid AND c.expires_at > %(now)s
ORDER BY h.cid, c.tpos;

-- name: catalog_children
SELECT cid FROM catalog
WHERE tenant = %(tenant)s AND parent_cid = %(cid)s AND expires_at > %(now)s ORDER BY seq LIMIT %(limit)s;

-- name: catalog_recent
SELECT seq, cid, day::text AS day FROM catalog
WHERE tenant = %(tenant)s AND expires_at > %(now)s AND seq < %(before)s ORDER BY seq DESC LIMIT %(limit)s;

-- name: catalog_count_live
SELECT count(*) AS n FROM catalog WHERE tenant = %(tenant)s AND expires_at > %(now)s;

-- name: pending_count
SELECT count(*) AS n, min(pushed_ms) AS oldest FROM pending WHERE tenant = %(tenant)s;

-- name: pending_before
-- (not locking: it also counts the rows another node's indexer holds until that indexer commits)
SELECT EXISTS (SELECT 1 FROM pending WHERE tenant = %(tenant)s AND pushed_ms <= %(before)s) AS waiting;

-- --- delete and forget --------------------------------------------------------------------------

-- name: catalog_delete_many
DELETE FROM catalog WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s) AND expires_at > %(now)s
RETURNING day::text AS day, cid;

-- name: pending_delete_many
-- (first: it waits for an indexer holding these rows, whose unit_terms rows the next statement then sees)
DELETE FROM pending WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s);

-- name: unit_terms_delete_many
DELETE FROM unit_terms WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s) RETURNING day::text AS day, ntok, tfs;

-- name: units_delete_many
DELETE FROM units WHERE tenant = %(tenant)s AND day = ANY(%(days)s::date[]) AND cid = ANY(%(cids)s)
RETURNING cid;

-- --- the indexer --------------------------------------------------------------------------------

-- name: index_plan
-- The claim's content lookup is costed per day partition (30 x the batch): past jit_above_cost the
-- planner would compile it to machine code, ~150 ms for a statement that runs in ~5 ms.
SELECT set_config('jit', 'off', true);

-- name: pending_claim
-- Any node may index any row: the rows one indexer holds are skipped by the others. The queue rows come
-- first, through pending_order (the oldest, LIMIT): joining the whole queue with the units and sorting
-- it cost time in proportion to the queue's length, at every claim. Each one's content is then one
-- primary-key lookup in its day's partition (NULL: the unit is gone, nothing to index).
WITH p AS MATERIALIZED (
    SELECT tenant, cid, day, seq, pushed_ms, type, source, timestamp, expires_at, parent_cid, project, is_global
    FROM pending
    ORDER BY pushed_ms LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
SELECT p.tenant, p.cid, p.day::text AS day, p.seq, p.pushed_ms, p.type, p.source, p.timestamp, p.expires_at,
       p.parent_cid, p.project, p.is_global,
       (SELECT u.content FROM units u WHERE u.tenant = p.tenant AND u.day = p.day AND u.cid = p.cid) AS content
FROM p;

-- name: pending_claim_tenant
WITH p AS MATERIALIZED (
    SELECT tenant, cid, day, seq, pushed_ms, type, source, timestamp, expires_at, parent_cid, project, is_global
    FROM pending
    WHERE tenant = %(tenant)s ORDER BY pushed_ms LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
SELECT p.tenant, p.cid, p.day::text AS day, p.seq, p.pushed_ms, p.type, p.source, p.timestamp, p.expires_at,
       p.parent_cid, p.project, p.is_global,
       (SELECT u.content FROM units u WHERE u.tenant = p.tenant AND u.day = p.day AND u.cid = p.cid) AS content
FROM p;

-- name: unit_terms_insert
-- A batch's rows in one statement: a JSON array of objects (one parameter, encoded by json in C; an
-- executemany cost ~250 us of Python per unit). Each object holds every column of unit_terms (the indexer's
-- SEARCH_COLUMNS, ntok and tfs), so the table's own row type names and types them: no list of them here.
INSERT INTO unit_terms
SELECT * FROM jsonb_populate_recordset(NULL::unit_terms, %(rows)s::jsonb)
ON CONFLICT (cid, tenant) DO NOTHING;

-- name: unit_terms_clean
-- Move the batch's GIN entries from the index's pending list into its tree before the commit, sorted
-- and merged per term (fastupdate on): a quarter of the WAL and half the server CPU of inserting each
-- unit's ~40 keys one by one, and searches still find no pending list to read. Only the index's owner
-- may (the role that created the schema); any other role leaves it to autovacuum.
SELECT gin_clean_pending_list(c.oid) FROM pg_class c
WHERE c.oid = 'unit_terms_tfs'::regclass AND pg_has_role(c.relowner, 'USAGE');

-- name: stats_add
INSERT INTO day_stats(tenant, day, ndocs, ntokens) VALUES (%(tenant)s, %(day)s, %(ndocs)s, %(ntokens)s)
ON CONFLICT (tenant, day) DO UPDATE SET
    ndocs = day_stats.ndocs + excluded.ndocs, ntokens = day_stats.ntokens + excluded.ntokens;

-- name: df_add
-- dfs: a JSON object term -> change. Terms in one order (bytewise): concurrent indexers lock the same
-- rows in the same order.
INSERT INTO term_df(tenant, term, df)
SELECT %(tenant)s, t.key, t.value::bigint FROM jsonb_each_text(%(dfs)s::jsonb) AS t
ORDER BY t.key COLLATE "C"
ON CONFLICT (tenant, term) DO UPDATE SET df = term_df.df + excluded.df;

-- name: df_cleanup
-- The terms df_add just lowered (the same dfs) that no unit holds any more.
DELETE FROM term_df
WHERE tenant = %(tenant)s AND term = ANY(ARRAY(SELECT jsonb_object_keys(%(dfs)s::jsonb))) AND df <= 0;

-- --- the janitor --------------------------------------------------------------------------------

-- name: units_purge_batch
DELETE FROM units WHERE (tenant, day, cid) IN (
    SELECT tenant, day, cid FROM units WHERE tenant = %(tenant)s AND expires_at <= %(now)s LIMIT %(limit)s)
RETURNING cid;

-- name: unit_terms_purge
DELETE FROM unit_terms WHERE tenant = %(tenant)s AND cid = ANY(%(cids)s) RETURNING day::text AS day, ntok, tfs;

-- name: catalog_purge
DELETE FROM catalog WHERE tenant = %(tenant)s AND expires_at <= %(now)s;

-- name: days_forget_dead
DELETE FROM tenant_days WHERE tenant = %(tenant)s AND max_expires_at <= %(now)s RETURNING day::text AS day;

-- name: stats_forget_day
DELETE FROM day_stats WHERE tenant = %(tenant)s AND day = %(day)s;

-- name: pending_orphans
-- Queue rows whose unit is gone (deleted or its day dropped): nothing to index.
DELETE FROM pending p WHERE NOT EXISTS (
    SELECT 1 FROM units u WHERE u.tenant = p.tenant AND u.day = p.day AND u.cid = p.cid);

-- --- search -------------------------------------------------------------------------------------

-- name: search_snapshot
-- One snapshot for statistics, matches and queued units.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY;

-- name: statement_timeout
SELECT set_config('statement_timeout', %(ms)s, true);

-- name: lock_timeout
-- How long the rest of this transaction waits for any lock (queries.lock_wait), then LockNotAvailable.
SELECT set_config('lock_timeout', %(ms)s, true);

-- name: search_plan
-- Matches come through the GIN index over tfs' keys (bitmap scans), never a scan of every unit of the
-- tenant: the planner's cost of ``?|`` on each row (the jsonb read and the array taken apart) is far
-- too low, and a table not analyzed yet looks small.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_indexscan', 'off', true);

-- name: stats_get
SELECT coalesce(sum(ndocs), 0)::bigint AS ndocs, coalesce(sum(ntokens), 0)::bigint AS ntokens
FROM day_stats WHERE tenant = %(tenant)s;

-- name: df_get
SELECT term, df FROM term_df WHERE tenant = %(tenant)s AND term = ANY(%(terms)s);

-- name: standby_lag
-- Observed replay lag of a hot standby: 0 when it has replayed everything it received and its WAL
-- receiver streams; otherwise the age of the last transaction it replayed.
SELECT pg_is_in_recovery() AS recovery,
       CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
                 AND (SELECT status FROM pg_stat_wal_receiver) = 'streaming' THEN 0
            ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000, 0)
       END::bigint AS lag_ms;

-- --- seeing and managing the memory --------------------------------------------------

-- name: stats_by_day_type
-- Live units per day and type: count, content bytes (UTF-8), oldest and newest timestamp, and the
-- bytes their rows take in the day partitions (the counterpart of the SQLite backend's day files).
SELECT day::text AS day, type, count(*) AS units, sum(octet_length(content))::bigint AS bytes,
       min(timestamp) AS oldest, max(timestamp) AS newest, sum(pg_column_size(u.*))::bigint AS stored
FROM units u WHERE tenant = %(tenant)s AND expires_at > %(now)s GROUP BY day, type ORDER BY day, type;

-- name: days_summary
SELECT count(*) AS n, min(day)::text AS first, max(day)::text AS last FROM tenant_days WHERE tenant = %(tenant)s;

-- --- live context (service/store/postgresql/live.py) ----------------------------------

-- name: live_listen
LISTEN cms_live;

-- name: live_wake
-- After a change committed: wake the listening nodes (payload: the tenant, never content). Its own tiny
-- transaction, without waiting for the WAL flush: NOTIFY serializes notifying commits database-wide, and
-- a lost wake-up loses nothing (the listeners read the tables; they also look every second).
SELECT set_config('synchronous_commit', 'off', true), pg_notify('cms_live', %(tenant)s);

-- name: live_positions
-- Where a tenant's feed (seq) and change log (n) are: what the hub compares its cursors with.
SELECT coalesce(max(last_seq), 0) AS seq, coalesce(max(last_event), 0) AS n FROM tenants WHERE tenant = %(tenant)s;

-- name: live_feed
-- New units after a seq, in seq order, with their search columns and terms once indexed (unit_terms).
-- Seqs are assigned under the tenant's row lock: a visible seq means every lower one is visible or gone.
SELECT c.seq, c.cid, c.day::text AS day, c.source, c.timestamp, c.expires_at, t.type, t.tfs
FROM catalog c LEFT JOIN unit_terms t ON t.cid = c.cid AND t.tenant = c.tenant
WHERE c.tenant = %(tenant)s AND c.seq > %(after)s ORDER BY c.seq LIMIT %(limit)s;

-- name: live_expiry
SELECT expires_at FROM catalog WHERE tenant = %(tenant)s AND cid = %(cid)s;

-- name: live_events_add
-- Numbers the rows under the tenant's row lock (held by the change's transaction until it commits).
WITH alloc AS (
    INSERT INTO tenants(tenant, last_event) VALUES (%(tenant)s, cardinality(%(uris)s::text[]))
    ON CONFLICT (tenant) DO UPDATE SET last_event = tenants.last_event + cardinality(%(uris)s::text[])
    RETURNING last_event)
INSERT INTO live_events(tenant, n, uri, kind, at_ms)
SELECT %(tenant)s, alloc.last_event - cardinality(%(uris)s::text[]) + x.i, x.uri, x.kind, %(at_ms)s
FROM alloc, unnest(%(uris)s::text[], %(kinds)s::text[]) WITH ORDINALITY AS x(uri, kind, i);

-- name: live_events_since
SELECT n, uri, kind FROM live_events WHERE tenant = %(tenant)s AND n > %(after)s ORDER BY n LIMIT %(limit)s;

-- name: live_events_prune
DELETE FROM live_events WHERE at_ms < %(before)s;

-- name: live_listeners_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: live_listeners_expire
DELETE FROM live_listeners WHERE tenant = %(tenant)s AND seen_ms < %(before)s;

-- name: live_listeners_count
SELECT count(*) AS tenant_n, count(*) FILTER (WHERE key_id = %(key_id)s) AS key_n
FROM live_listeners WHERE tenant = %(tenant)s;

-- name: live_listeners_open
SELECT count(*) AS n FROM live_listeners WHERE tenant = %(tenant)s AND seen_ms >= %(after)s;

-- name: live_listeners_insert
INSERT INTO live_listeners(tenant, id, key_id, owner, kind, seen_ms)
VALUES (%(tenant)s, %(id)s, %(key_id)s, %(owner)s, %(kind)s, %(now)s);

-- name: live_listeners_delete
DELETE FROM live_listeners WHERE tenant = %(tenant)s AND id = %(id)s;

-- name: live_listeners_touch
UPDATE live_listeners SET seen_ms = %(now)s WHERE owner = %(owner)s;

-- --- the tool registry (service/store/postgresql/registry.py; the SQLite one: sql/sqlite/live_queries.sql) ------------

-- name: tool_get
SELECT * FROM tools WHERE tenant = %(tenant)s AND name = %(name)s;

-- name: tool_count
SELECT count(*) AS n FROM tools WHERE tenant = %(tenant)s;

-- name: tool_insert
INSERT INTO tools(tenant, name, title, description, endpoint, auth_type, tags, metadata, input_schema,
                  output_schema, version, created_ms, updated_ms, t_name, t_text, t_schema, n_name, n_text,
                  n_schema, terms)
VALUES (%(tenant)s, %(name)s, %(title)s, %(description)s, %(endpoint)s, %(auth_type)s, %(tags)s, %(metadata)s,
        %(input_schema)s, %(output_schema)s, 1, %(now)s, %(now)s, %(t_name)s, %(t_text)s, %(t_schema)s,
        %(n_name)s, %(n_text)s, %(n_schema)s, %(terms)s)
ON CONFLICT (tenant, name) DO NOTHING
RETURNING *;

-- name: tool_update
UPDATE tools SET title = %(title)s, description = %(description)s, endpoint = %(endpoint)s,
    auth_type = %(auth_type)s, tags = %(tags)s, metadata = %(metadata)s, input_schema = %(input_schema)s,
    output_schema = %(output_schema)s, version = version + 1, updated_ms = %(now)s, t_name = %(t_name)s,
    t_text = %(t_text)s, t_schema = %(t_schema)s, n_name = %(n_name)s, n_text = %(n_text)s,
    n_schema = %(n_schema)s, terms = %(terms)s
WHERE tenant = %(tenant)s AND name = %(name)s
RETURNING *;

-- name: tool_delete
DELETE FROM tools WHERE tenant = %(tenant)s AND name = %(name)s RETURNING name;

-- name: tool_list
SELECT * FROM tools
WHERE tenant = %(tenant)s AND name COLLATE "C" > %(after)s
  AND (%(auth_type)s::text IS NULL OR auth_type = %(auth_type)s)
  AND tags::jsonb @> %(tags)s::jsonb
ORDER BY name COLLATE "C" LIMIT %(limit)s;     -- (byte order, as SQLite's: pages and names agree on both)

-- name: tool_candidate_ids
-- Every tool holding any query token, filtered as tool_list, by name (service/ranking/tools.py reads their
-- columns with tool_columns_by_names and scores them).
SELECT name AS id FROM tools
WHERE tenant = %(tenant)s AND terms && %(terms)s::text[]
  AND (%(auth_type)s::text IS NULL OR auth_type = %(auth_type)s)
  AND tags::jsonb @> %(tags)s::jsonb
ORDER BY name
LIMIT %(limit)s;

-- name: tool_columns_by_names
-- The token columns of candidate tools, each cut to its first %(bytes)s characters.
SELECT name AS id, name, left(t_name, %(bytes)s) AS t_name, left(t_text, %(bytes)s) AS t_text,
       left(t_schema, %(bytes)s) AS t_schema, n_name, n_text, n_schema
FROM tools WHERE tenant = %(tenant)s AND name = ANY(%(names)s::text[]);

-- name: tool_stats
SELECT count(*) AS n, coalesce(sum(n_name), 0) AS name, coalesce(sum(n_text), 0) AS text,
       coalesce(sum(n_schema), 0) AS schema
FROM tools WHERE tenant = %(tenant)s;

-- name: tool_df
-- Document frequencies over all the tenant's tools (unfiltered), as FTS5's vocabulary table counts them.
SELECT term, count(*) AS doc FROM tools, unnest(terms) AS term
WHERE tenant = %(tenant)s AND terms && %(terms)s::text[] AND term = ANY(%(terms)s::text[])
GROUP BY term;

-- name: tools_by_names
SELECT * FROM tools WHERE tenant = %(tenant)s AND name = ANY(%(names)s::text[]);

-- --- the read index of each node (service/store/postgresql/readsync.py) ---------------------------------

-- name: node_positions
-- Where the tenant is, in the snapshot its changes and units are read in: the newest seq and change, and
-- the lowest seq still queued for the indexer (every unit below it is indexed or gone) with its push time.
SELECT coalesce(t.last_seq, 0) AS seq, coalesce(t.last_event, 0) AS n, q.seq AS queued, q.pushed_ms AS queued_ms
FROM (SELECT 1) one
LEFT JOIN tenants t ON t.tenant = %(tenant)s
LEFT JOIN LATERAL (SELECT seq, pushed_ms FROM pending WHERE tenant = %(tenant)s ORDER BY seq LIMIT 1) q ON true;

-- name: node_units
-- A page of live units after a seq, in seq order, with everything the read index stores: the catalog's page
-- first (its seq index, LIMIT), then each unit's terms and its row in its own day's partition. Units not
-- indexed yet come with NULL terms (the caller skips them; they are still queued, which bounds its
-- watermark). Joining before the LIMIT instead made each page join and sort every unit after the seq; a
-- lookup without its LIMIT 1 is flattened into a hash of every day's rows for each page (164 of a page's
-- 390 ms at 100k units, and growing with the table).
WITH c AS MATERIALIZED (
    SELECT seq, cid, day FROM catalog
    WHERE tenant = %(tenant)s AND seq > %(after)s AND expires_at > %(now)s ORDER BY seq LIMIT %(limit)s)
SELECT c.day::text AS day, t.ntok, (SELECT string_agg(repeat(e.key || ' ', e.value::int), '') FROM jsonb_each_text(t.tfs) e) AS tokens,
       t.cid IS NOT NULL AS indexed, @unit_columns(u),
       -- (the document's stored fields, service/readindex/schema.py's UNIT_FIELDS)
       @index_unit(u)::text AS unit
FROM c
LEFT JOIN unit_terms t ON t.tenant = %(tenant)s AND t.cid = c.cid
CROSS JOIN LATERAL (
    SELECT @unit_columns FROM units
    WHERE tenant = %(tenant)s AND day = c.day AND cid = c.cid LIMIT 1) u
ORDER BY c.seq;

-- name: node_units_by_cid
SELECT c.day::text AS day, t.ntok, (SELECT string_agg(repeat(e.key || ' ', e.value::int), '') FROM jsonb_each_text(t.tfs) e) AS tokens,
       @unit_columns(u),
       -- (the document's stored fields, service/readindex/schema.py's UNIT_FIELDS)
       @index_unit(u)::text AS unit
FROM catalog c
JOIN unit_terms t ON t.cid = c.cid AND t.tenant = c.tenant
CROSS JOIN LATERAL (
    SELECT @unit_columns FROM units
    WHERE tenant = %(tenant)s AND day = c.day AND cid = c.cid LIMIT 1) u
WHERE c.tenant = %(tenant)s AND c.cid = ANY(%(cids)s) AND c.expires_at > %(now)s;

-- name: node_tail
-- A default search's reads besides the node's read index, as one statement (one snapshot, one round trip,
-- no transaction): the tenant's newest seq and its oldest unit still queued for the indexer; the changes
-- after the index's state (what must leave its answers); and where the tail's units are (the live units at
-- or past the index's low-water mark, in seq order through catalog_seq, and those re-pushed since the
-- index's state). Their rows are read by node_tail_rows, only when there are any: a statement that reads
-- the units table, even for no row, opens its every day's partition and index (a generic plan cannot
-- prune partitions by a day it reads from another table): two thirds of this statement's cost, and paid by
-- every search of an index that lacks nothing. `expires_at + 0` keeps the catalog read on catalog_seq (the
-- expiry index holds every unit). The plans' shape is pinned by tests/test_node_index.py. And the tenant's
-- version in the same snapshot (tenant_version): while it stays the same, this answer does (a process keeps
-- it and asks only tenant_version, service/store/postgresql/tail.py).
WITH t AS (
    (SELECT seq, cid, day FROM catalog
     WHERE tenant = %(tenant)s AND seq >= %(low)s AND expires_at + 0 > %(now)s ORDER BY seq LIMIT %(limit)s)
    UNION
    SELECT c.seq, c.cid, c.day FROM live_events e
    JOIN catalog c ON c.tenant = e.tenant AND c.cid = substr(e.uri, 17)
    WHERE e.tenant = %(tenant)s AND e.n > %(after)s AND e.kind = 'changed' AND starts_with(e.uri, 'context://units/')
      AND c.expires_at > %(now)s),
ch AS (
    SELECT n, uri FROM live_events WHERE tenant = %(tenant)s AND n > %(after)s ORDER BY n LIMIT %(changes)s)
SELECT coalesce((SELECT last_seq FROM tenants WHERE tenant = %(tenant)s), 0) AS seq,
       (SELECT pushed_ms FROM pending WHERE tenant = %(tenant)s ORDER BY seq LIMIT 1) AS queued_ms,
       (SELECT coalesce(json_agg(uri ORDER BY n), '[]') FROM ch) AS changes,
       (SELECT coalesce(json_agg(json_build_array(t.seq, t.cid, t.day) ORDER BY t.seq), '[]') FROM t) AS at,
       coalesce((SELECT version FROM tenants WHERE tenant = %(tenant)s), 0)
       + coalesce((SELECT version FROM index_marks WHERE tenant = %(tenant)s), 0) AS version;

-- name: node_tail_rows
-- The tail units' mutable fields (node_tail says where they are: seq, cid, day), in seq order, each looked
-- up in its own day's partition (LATERAL ... LIMIT 1: the LIMIT keeps the planner from flattening the lookup
-- into a join, which the search pool's generic plans made a hash of every day's rows: ~150 ms at 100k
-- units, whatever the tail). A unit deleted since node_tail read it has no row: it is gone.
SELECT @unit_columns(u, -content), u.pushed_ms
FROM unnest(%(seqs)s::bigint[], %(cids)s::text[], %(days)s::date[]) AS p(seq, cid, day)
CROSS JOIN LATERAL (
    SELECT @unit_columns(-content), pushed_ms
    FROM units
    WHERE tenant = %(tenant)s AND day = p.day AND cid = p.cid LIMIT 1) u
ORDER BY p.seq;

-- name: node_tail_texts
-- What tail units hold, for the ones this process has not seen: their content, and their terms once indexed.
-- A queued unit's content (tokenized by the search) only while the queued ones so far, newest first, hold at
-- most %(bytes)s bytes (octet_length reads the stored size, not the text): the rest stay unseen. Newest
-- first: the unit a caller just pushed is read at once, and the indexer takes the queue oldest first.
SELECT cid, ntok, tfs, CASE WHEN tfs IS NOT NULL OR queued <= %(bytes)s THEN content END AS content
FROM (SELECT c.cid, u.content, t.ntok, t.tfs,
             sum(CASE WHEN t.tfs IS NULL THEN octet_length(u.content) ELSE 0 END) OVER (ORDER BY c.seq DESC) AS queued
      FROM catalog c
      CROSS JOIN LATERAL (SELECT content FROM units
                          WHERE tenant = %(tenant)s AND day = c.day AND cid = c.cid LIMIT 1) u
      LEFT JOIN unit_terms t ON t.cid = c.cid AND t.tenant = c.tenant
      WHERE c.tenant = %(tenant)s AND c.cid = ANY(%(cids)s)) AS texts;

-- name: node_behind
-- What a node's read index lacks: the live units at or past its low-water mark, and when the first was pushed.
SELECT (SELECT count(*) FROM catalog
        WHERE tenant = %(tenant)s AND seq >= %(low)s AND expires_at + 0 > %(now)s) AS n,
       (SELECT u.pushed_ms
        FROM (SELECT day, cid FROM catalog WHERE tenant = %(tenant)s AND seq >= %(low)s ORDER BY seq LIMIT 1) c
        CROSS JOIN LATERAL (SELECT pushed_ms FROM units
                            WHERE tenant = %(tenant)s AND day = c.day AND cid = c.cid LIMIT 1) u) AS oldest;

-- name: node_timeline
-- The server's WAL timeline (a promotion starts a new one; a standby reports the one it receives, NULL
-- when it is not streaming or the role may not see it): history a node's read index was read from.
SELECT CASE WHEN pg_is_in_recovery() THEN (SELECT received_tli FROM pg_stat_wal_receiver)
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END AS tli;

-- --- threads: the upgrade of a database made before them (service/store/postgresql/threads.py) ----------

-- name: catalog_tenants
SELECT DISTINCT tenant FROM catalog ORDER BY tenant;

-- name: catalog_for_threads
-- A tenant's units in acknowledgement order, a page at a time: what the upgrade assigns threads from.
SELECT seq, cid, source, timestamp, parent_cid FROM catalog
WHERE tenant = %(tenant)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s;

-- name: catalog_set_threads
UPDATE catalog c SET thread = v.thread, tpos = v.tpos
FROM unnest(%(seqs)s::bigint[], %(threads)s::text[], %(tposs)s::integer[]) AS v(seq, thread, tpos)
WHERE c.tenant = %(tenant)s AND c.seq = v.seq;

-- name: units_threads_from_catalog
-- Every unit's row as its catalog row has it (one statement over every day's partition).
UPDATE units u SET thread = c.thread, tpos = c.tpos FROM catalog c
WHERE c.tenant = u.tenant AND c.cid = u.cid AND c.day = u.day AND u.thread IS NULL;
