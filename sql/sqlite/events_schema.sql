-- tenants/<tenant>/events.db: changes that get no new seq, so that every gunicorn worker can
-- tell its listeners about them. New units need no row here: their catalog seq is the feed.
-- Written by whichever worker made the change; read by every worker's hub (service/hub.py).
CREATE TABLE IF NOT EXISTS events (
    n      INTEGER PRIMARY KEY AUTOINCREMENT,
    uri    TEXT NOT NULL,                 -- context://units/{cid} or context://tools/{name}
    kind   TEXT NOT NULL,                 -- 'changed' (re-pushed with new fields, re-registered) or 'deleted'
    at_ms  INTEGER NOT NULL
);
