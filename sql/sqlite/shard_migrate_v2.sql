-- Shard schema 1 -> 2: tokens move from a self-contained FTS5 table into units.tokens, and
-- units_fts becomes an external-content index over them. Run in one write transaction.
ALTER TABLE units ADD COLUMN tokens TEXT;
UPDATE units SET tokens = (SELECT f.tokens FROM units_fts f WHERE f.rowid = units.id) WHERE indexed = 1;
DROP TABLE units_vocab;
DROP TABLE units_fts;
CREATE VIRTUAL TABLE units_fts USING fts5(
    tokens, content = 'units', content_rowid = 'id',
    tokenize = "unicode61 remove_diacritics 0 tokenchars '-_.'"
);
INSERT INTO units_fts(rowid, tokens) SELECT id, tokens FROM units WHERE indexed = 1 AND ntok > 0;
CREATE VIRTUAL TABLE units_vocab USING fts5vocab(units_fts, row);
UPDATE meta SET value = 2 WHERE key = 'schema_version';
UPDATE meta SET value = value + 1 WHERE key = 'index_version';
