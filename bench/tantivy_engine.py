"""tantivy alone over the service's own tokens: the engine limit the service is compared with. A whitespace analyzer over ``units.tokens`` (exactly the tokens FTS5 and the read
index hold), BM25 k1 1.2 b 0.75, OR of the query's tokens, top k; no rows fetched, no filters.

    python bench/tantivy_engine.py --data DIR --index OUT           # build
    TANTIVY_BENCH_INDEX=OUT gunicorn 'tantivy_engine:create_app()'  # serve POST /mcp/search (http_bench.py does)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import time
from pathlib import Path

import tantivy


def build(data_dir: Path, path: Path) -> tuple[int, float]:
    """Index every indexed, non-empty unit of a service data dir; returns (units, seconds)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("t", tokenizer_name="ws", index_option="freq")
    sb.add_integer_field("id", fast=True)
    index = tantivy.Index(sb.build(), path=str(path))
    index.register_tokenizer("ws", tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())
    writer = index.writer(200_000_000, 1)
    t0, n = time.perf_counter(), 0
    for f in sorted((Path(data_dir) / "tenants" / "default" / "primary").glob("*.db")):
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        for rowid, tokens in conn.execute("SELECT id, tokens FROM units WHERE indexed > 0 AND ntok > 0"):
            doc = tantivy.Document()
            doc.add_text("t", tokens)
            doc.add_integer("id", rowid)
            writer.add_document(doc)
            n += 1
        conn.close()
    writer.commit()
    writer.wait_merging_threads()
    return n, time.perf_counter() - t0


def searcher(path: Path, tokenizer, top_k: int = 10):
    """A search function: query text -> [(score, rowid)] of the top k."""
    index = tantivy.Index.open(str(path))
    s, schema = index.searcher(), index.schema

    def search(q: str):
        terms = tokenizer.query_terms(q)
        if not terms:
            return []
        query = tantivy.Query.boolean_query([(tantivy.Occur.Should, tantivy.Query.term_query(schema, "t", t))
                                             for t in terms])
        hits = s.search(query, top_k, count=False).hits
        return list(zip((score for score, _ in hits), s.fast_field_values("id", [a for _, a in hits])))
    return search


def create_app():
    """The same search behind Flask, for bench/http_bench.py (index from TANTIVY_BENCH_INDEX)."""
    from flask import Flask, jsonify, request

    from service.config import Config
    from service.tokenize import tokenizer_for
    search = searcher(Path(os.environ["TANTIVY_BENCH_INDEX"]), tokenizer_for(Config()))
    app = Flask(__name__)

    @app.post("/mcp/search")
    def _search():
        body = request.get_json()
        return jsonify({"results": [{"rowid": i, "bm25_score": sc} for sc, i in search(body["query"])[:body.get("top_k", 10)]]})

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
    n, s = build(Path(a.data), Path(a.index))
    print(f"indexed {n} units in {s:.1f} s")
