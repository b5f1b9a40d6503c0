"""The naive first attempt (docs/design.md §10), with the service's HTTP contract for
POST /mcp/push (one unit or a batch) and POST /mcp/search, so one load generator drives both.

What makes it naive, on purpose: one table and one FTS5 table in one SQLite file, the
segmentation and FTS insert done synchronously inside the push request, one shared
connection behind a lock, BM25 via ``ORDER BY bm25(...)`` on an alias, and Flask's
development server (one process, a thread per request). It gets the fast segmenter
(rjieba) too, so the comparison isolates the architecture, not the segmenter.

    python bench/baseline/app.py --db /tmp/base.db --port 5099
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sqlite3
import threading
import time

from flask import Flask, jsonify, request

TYPES = ("user_input", "model_thinking", "tool_output", "system_notice")
SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS units (
    id INTEGER PRIMARY KEY, cid TEXT UNIQUE NOT NULL, type TEXT, source TEXT, timestamp INTEGER,
    ttl INTEGER, expires_at INTEGER, content TEXT, metadata TEXT, parent_cid TEXT);
CREATE VIRTUAL TABLE IF NOT EXISTS units_fts USING fts5(tokens);
"""
_WORD = re.compile(r"\w+")


def _segmenter():
    try:
        import rjieba
        return lambda s: rjieba.cut_for_search(s, False)
    except ImportError:  # pragma: no cover
        import jieba
        return lambda s: jieba.cut_for_search(s, HMM=False)


class Invalid(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class BaselineStore:
    """One file, one connection, one lock."""

    def __init__(self, path):
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.conn.executescript(SCHEMA)
        self.lock = threading.Lock()
        self.cut = _segmenter()

    def close(self):
        self.conn.close()

    def tokens(self, text: str) -> str:
        return " ".join(w for w in (t.strip().lower() for t in self.cut(text)) if w and _WORD.match(w))

    def _check(self, raw: dict, now: float) -> dict:
        if not isinstance(raw, dict):
            raise Invalid(400, "invalid_body", "A unit must be a JSON object.")
        for f in ("type", "source", "timestamp", "ttl", "content"):
            if f not in raw:
                raise Invalid(400, "missing_field", f"Field {f!r} is required.")
        if raw["type"] not in TYPES:
            raise Invalid(400, "invalid_type", "Unknown type.")
        if not isinstance(raw["content"], str):
            raise Invalid(400, "invalid_content", "Content must be a string.")
        ts, ttl = raw["timestamp"], raw["ttl"]
        if not isinstance(ts, int) or not isinstance(ttl, int) or not 1 <= ttl <= 31_536_000:
            raise Invalid(400, "invalid_field", "timestamp and ttl must be integers.")
        if ts + ttl <= now:
            raise Invalid(422, "already_expired", "The unit has already expired.")
        cid = hashlib.sha256((raw["content"] + str(ts) + raw["source"]).encode()).hexdigest()[:12]
        if raw.get("cid") not in (None, cid):
            raise Invalid(400, "invalid_cid", "CID does not match.")
        return {**raw, "cid": cid}

    def _insert(self, u: dict, now: float) -> dict:
        parent = u.get("parent_cid")
        if parent is not None:
            row = self.conn.execute("SELECT expires_at FROM units WHERE cid = ?", (parent,)).fetchone()
            if row is None or row[0] <= now:
                raise Invalid(422, "parent_not_found", "Parent unit does not exist.")
        cur = self.conn.execute(
            "INSERT OR IGNORE INTO units (cid, type, source, timestamp, ttl, expires_at, content, metadata, parent_cid)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (u["cid"], u["type"], u["source"], u["timestamp"], u["ttl"], u["timestamp"] + u["ttl"], u["content"],
             json.dumps(u.get("metadata"), ensure_ascii=False), parent))
        if cur.rowcount == 0:
            seq = self.conn.execute("SELECT id FROM units WHERE cid = ?", (u["cid"],)).fetchone()[0]
            return {"status": "duplicate", "cid": u["cid"], "seq": seq, "indexed": True}
        seq = cur.lastrowid
        self.conn.execute("INSERT INTO units_fts (rowid, tokens) VALUES (?, ?)", (seq, self.tokens(u["content"])))
        return {"status": "ok", "cid": u["cid"], "seq": seq, "indexed": True}

    def push_many(self, raws: list) -> list:
        """Validate, insert and index every unit in one transaction; per item a dict or an Invalid."""
        now = time.time()
        out = []
        with self.lock:
            self.conn.execute("BEGIN")
            try:
                for raw in raws:
                    try:
                        out.append(self._insert(self._check(raw, now), now))
                    except Invalid as e:
                        out.append(e)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        return out

    def search(self, query: str, top_k: int = 10) -> dict:
        start = time.perf_counter()
        terms = list(dict.fromkeys(self.tokens(query).split()))
        results = []
        if terms:
            match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
            with self.lock:
                rows = self.conn.execute(
                    "SELECT u.cid, u.type, u.source, u.timestamp, u.ttl, u.content, u.metadata, u.parent_cid,"
                    " u.expires_at, bm25(units_fts) AS score FROM units_fts JOIN units u ON u.id = units_fts.rowid"
                    " WHERE units_fts MATCH ? AND u.expires_at > ? ORDER BY score LIMIT ?",
                    (match, int(time.time()), top_k)).fetchall()
            for r in rows:
                results.append({"cid": r[0], "type": r[1], "source": r[2], "timestamp": r[3], "ttl": r[4],
                                "content": r[5], "metadata": json.loads(r[6]) if r[6] else None,
                                "parent_cid": r[7], "expires_at": r[8], "score": None, "bm25_score": -r[9]})
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": 1, "freshness": {"replica_lag_ms": 0, "index_pending": 0}}


def create_app(db_path) -> Flask:
    app = Flask(__name__)
    app.json.ensure_ascii = False
    store = BaselineStore(db_path)

    def error(e: Invalid):
        return jsonify({"error": e.message, "code": e.code}), e.status

    @app.post("/mcp/push")
    def push():
        body = request.get_json(silent=True)
        if isinstance(body, dict) and set(body) == {"units"}:
            body = body["units"]
        if isinstance(body, list):
            res = store.push_many(body)
            return jsonify({"results": [
                {"index": i, "status": "error", "error": r.message, "code": r.code} if isinstance(r, Invalid)
                else {"index": i, **r} for i, r in enumerate(res)]})
        r = store.push_many([body])[0]
        return error(r) if isinstance(r, Invalid) else jsonify(r)

    @app.post("/mcp/search")
    def search():
        body = request.get_json(silent=True) or {}
        return jsonify(store.search(str(body.get("query", "")), int(body.get("top_k") or 10)))

    @app.get("/readyz")
    def readyz():
        return jsonify({"status": "ok", "index_pending": 0})

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description="naive baseline server (Flask dev server, threaded)")
    ap.add_argument("--db", required=True)
    ap.add_argument("--port", type=int, default=5099)
    a = ap.parse_args()
    import logging
    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # no per-request log, like gunicorn here
    create_app(a.db).run(host="127.0.0.1", port=a.port, threaded=True)


if __name__ == "__main__":
    main()
