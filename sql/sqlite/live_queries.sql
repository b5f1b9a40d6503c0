-- Named statements of live context and the tool registry, loaded with sql/sqlite/queries.sql.

-- ===== the feed: new units in seq order (service/store/sqlite/live.py) =====
-- name: feed_catalog
SELECT seq, cid, day, reserved_ms FROM catalog WHERE seq > :after ORDER BY seq LIMIT :limit;

-- name: feed_units
SELECT seq, cid, type, source, timestamp, expires_at, indexed, tokens
FROM units WHERE cid IN (SELECT value FROM json_each(:cids));

-- name: feed_expiry
SELECT expires_at FROM catalog WHERE cid = :cid;

-- ===== events.db =====
-- name: events_max
SELECT coalesce(max(n), 0) FROM events;

-- name: events_since
SELECT n, uri, kind FROM events WHERE n > :after ORDER BY n LIMIT :limit;

-- name: events_insert
INSERT INTO events(uri, kind, at_ms) VALUES (:uri, :kind, :at_ms);

-- name: events_prune
DELETE FROM events WHERE at_ms < :before;

-- ===== streams.db =====
-- name: listeners_expire
DELETE FROM listeners WHERE seen_ms < :before;

-- name: listeners_count
SELECT (SELECT count(*) FROM listeners WHERE tenant = :tenant),
       (SELECT count(*) FROM listeners WHERE key_id = :key_id);

-- name: listeners_open
SELECT count(*) FROM listeners WHERE tenant = :tenant AND seen_ms >= :after;

-- name: listeners_insert
INSERT INTO listeners(id, tenant, key_id, owner, kind, seen_ms)
VALUES (:id, :tenant, :key_id, :owner, :kind, :now);

-- name: listeners_delete
DELETE FROM listeners WHERE id = :id;

-- name: listeners_touch
UPDATE listeners SET seen_ms = :now WHERE owner = :owner;

-- ===== tools.db (service/store/sqlite/registry.py) =====
-- name: tool_get
SELECT * FROM tools WHERE name = :name;

-- name: tool_count
SELECT count(*) FROM tools;

-- name: tool_insert
INSERT INTO tools(name, title, description, endpoint, auth_type, tags, metadata, input_schema, output_schema,
                  version, created_ms, updated_ms, t_name, t_text, t_schema, n_name, n_text, n_schema)
VALUES (:name, :title, :description, :endpoint, :auth_type, :tags, :metadata, :input_schema, :output_schema,
        1, :now, :now, :t_name, :t_text, :t_schema, :n_name, :n_text, :n_schema);

-- name: tool_update
UPDATE tools SET title = :title, description = :description, endpoint = :endpoint, auth_type = :auth_type,
    tags = :tags, metadata = :metadata, input_schema = :input_schema, output_schema = :output_schema,
    version = version + 1, updated_ms = :now, t_name = :t_name, t_text = :t_text, t_schema = :t_schema,
    n_name = :n_name, n_text = :n_text, n_schema = :n_schema
WHERE id = :id;

-- name: tool_delete
DELETE FROM tools WHERE id = :id;

-- name: tool_fts_insert
INSERT INTO tools_fts(rowid, t_name, t_text, t_schema) VALUES (:id, :t_name, :t_text, :t_schema);

-- name: tool_fts_delete
-- External content: FTS5 needs the exact tokens it indexed to remove them.
INSERT INTO tools_fts(tools_fts, rowid, t_name, t_text, t_schema) VALUES ('delete', :id, :t_name, :t_text, :t_schema);

-- name: tool_list
SELECT * FROM tools
WHERE name > :after
  AND (:auth_type IS NULL OR auth_type = :auth_type)
  AND NOT EXISTS (SELECT 1 FROM json_each(:tags) AS want
                  WHERE want.value NOT IN (SELECT value FROM json_each(tools.tags)))
ORDER BY name LIMIT :limit;

-- name: tool_candidate_ids
-- Every tool matching any query token (:match quotes each token: service/store/sqlite/search.py fts_query), filtered as
-- tool_list, best first by FTS5's own rank (read from its index, no token column read);
-- service/store/sqlite/registry.py reads their columns (tool_columns_by_ids) and scores them.
SELECT tools.id
FROM tools_fts JOIN tools ON tools.id = tools_fts.rowid
WHERE tools_fts MATCH :match
  AND (:auth_type IS NULL OR tools.auth_type = :auth_type)
  AND NOT EXISTS (SELECT 1 FROM json_each(:tags) AS want
                  WHERE want.value NOT IN (SELECT value FROM json_each(tools.tags)))
ORDER BY tools_fts.rank
LIMIT :limit;

-- name: tool_columns_by_ids
-- The token columns of candidate tools, each cut to its first :bytes characters (service/ranking/tools.py).
SELECT id, name, substr(t_name, 1, :bytes) AS t_name, substr(t_text, 1, :bytes) AS t_text,
       substr(t_schema, 1, :bytes) AS t_schema, n_name, n_text, n_schema
FROM tools WHERE id IN (SELECT value FROM json_each(:ids));

-- name: tool_stats
SELECT count(*), coalesce(sum(n_name), 0), coalesce(sum(n_text), 0), coalesce(sum(n_schema), 0) FROM tools;

-- name: tool_df
SELECT term, doc FROM tools_vocab WHERE term IN (SELECT value FROM json_each(:terms));

-- name: tools_by_ids
SELECT * FROM tools WHERE id IN (SELECT value FROM json_each(:ids));
