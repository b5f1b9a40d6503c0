"""The bare app: the fair limit a whole-question search is compared with (issue 42). What a minimal service
must do for the same answer, and nothing else: Flask behind gunicorn with the service's workers and threads
(2 gthread workers x 8 threads, the same keep-alive), the question tokenized by the service's own tokenizer
(rjieba, identifiers, stemming: the tokens the units were indexed with), tantivy's OR of the terms over an
index of the same units, and the top k answered with each unit's stored fields (content included) and its
score. No keys, no door checks, no rate limit, no metrics, no access log, no read-your-writes, no filters,
no deletions, tantivy's BM25 as it is (lengths in one byte).

    python bench/bare_app.py --data DIR --index OUT                # build from a service data dir
    BARE_INDEX=OUT gunicorn -w 2 -k gthread --threads 8 'bare_app:create_app()'   # (http_bench.py does)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import tantivy

FIELDS = ("cid", "type", "source", "timestamp", "ttl", "metadata", "parent_cid", "expires_at")


def build(data_dir: Path, path: Path) -> tuple[int, float]:
    """Index every indexed, non-empty unit of a service data dir (SQLite): its tokens, searched; its content
    and other public fields, stored. Returns (units, seconds)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("t", tokenizer_name="ws", index_option="freq")
    sb.add_text_field("content", stored=True, index_option="basic")
    sb.add_text_field("unit", stored=True, index_option="basic")
    index = tantivy.Index(sb.build(), path=str(path))
    register(index)
    writer = index.writer(200_000_000, 1)
    t0, n = time.perf_counter(), 0
    for f in sorted((Path(data_dir) / "tenants" / "default" / "primary").glob("*.db")):
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        for r in conn.execute("SELECT * FROM units WHERE indexed > 0 AND ntok > 0"):
            doc = tantivy.Document()
            doc.add_text("t", r["tokens"])
            doc.add_text("content", r["content"])
            doc.add_text("unit", json.dumps({k: r[k] for k in FIELDS}, ensure_ascii=False))
            writer.add_document(doc)
            n += 1
        conn.close()
    writer.commit()
    writer.wait_merging_threads()
    return n, time.perf_counter() - t0


def register(index: tantivy.Index) -> None:
    index.register_tokenizer("ws", tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())


def searcher(path: Path, tokenizer):
    """A search function: (question, k) -> the top k units with their stored fields and score."""
    index = tantivy.Index.open(str(path))
    register(index)
    s, schema = index.searcher(), index.schema

    def search(q: str, k: int = 10) -> list[dict]:
        terms = tokenizer.query_terms(q)
        if not terms:
            return []
        query = tantivy.Query.boolean_query([(tantivy.Occur.Should, tantivy.Query.term_query(schema, "t", t))
                                             for t in terms])
        out = []
        for score, address in s.search(query, k, count=False).hits:
            doc = s.doc(address)
            unit = json.loads(doc.get_first("unit"))
            unit["metadata"] = json.loads(unit["metadata"]) if unit["metadata"] else None
            unit["content"] = doc.get_first("content")
            unit["score"] = unit["bm25_score"] = score
            out.append(unit)
        return out
    return search


def create_app():
    """POST /mcp/search ({"query", "top_k"}) and GET /healthz behind Flask, index from BARE_INDEX."""
    from flask import Flask, jsonify, request

    from service.config import Config
    from service.tokenize import tokenizer_for
    search = searcher(Path(os.environ["BARE_INDEX"]), tokenizer_for(Config()))
    app = Flask(__name__)

    @app.post("/mcp/search")
    def _search():
        body = request.get_json()
        return jsonify({"results": search(body["query"], body.get("top_k", 10))})

    @app.get("/healthz")
    @app.get("/readyz")
    def _health():
        return jsonify({"status": "ok"})
    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--index", required=True)
    a = ap.parse_args()
    n, secs = build(Path(a.data), Path(a.index))
    print(f"indexed {n} units in {secs:.1f} s")
