-- Named statements, loaded once by service/store/sqlite/queries.py:sql(name). Named parameters only. A unit's
-- columns come as @unit_... lists from service/units.py (service/store/statements.py says which).

-- ===== catalog.db =====
-- name: catalog_get
SELECT seq, cid, day, timestamp, source, digest, expires_at, parent_cid, reserved_ms, thread, tpos
FROM catalog WHERE cid = :cid;

-- name: catalog_get_many
-- catalog_get for a push's CIDs and parents at once (a JSON array).
SELECT seq, cid, day, timestamp, source, digest, expires_at, parent_cid, reserved_ms, thread, tpos
FROM catalog WHERE cid IN (SELECT value FROM json_each(:cids));

-- name: catalog_insert
INSERT INTO catalog(cid, day, timestamp, source, digest, expires_at, parent_cid, reserved_ms, thread, tpos)
VALUES (:cid, :day, :timestamp, :source, :digest, :expires_at, :parent_cid, :reserved_ms, :thread, :tpos);

-- name: catalog_thread_last
-- The highest place taken in a thread (a new unit takes the next).
SELECT max(tpos) FROM catalog WHERE thread = :thread;

-- name: catalog_source_previous
-- The thread of a source's latest unit with a timestamp in [:lo, :hi] (a unit with no parent joins it).
SELECT thread FROM catalog WHERE source = :source AND timestamp BETWEEN :lo AND :hi
ORDER BY timestamp DESC, seq DESC LIMIT 1;

-- name: catalog_index_thread
-- (this index and the next after the schema script: an older catalog gets the columns first,
-- threads.migrate)
CREATE INDEX IF NOT EXISTS catalog_thread ON catalog(thread, tpos);

-- name: catalog_index_source_ts
CREATE INDEX IF NOT EXISTS catalog_source_ts ON catalog(source, timestamp);

-- name: catalog_places
-- The live units at these places of their threads (:places, a JSON array of [thread, tpos]: the neighbors a
-- search's ranking reads, service/store/sqlite/engine.py), by the thread index.
SELECT c.cid, c.day FROM json_each(:places) j
JOIN catalog c ON c.thread = json_extract(j.value, '$[0]') AND c.tpos = json_extract(j.value, '$[1]')
WHERE c.expires_at > :now;

-- name: catalog_window
-- The live units of a unit's thread up to :n places before and after it (by the thread index).
SELECT c.cid, c.day, c.tpos - h.tpos AS offset FROM catalog h
JOIN catalog c ON c.thread = h.thread AND c.tpos BETWEEN h.tpos - :n AND h.tpos + :n
WHERE h.cid = :cid AND c.cid != h.cid AND c.expires_at > :now
ORDER BY c.tpos;

-- name: catalog_for_threads
-- Every unit in acknowledgement order: what migrating an older catalog assigns threads from.
SELECT seq, cid, source, timestamp, parent_cid FROM catalog ORDER BY seq;

-- name: catalog_set_thread
UPDATE catalog SET thread = :thread, tpos = :tpos WHERE seq = :seq;

-- name: catalog_threads_of_day
SELECT cid, thread, tpos FROM catalog WHERE day = :day;

-- name: unit_set_thread
UPDATE units SET thread = :thread, tpos = :tpos WHERE cid = :cid;

-- name: catalog_update_mutable
UPDATE catalog SET expires_at = :expires_at, parent_cid = :parent_cid WHERE cid = :cid;

-- name: catalog_delete
DELETE FROM catalog WHERE cid = :cid;

-- name: catalog_children
SELECT cid, day FROM catalog
WHERE parent_cid = :cid AND expires_at > :now ORDER BY seq LIMIT :limit;

-- name: catalog_recent
SELECT seq, cid, day FROM catalog
WHERE expires_at > :now AND seq < :before ORDER BY seq DESC LIMIT :limit;

-- name: catalog_max_seq
SELECT coalesce(max(seq), 0) FROM catalog;

-- name: catalog_count_live
SELECT count(*) FROM catalog WHERE expires_at > :now;

-- name: days_upsert
INSERT INTO days(day, max_expires_at, min_expires_at) VALUES (:day, :max_expires_at, :min_expires_at)
ON CONFLICT(day) DO UPDATE SET
    max_expires_at = max(max_expires_at, excluded.max_expires_at),
    min_expires_at = min(min_expires_at, excluded.min_expires_at);

-- name: days_live
SELECT day FROM days WHERE max_expires_at > :now AND day >= :first AND day <= :last ORDER BY day;

-- name: days_with_expired
SELECT day, max_expires_at FROM days WHERE min_expires_at <= :now ORDER BY day;

-- name: days_next_expiry
-- When the janitor next has something to do for the tenant, unless the catalog changes before (at most the
-- first expiry of a live unit: a day's min_expires_at is never later than its first).
SELECT min(min_expires_at) FROM days;

-- name: days_set_min
UPDATE days SET min_expires_at = :min_expires_at WHERE day = :day;

-- name: days_delete_dead
DELETE FROM days WHERE day = :day AND max_expires_at <= :now;

-- name: catalog_purge_day
DELETE FROM catalog WHERE day = :day AND expires_at <= :now;

-- ===== primary/YYYY-MM-DD.db =====
-- name: unit_upsert
INSERT INTO units(@unit_columns, pushed_ms)
VALUES (@unit_params, :pushed_ms)
ON CONFLICT(cid) DO UPDATE SET
    @unit_repushed(excluded),
    -- the read index holds these fields: an indexed row is sent again, replacing what was sent
    indexed = CASE WHEN units.indexed > 0 THEN 3 ELSE 0 END
WHERE units.content = excluded.content AND units.timestamp = excluded.timestamp
  AND units.source = excluded.source;

-- name: unit_exists
SELECT 1 FROM units WHERE cid = :cid;

-- name: unit_get
SELECT id, indexed, @unit_columns FROM units WHERE cid = :cid AND expires_at > :now;

-- name: unit_delete_fetch
SELECT id, indexed, ntok, tokens FROM units WHERE cid = :cid;

-- name: unit_delete
DELETE FROM units WHERE id = :id;

-- name: fts_delete
-- External content: FTS5 needs the exact tokens it indexed to remove them.
INSERT INTO units_fts(units_fts, rowid, tokens) VALUES ('delete', :id, :tokens);

-- name: pending_fetch
-- (tokens: set already when a search made them for read-your-writes)
SELECT id, content, pushed_ms, tokens FROM units WHERE indexed = 0 ORDER BY id LIMIT :limit;

-- name: pending_count
SELECT count(*) FROM units WHERE indexed = 0;

-- name: fts_insert
INSERT INTO units_fts(rowid, tokens) VALUES (:id, :tokens);

-- name: unit_mark_indexed
UPDATE units SET indexed = 1, ntok = :ntok, tokens = :tokens WHERE id = :id AND indexed = 0;

-- name: meta_get
SELECT key, value FROM meta;

-- name: meta_add
UPDATE meta SET value = value + :delta WHERE key = :key;

-- name: meta_touch
-- A change search can see: bump the version and remember when the replica first fell behind.
UPDATE meta SET value = CASE key
        WHEN 'index_version' THEN value + 1
        WHEN 'dirty_since_ms' THEN CASE WHEN value = 0 THEN :now_ms ELSE value END
    END
WHERE key IN ('index_version', 'dirty_since_ms');

-- name: expired_fetch
SELECT id, indexed, ntok, tokens FROM units WHERE expires_at <= :now;

-- name: shard_expiry_bounds
SELECT min(expires_at), max(expires_at) FROM units;

-- name: vocab_df
SELECT term, doc FROM units_vocab WHERE term = :term;

-- name: index_names
SELECT name FROM sqlite_master WHERE type = 'index';

-- name: schema_version
SELECT value FROM meta WHERE key = 'schema_version';

-- name: migrate_v3_rows
-- Shard schema 2 -> 3: the rows whose metadata may name a project or global (the keys are derived in Python,
-- by the rule every push follows: service/unitkeys.py).
SELECT id, metadata FROM units
WHERE metadata IS NOT NULL AND (instr(metadata, '"project"') > 0 OR instr(metadata, '"global"') > 0);

-- name: migrate_v3_set
UPDATE units SET project = :project, is_global = :is_global WHERE id = :id;

-- ===== read index sync (service/store/sqlite/readsync.py) =====
-- name: unit_read_delete
-- A removed row the read index may hold (any indexed row: a crash may have left it there unflagged).
INSERT INTO read_deletes(id) SELECT :id WHERE :indexed > 0;

-- name: sync_rows
SELECT id, indexed, tokens, ntok, @unit_columns FROM units WHERE indexed IN (1, 3) ORDER BY id LIMIT :limit;

-- name: sync_deletes
SELECT n, id FROM read_deletes ORDER BY n LIMIT :limit;

-- name: sync_any
-- Whether the read index lacks anything of this shard: a row not sent (or changed since), a tombstone.
SELECT EXISTS (SELECT 1 FROM units WHERE indexed IN (1, 3)) OR EXISTS (SELECT 1 FROM read_deletes);

-- name: sync_mark
-- 2 when the row still has the values sent; 3 (send again, replacing) when a push changed it meanwhile.
UPDATE units SET indexed = CASE WHEN @unit_same THEN 2 ELSE 3 END
WHERE id = :id AND indexed IN (1, 3);

-- name: sync_mark_new
UPDATE units SET indexed = 2 WHERE indexed = 1 AND id IN (SELECT value FROM json_each(:ids));

-- name: sync_deletes_done
DELETE FROM read_deletes WHERE n <= :n;

-- name: sync_page
-- A rebuild streams every indexed row, in id order.
SELECT id, indexed, tokens, ntok, @unit_columns FROM units WHERE indexed > 0 AND id > :after ORDER BY id LIMIT :limit;

-- name: sync_reset_deletes
DELETE FROM read_deletes;

-- name: sync_backlog
-- What the read index lacks in this shard among units up to :seq: rows not yet in FTS5 or not yet
-- sent, the oldest push among them, and the lowest seq of a unit it lacks (rows changed since they
-- were sent, 3, are in it: they do not count for that).
SELECT (SELECT count(*) FROM units WHERE indexed = 0 AND seq <= :seq)
       + (SELECT count(*) FROM units WHERE indexed IN (1, 3) AND seq <= :seq),
       min(coalesce((SELECT min(pushed_ms) FROM units WHERE indexed = 0 AND seq <= :seq), 1e18),
           coalesce((SELECT min(pushed_ms) FROM units WHERE indexed IN (1, 3) AND seq <= :seq), 1e18)),
       min(coalesce((SELECT min(seq) FROM units WHERE indexed = 0 AND seq <= :seq), 9e18),
           -- (IN (1, 3) lets SQLite use the partial index units_unsynced)
           coalesce((SELECT min(seq) FROM units WHERE indexed IN (1, 3) AND indexed = 1 AND seq <= :seq), 9e18));

-- name: catalog_reserved_before
-- The newest unit reserved before :before_ms among those up to :seq (a scan back through the units
-- reserved since, usually few): later ones may still be on their way to their shard.
SELECT seq FROM catalog WHERE seq <= :seq AND reserved_ms < :before_ms ORDER BY seq DESC LIMIT 1;

-- name: ryw_tail_days
-- Read-your-writes: the days of the units at or after the read index's low-water mark.
SELECT day, count(*) AS n FROM catalog WHERE seq >= :low AND day >= :first AND day <= :last GROUP BY day;

-- name: ryw_expiry
-- Of these CIDs (the read index's candidates), each one's expiry in the catalog, NULL when it is gone.
SELECT j.value AS cid, c.expires_at FROM json_each(:cids) AS j LEFT JOIN catalog c ON c.cid = j.value;

-- name: ryw_store_tokens
-- A search's tokens for a unit still waiting for the indexer (which then need not make them again).
UPDATE units SET tokens = :tokens, ntok = :ntok WHERE id = :id AND indexed = 0 AND tokens IS NULL;

-- name: units_content_by_ids
SELECT id, content FROM units WHERE id IN (SELECT value FROM json_each(:ids));

-- name: ryw_unsent
-- Rows in FTS5 the read index lacks or holds in an older version (its partial index only).
SELECT count(*) FROM units WHERE indexed IN (1, 3);

-- name: ryw_pending
-- Units pushed before a search began and not yet in FTS5, and the oldest push among them.
SELECT count(*), min(pushed_ms) FROM units WHERE indexed = 0 AND seq <= :seq;

-- name: catalog_since_seq
-- Units reserved after a read-index pass began: how many, and the oldest reservation.
SELECT count(*), min(reserved_ms) FROM catalog WHERE seq > :seq;

-- name: units_by_ids
SELECT id, ntok, tokens, @unit_columns FROM units WHERE id IN (SELECT value FROM json_each(:ids));

-- ===== seeing and managing the memory (service/store/sqlite/manage.py) =====
-- name: catalog_delete_many
DELETE FROM catalog WHERE cid IN (SELECT value FROM json_each(:cids));

-- name: units_delete_fetch_cids
SELECT id, cid, indexed, ntok, tokens FROM units WHERE cid IN (SELECT value FROM json_each(:cids));

-- name: shard_stats
-- Live units of one day by type: how many, their content's UTF-8 bytes, time range, next expiry.
SELECT type, count(*) AS units, sum(length(CAST(content AS BLOB))) AS bytes, min(timestamp) AS oldest,
       max(timestamp) AS newest, min(expires_at) AS next_expiry
FROM units WHERE expires_at > :now GROUP BY type;

-- name: shard_signature
-- Changes whenever a row is added (max id) or removed or changed (remove_rows and duplicates touch meta).
SELECT (SELECT max(id) FROM units), (SELECT value FROM meta WHERE key = 'index_version');

-- name: meta_forgotten_add
INSERT INTO meta(key, value) VALUES ('forgotten_rows', :n)
ON CONFLICT(key) DO UPDATE SET value = value + excluded.value;

-- name: meta_forgotten_get
SELECT coalesce((SELECT value FROM meta WHERE key = 'forgotten_rows'), 0), (SELECT count(*) FROM units);

-- name: meta_forgotten_reset
UPDATE meta SET value = 0 WHERE key = 'forgotten_rows';

-- name: fts_optimize
INSERT INTO units_fts(units_fts) VALUES ('optimize');

-- name: backup_count_catalog
SELECT count(*) FROM catalog;

-- name: backup_count_shard
SELECT count(*), coalesce(sum(indexed = 0), 0) FROM units;

-- name: backup_count_tools
SELECT count(*) FROM tools;

-- name: backup_attach_catalog
ATTACH DATABASE :path AS cat;

-- name: backup_orphans
SELECT cid FROM main.units WHERE cid NOT IN (SELECT cid FROM cat.catalog);

-- name: backup_detach_catalog
DETACH DATABASE cat;
