"""The bare app: the fair limit a whole-question search is compared with (issue 42). What a minimal service
must do for the same answer, and nothing else: Flask behind gunicorn with the service's workers and threads
(2 gthread workers x 8 threads, the same keep-alive), the question tokenized by the service's own tokenizer
(rjieba, identifiers, stemming: the tokens the units were indexed with), tantivy's OR of the terms over an
index of the same units, and the top k answered with each unit's stored fields (content included) and its
score. No keys, no door checks, no rate limit, no metrics, no access log, no read-your-writes, no filters,
no deletions, tantivy's BM25 as it is (lengths in one byte).

Since issue 37 a default search ranks with threads, so that bare app no longer gives the service's answer.
With ``BARE_THREADS`` (a copy of the service's read index) it gives exactly the service's results for the same
question (``same_answers`` checks it): the service's read index opened once, the thread-aware ranking
(``service/readindex/threaded.py``) and the answer's shaping (``service/ranking/results.py``) called directly,
and still nothing else: no keys, doors, rate limit, slots, metrics, access log, read-your-writes' tail,
deletions, catalog or freshness. What a minimal service giving today's answer must do.

    python bench/bare_app.py --data DIR --index OUT                # build from a service data dir
    BARE_INDEX=OUT gunicorn -w 2 -k gthread --threads 8 'bare_app:create_app()'   # (http_bench.py does)
    BARE_THREADS=COPY gunicorn ... 'bare_app:create_app()'         # the same answer as the service's
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


def copy_read_index(data_dir: Path, out: Path) -> Path:
    """A copy of a service data dir's read index (the default tenant's), for ``threaded_searcher``."""
    from service.readindex.schema import index_dir
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(index_dir(Path(data_dir), "default"), out)
    return out


def threaded_searcher(path: Path, tokenizer, config):
    """A search function giving the service's default answer (its ``results``) from a copy of its read index:
    the same terms, BM25 weights, thread-aware ranking and shaping as service/store/sqlite/search.py's
    ``_search_index`` and ``_results`` with no tail (every unit indexed) and nothing deleted."""
    from service.params import parse_search
    from service.ranking.bm25 import B, K1, Bm25
    from service.ranking.results import MAX_QUERY_TERMS, shape_results
    from service.ranking.scoring import Stats
    from service.readindex import searcher as index
    from service.readindex import threaded
    from service.readindex.reader import Reader
    from service.ranking.threads import Naming
    naming = Naming(tokenizer)
    view = Reader(Path(path)).current()
    if view is None:
        raise SystemExit(f"no read index at {path}")

    def search(q: str, k: int = 10) -> list[dict]:
        p = parse_search({"query": q, "top_k": k}, config)
        terms = tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS]
        if not terms:
            return []
        idf = [view.idf(term) for term in terms]
        avgdl = index.mean_length(view, terms)
        ranked = []
        if all(idf) or p.operator == "or":
            ranked = threaded.best(view, p, terms, Bm25.of(idf, avgdl).weights, int(time.time()), lambda cids: set(),
                                   naming)
        return shape_results(p, terms, ranked, Stats(idf, K1, B, avgdl, view.ndocs), tokenizer)
    return search


def same_answers(data_dir: Path, path: Path, questions: list[str]) -> int:
    """How many of ``questions`` the threaded bare app answers exactly as the service does in-process over
    ``data_dir`` (its results, every field and score); a bench that finds a difference says so."""
    from common import app_parts
    from service import create_app
    from service.params import parse_search
    app = create_app({"data_dir": str(data_dir), "background": False, "access_log": False})
    try:
        store, config = app_parts(app).store, app.config["CONTEXT"]
        bare = threaded_searcher(path, store.tokenizer, config)
        return sum(store.search("default", parse_search({"query": q}, config))["results"] == bare(q)
                   for q in questions)
    finally:
        app_parts(app).shutdown()


def create_app():
    """POST /mcp/search ({"query", "top_k"}) and GET /healthz behind Flask, index from BARE_INDEX (tantivy's
    BM25 alone) or BARE_THREADS (the service's answer)."""
    from flask import Flask, jsonify, request

    from service.config import Config
    from service.tokenize import tokenizer_for
    config = Config()
    if os.environ.get("BARE_THREADS"):
        search = threaded_searcher(Path(os.environ["BARE_THREADS"]), tokenizer_for(config), config)
    else:
        search = searcher(Path(os.environ["BARE_INDEX"]), tokenizer_for(config))
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
