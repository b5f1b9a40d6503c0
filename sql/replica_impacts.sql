-- Impact lists of one replica file (DESIGN.md section 11: the MaxScore lever), built into the
-- replica copy of a past day's shard, never into a primary. For every term, each unit holding it
-- with its term frequency, its length, and the term's BM25 impact there, tf / (tf + norm) with
-- this file's own average length, quantised down to 1/65536. Search reads a term's units in
-- impact order and stops once the rest cannot reach the top k (service/search.py).
-- format: bumped whenever these tables change; replicas with another format are rebuilt.
CREATE TABLE impact_meta (format INTEGER NOT NULL, k1 REAL NOT NULL, b REAL NOT NULL, avgdl REAL NOT NULL);
CREATE TABLE impact_terms (term TEXT PRIMARY KEY, tid INTEGER NOT NULL, df INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE impacts (
    tid  INTEGER NOT NULL,
    q    INTEGER NOT NULL,   -- floor(65536 * tf / (tf + k1 * (1 - b + b * ntok / avgdl)))
    doc  INTEGER NOT NULL,   -- units.id
    tf   INTEGER NOT NULL,
    ntok INTEGER NOT NULL,
    PRIMARY KEY (tid, q, doc)
) WITHOUT ROWID;
CREATE VIRTUAL TABLE temp.units_instances USING fts5vocab(main, units_fts, instance);
INSERT INTO impact_meta (format, k1, b, avgdl)
    SELECT :format, :k1, :b, CAST(t.value AS REAL) / max(n.value, 1)
    FROM meta n JOIN meta t ON n.key = 'ndocs' AND t.key = 'ntokens';
INSERT INTO impact_terms (term, tid, df)
    SELECT term, row_number() OVER (ORDER BY term), doc FROM units_vocab;
INSERT INTO impacts (tid, q, doc, tf, ntok)
    SELECT it.tid, CAST(65536.0 * g.tf / (g.tf + :k1 * (1 - :b + :b * u.ntok / m.avgdl)) AS INTEGER),
           g.doc, g.tf, u.ntok
    FROM (SELECT term, doc, count(*) AS tf FROM temp.units_instances GROUP BY term, doc) AS g
    JOIN impact_terms it ON it.term = g.term
    JOIN units u ON u.id = g.doc
    JOIN impact_meta m
    ORDER BY 1, 2, 3;
-- A unit's frequency of given terms, for scoring a unit read from some lists but not others.
CREATE INDEX impacts_by_unit ON impacts (doc, tid, tf, ntok);
DROP TABLE temp.units_instances;
