"""Retrieval quality on the judged sets STARD and SciFact (docs/design.md §10; where to get them and
how to lay them out: bench/README.md, "Judged sets"; QUALITY_DATA names their folder).

For each set (BEIR format: corpus.jsonl.gz, queries.jsonl, qrels.tsv) this measures, on the
same documents and queries:

- ``service``: the Context Mode Service itself, through its own paths: every document pushed
  with ``POST /mcp/push`` (test client, batches of 1000), the indexer drained, every query run
  with ``POST /mcp/search`` (top_k 100);
- ``service-postgresql``: the same on the PostgreSQL backend (``CONTEXT_STORE``, a primary
  and a streaming standby started by tools/pg_cluster.py; default searches read the standby);
- ``fts5-unicode61``: SQLite FTS5, default tokenizer, raw text, ``ORDER BY rank``;
- ``fts5-trigram``: SQLite FTS5 ``trigram`` tokenizer, query = OR of the query's trigrams;
- ``bm25s-service-tokens``: bm25s (Lucene BM25, same k1/b as the service) over exactly the
  service's tokens (isolates ranking from tokenization: it should equal ``service``);
- ``bm25s-own``: bm25s with its own analysis as in the eval README table (English:
  bm25s tokenizer + English stopwords + Snowball stemmer, k1=1.2 b=0.75; Chinese: jieba
  ``lcut`` (rjieba, identical tokens) + the set's ``stopwords.txt``, k1=0.9 b=0.4);
- ``bm25s-han-field`` (only when ``--systems`` names it): the service's tokens, and each text's Han
  characters as a second BM25 field at half weight (a lever for Chinese, not in the service).

Measures (ranx): nDCG@10, MRR@10, Recall@10, Recall@100. Every system's ranking is
evaluated in its own order (scores are replaced by rank so ties cannot be re-broken).

    .venv/bin/python bench/quality.py [--sets stard,scifact] [--limit-queries N]
        [--systems service,fts5-unicode61,...] [--k1 X --b Y] [--stem/--no-stem] [--no-write]
"""
from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# QUALITY_DATA: the folder holding stard/ and scifact/; else the team machines' copy beside the checkout.
EVAL_DIR = Path(os.environ.get("QUALITY_DATA") or ROOT.parent / "shared" / "eval").resolve()
RESULTS_DIR = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

SYSTEMS = ("service", "service-postgresql", "fts5-unicode61", "fts5-trigram", "bm25s-service-tokens", "bm25s-own")
MEASURED_ONLY = ("bm25s-han-field",)      # run only when --systems names them
METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100")
TOP_K = 100
BATCH = 1000
# The best published figures and baselines measured on the same files (bench/README.md), for the report.
README_BASELINES = [
    ("stard", "bm25s k1=0.9 b=0.4, jieba + STARD stopwords", 0.342, 0.631),
    ("stard", "bm25s, jieba, no stopwords", 0.345, 0.620),
    ("stard", "tantivy 0.27, rjieba pre-segmented", 0.354, 0.634),
    ("scifact", "bm25s k1=1.2 b=0.75, stemmer + stopwords", 0.679, 0.913),
    ("scifact", "tantivy 0.27 default English", 0.686, 0.925),
    ("scifact", "Pyserini flat (BEIR)", 0.679, 0.925),
]


# --- data --------------------------------------------------------------------------------------
def load_set(name: str, limit_queries: int | None):
    d = EVAL_DIR / name
    if not d.is_dir():
        raise SystemExit(f"no judged set {name!r} in {EVAL_DIR}: set QUALITY_DATA to the folder holding stard/ and "
                         "scifact/ (bench/README.md, 'Judged sets')")
    corpus = []
    # BEIR's own download has corpus.jsonl and qrels/test.tsv; either layout works.
    gz = d / "corpus.jsonl.gz"
    with (gzip.open(gz, "rt", encoding="utf-8") if gz.exists() else open(d / "corpus.jsonl", encoding="utf-8")) as fh:
        for line in fh:
            doc = json.loads(line)
            corpus.append((str(doc["_id"]), doc.get("title") or "", doc.get("text") or ""))
    qrels: dict[str, dict[str, int]] = {}
    with open(d / "qrels.tsv" if (d / "qrels.tsv").exists() else d / "qrels" / "test.tsv", encoding="utf-8") as fh:
        next(fh)  # header
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            qid, did, score = parts[0], parts[1], int(float(parts[2]))
            if score > 0:
                qrels.setdefault(qid, {})[did] = score
    queries = []
    with open(d / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            q = json.loads(line)
            if str(q["_id"]) in qrels:
                queries.append((str(q["_id"]), q["text"]))
    if limit_queries:
        queries = queries[:limit_queries]
    keep = {q for q, _ in queries}
    qrels = {q: r for q, r in qrels.items() if q in keep}
    return corpus, queries, qrels


def content_of(title: str, text: str) -> str:
    return title + "\n" + text


# --- measures ----------------------------------------------------------------------------------
def evaluate(qrels: dict, ranked: dict[str, list[str]]) -> dict:
    from ranx import Qrels, Run, evaluate as rx_evaluate
    run = {}
    for qid in qrels:
        docs = ranked.get(qid) or []
        # Scores from rank, so ranx keeps each system's own order (ties included).
        run[qid] = {d: float(len(docs) - i) for i, d in enumerate(docs)} or {"__no_result__": 0.0}
    scores = rx_evaluate(Qrels.from_dict(qrels), Run.from_dict(run), list(METRICS))
    return {m: round(float(scores[m]), 4) for m in METRICS}


# --- the service -------------------------------------------------------------------------------
def _create_app(cfg: dict, info: dict):
    """create_app, tolerating a broken optional front door (MCP/adapters being edited elsewhere):
    the push and search blueprints measured here do not depend on them."""
    import service
    try:
        return service.create_app(cfg)
    except Exception as e:  # noqa: BLE001
        info["optional_front_doors_skipped"] = f"{type(e).__name__}: {e}"
        print(f"warning: create_app failed in an optional front door ({e}); retrying without them",
              file=sys.stderr)
        original = service._register_optional
        service._register_optional = lambda app: None
        try:
            return service.create_app(cfg)
        finally:
            service._register_optional = original


def run_service(corpus, queries, overrides: dict) -> tuple[dict, dict]:
    from common import app_parts
    info: dict = {}
    with tempfile.TemporaryDirectory(prefix="quality-") as tmp:
        cfg = {"data_dir": os.path.join(tmp, "data"), "background": False, **overrides}
        app = _create_app(cfg, info)
        try:
            client = app.test_client()
            maint = app_parts(app).maintenance
            now = int(time.time())
            cid_to_doc: dict[str, str] = {}
            t0 = time.perf_counter()
            for start in range(0, len(corpus), BATCH):
                chunk = corpus[start:start + BATCH]
                units = [{"type": "tool_output", "source": "eval_quality", "timestamp": now,
                          "ttl": 31_536_000, "content": content_of(title, text)} for _, title, text in chunk]
                resp = client.post("/mcp/push", json={"units": units})
                if resp.status_code != 200:
                    raise RuntimeError(f"push failed: {resp.status_code} {resp.get_data(as_text=True)[:500]}")
                for (doc_id, _, _), r in zip(chunk, resp.get_json()["results"]):
                    if r.get("status") not in ("ok", "duplicate"):
                        raise RuntimeError(f"push of {doc_id} rejected: {r}")
                    cid_to_doc[r["cid"]] = doc_id
            info["push_s"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            while maint.run_once() > 0:
                pass
            info["index_s"] = round(time.perf_counter() - t0, 2)
            # Let the (debounced) replica catch up so searches read what was indexed.
            fresh = None
            for _ in range(50):
                maint.run_once()
                fresh = client.post("/mcp/search", json={"query": "x", "top_k": 1}).get_json()["freshness"]
                if fresh["index_pending"] == 0 and fresh["replica_lag_ms"] == 0:
                    break
                time.sleep(0.25)
            info["freshness"] = fresh
            ranked: dict[str, list[str]] = {}
            t0 = time.perf_counter()
            took = []
            for qid, text in queries:
                resp = client.post("/mcp/search", json={"query": text, "top_k": TOP_K})
                if resp.status_code != 200:
                    raise RuntimeError(f"search {qid} failed: {resp.status_code} {resp.get_data(as_text=True)[:300]}")
                body = resp.get_json()
                took.append(body["took_ms"])
                ranked[qid] = [cid_to_doc[r["cid"]] for r in body["results"]]
            info["search_s"] = round(time.perf_counter() - t0, 2)
            reads = getattr(getattr(app_parts(app).store, "searcher", None), "reads", None)
            if reads is not None:           # (PostgreSQL: what answered the default searches)
                info["searches_read"] = dict(reads)
            took.sort()
            info["search_p50_ms"] = took[len(took) // 2] if took else None
            from service.ranking.bm25 import B, K1
            info["config"] = {"bm25_k1": K1, "bm25_b": B, **{k: getattr(app.config["CONTEXT"], k)
                                                           for k in ("stem", "segmenter", "local_top_n")}}
        finally:
            app_parts(app).shutdown()
    return ranked, info


_PG: dict = {}


def postgresql_store() -> dict:
    """Configuration of a fresh schema on a throwaway primary and standby (started once per run)."""
    import atexit

    import psycopg

    from servers import pg_tool
    if "cluster" not in _PG:
        _PG["cluster"] = cluster = pg_tool().Cluster().start()
        atexit.register(cluster.stop)
        _PG["n"] = 0
    cluster = _PG["cluster"]
    _PG["n"] += 1
    name = f"quality{_PG['n']}"
    with psycopg.connect(cluster.primary_url, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {name}")
    opts = f"-csearch_path%3D{name}%2Cpublic"
    # no search_cpu_ms cap: long queries (STARD's are sentences; top_k 100) pass 1 s there, and this
    # measures ranking (SQLite's default searches read the read index, which has no cap either)
    return {"store": cluster.url(cluster.primary_port, options=opts),
            "store_replica": cluster.url(cluster.standby_port, options=opts), "search_cpu_ms": 0}


# --- FTS5 baselines ----------------------------------------------------------------------------
_WORD = re.compile(r"\w+")


def run_fts5(corpus, queries, tokenizer: str) -> tuple[dict, dict]:
    """A first attempt: one FTS5 table over the raw text, query words OR-ed, ORDER BY rank."""
    conn = sqlite3.connect(":memory:")
    spec = "" if tokenizer == "unicode61" else f", tokenize='{tokenizer}'"
    conn.execute(f"CREATE VIRTUAL TABLE docs USING fts5(body{spec})")
    t0 = time.perf_counter()
    with conn:
        conn.executemany("INSERT INTO docs(rowid, body) VALUES (?, ?)",
                         ((i, content_of(title, text)) for i, (_, title, text) in enumerate(corpus)))
    info = {"index_s": round(time.perf_counter() - t0, 2)}
    ranked = {}
    t0 = time.perf_counter()
    for qid, text in queries:
        words = [w.lower() for w in _WORD.findall(text)]
        if tokenizer == "trigram":
            # Trigram tokens of every word (FTS5 trigram cannot match anything shorter than 3).
            terms = list(dict.fromkeys(w[i:i + 3] for w in words for i in range(len(w) - 2)))
        else:
            terms = list(dict.fromkeys(words))
        if not terms:
            ranked[qid] = []
            continue
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        rows = conn.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY rank LIMIT ?",
                            (match, TOP_K)).fetchall()
        ranked[qid] = [corpus[r[0]][0] for r in rows]
    info["search_s"] = round(time.perf_counter() - t0, 2)
    conn.close()
    return ranked, info


# --- bm25s baselines ---------------------------------------------------------------------------
def _bm25s_rank(doc_tokens: list[list[str]], query_tokens: list[list[str]], doc_ids: list[str],
                k1: float, b: float, more: tuple = ()) -> dict[int, list[str]]:
    """Each query's best TOP_K by BM25 (bm25s, Lucene's); ``more``: further fields as (their documents' tokens,
    the queries' tokens, weight), each a BM25 of its own (its lengths, its idf) added at that weight."""
    import numpy as np
    fields = [_bm25s_field(doc_tokens, k1, b) + (query_tokens, 1.0)]
    fields += [_bm25s_field(docs, k1, b) + (queries, w) for docs, queries, w in more]
    out = {}
    for i in range(len(query_tokens)):
        scores = np.zeros(len(doc_ids))
        for retriever, vocab, queries, w in fields:
            q = [vocab[t] for t in dict.fromkeys(queries[i]) if t in vocab]
            if q:
                scores += w * retriever.get_scores(q)
        k = min(TOP_K, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = sorted((int(j) for j in top if scores[j] > 0), key=lambda j: (-scores[j], j))
        out[i] = [doc_ids[j] for j in top]
    return out


def _bm25s_field(doc_tokens: list[list[str]], k1: float, b: float):
    import bm25s
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in toks] for toks in doc_tokens]
    retriever = bm25s.BM25(method="lucene", k1=k1, b=b)
    retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
    return retriever, vocab


def run_bm25s_service_tokens(corpus, queries, overrides: dict) -> tuple[dict, dict]:
    from service.config import Config
    from service.ranking.bm25 import B, K1
    from service.tokenize import Tokenizer, STOPWORDS
    cfg = Config(**{k: v for k, v in overrides.items() if k in ("stem", "segmenter")})
    k1, b = overrides.get("k1", K1), overrides.get("b", B)
    tok = Tokenizer(segmenter=cfg.segmenter, stem=cfg.stem, stopwords=STOPWORDS)
    t0 = time.perf_counter()
    docs = [tok.tokens(content_of(title, text)) for _, title, text in corpus]
    qs = [tok.query_terms(text) for _, text in queries]
    info = {"tokenize_s": round(time.perf_counter() - t0, 2), "k1": k1, "b": b,
            "stem": cfg.stem}
    res = _bm25s_rank(docs, qs, [d for d, _, _ in corpus], k1, b)
    return {qid: res[i] for i, (qid, _) in enumerate(queries)}, info


HAN_FIELD = 0.5        # the Han characters field's weight (bench/README, "Agent memory": the lever for Chinese)


def run_bm25s_han_field(corpus, queries, overrides: dict) -> tuple[dict, dict]:
    """The service's tokens, and each text's Han characters as a second field at HAN_FIELD: the lever issue 48
    found for Chinese memory, measured on documents (not in the service)."""
    from memory_levers import HAN as han         # (the lever's characters, as bench/memory_levers.py measures it)
    from service.ranking.bm25 import B, K1
    from service.tokenize import Tokenizer
    tok = Tokenizer()
    texts = [content_of(title, text) for _, title, text in corpus]
    docs, qs = [tok.tokens(t) for t in texts], [tok.query_terms(text) for _, text in queries]
    chars = ([han.findall(t) for t in texts], [han.findall(text) for _, text in queries], HAN_FIELD)
    res = _bm25s_rank(docs, qs, [d for d, _, _ in corpus], K1, B, more=(chars,))
    return {qid: res[i] for i, (qid, _) in enumerate(queries)}, {"weight": HAN_FIELD}


def run_bm25s_own(set_name: str, corpus, queries) -> tuple[dict, dict]:
    texts = [content_of(title, text) for _, title, text in corpus]
    qtexts = [text for _, text in queries]
    stop_file = EVAL_DIR / set_name / "stopwords.txt"
    if re.search(r"[\u4e00-\u9fff]", "".join(qtexts[:20])):
        import rjieba
        stop = set()
        if stop_file.exists():
            stop = {w.strip() for w in stop_file.read_text(encoding="utf-8").splitlines() if w.strip()}

        def toks(s):
            return [w for w in rjieba.cut(s, False) if w.strip() and w not in stop]
        k1, b = 0.9, 0.4
        info = {"analysis": "rjieba cut (HMM off) + " + ("stopwords.txt" if stop else "no stopwords"),
                "k1": k1, "b": b}
        docs, qs = [toks(t) for t in texts], [toks(q) for q in qtexts]
    else:
        import bm25s
        import Stemmer
        stemmer = Stemmer.Stemmer("english")
        k1, b = 1.2, 0.75
        info = {"analysis": "bm25s tokenizer + English stopwords + Snowball", "k1": k1, "b": b}
        docs = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
        qs = bm25s.tokenize(qtexts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    res = _bm25s_rank(docs, qs, [d for d, _, _ in corpus], k1, b)
    return {qid: res[i] for i, (qid, _) in enumerate(queries)}, info


# --- main --------------------------------------------------------------------------------------
def fmt_table(rows: list[dict]) -> str:
    head = f"{'set':8} {'system':22} " + " ".join(f"{m:>10}" for m in METRICS) + f" {'time_s':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['set']:8} {r['system']:22} " + " ".join(f"{r[m]:>10.4f}" for m in METRICS)
                     + f" {r['time_s']:>8.1f}")
    return "\n".join(lines)


def fmt_markdown(rows: list[dict], command: str) -> str:
    out = ["# Retrieval quality (bench/quality.py)", "", f"Command: `{command}`", "",
           "| set | system | nDCG@10 | MRR@10 | R@10 | R@100 | queries |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['set']} | {r['system']} | " + " | ".join(f"{r[m]:.4f}" for m in METRICS)
                   + f" | {r['queries']} |")
    out += ["", "service = this service through POST /mcp/push and POST /mcp/search (top_k 100); "
            "bm25s-service-tokens = bm25s (Lucene BM25, same k1/b) over the service's own tokens "
            "(an exact global BM25: the service should equal it); "
            "bm25s-own = bm25s with its own analysis (bench/README.md, Judged sets).", "",
            "Baselines measured on the same files, not by this script (bench/README.md, Judged sets):", "",
            "| set | system | nDCG@10 | R@100 |", "|---|---|---|---|"]
    out += [f"| {s} | {name} | {n:.3f} | {r:.3f} |" for s, name, n, r in README_BASELINES]
    out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="stard,scifact")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--limit-queries", type=int, default=None)
    ap.add_argument("--k1", type=float, default=None, help="k1 of the bm25s baseline over the service's tokens "
                    "(the service ranks with tantivy's fixed k1 1.2, b 0.75)")
    ap.add_argument("--b", type=float, default=None, help="b of that baseline")
    ap.add_argument("--stem", action=argparse.BooleanOptionalAction, default=None,
                    help="override the service's English stemming")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/")
    ap.add_argument("--out", default="quality", help="results file name (bench/results/<out>.json and .md)")
    args = ap.parse_args(argv)

    overrides: dict = {}
    if args.k1 is not None:
        overrides["k1"] = args.k1
    if args.b is not None:
        overrides["b"] = args.b
    if args.stem is not None:
        overrides["stem"] = args.stem
    systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS + MEASURED_ONLY]
    if bad:
        ap.error(f"unknown system {bad[0]!r}; known: {', '.join(SYSTEMS + MEASURED_ONLY)}")
    if not EVAL_DIR.is_dir():
        ap.error(f"judged data not found at {EVAL_DIR}")

    rows, details = [], {}
    for set_name in [s for s in args.sets.split(",") if s]:
        corpus, queries, qrels = load_set(set_name, args.limit_queries)
        print(f"[{set_name}] {len(corpus)} docs, {len(queries)} queries", file=sys.stderr, flush=True)
        for system in systems:
            t0 = time.perf_counter()
            if system == "service":
                ranked, info = run_service(corpus, queries, overrides)
            elif system == "service-postgresql":
                ranked, info = run_service(corpus, queries, {**overrides, **postgresql_store()})
            elif system == "fts5-unicode61":
                ranked, info = run_fts5(corpus, queries, "unicode61")
            elif system == "fts5-trigram":
                ranked, info = run_fts5(corpus, queries, "trigram")
            elif system == "bm25s-service-tokens":
                ranked, info = run_bm25s_service_tokens(corpus, queries, overrides)
            elif system == "bm25s-han-field":
                ranked, info = run_bm25s_han_field(corpus, queries, overrides)
            else:
                ranked, info = run_bm25s_own(set_name, corpus, queries)
            elapsed = time.perf_counter() - t0
            scores = evaluate(qrels, ranked)
            row = {"set": set_name, "system": system, **scores, "queries": len(queries),
                   "time_s": round(elapsed, 1)}
            rows.append(row)
            details[f"{set_name}/{system}"] = {**row, "info": info}
            print(f"[{set_name}] {system}: " + ", ".join(f"{m}={scores[m]:.4f}" for m in METRICS)
                  + f" ({elapsed:.1f}s) {json.dumps(info, ensure_ascii=False)}", file=sys.stderr, flush=True)
            del ranked
            gc.collect()
        del corpus
        gc.collect()

    print(fmt_table(rows))
    if not args.no_write:
        command = ".venv/bin/python bench/quality.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                         if (argv if argv is not None else sys.argv[1:]) else "")
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        payload = {"command": command, "eval_dir": str(EVAL_DIR), "sqlite": sqlite3.sqlite_version,
                   "python": platform.python_version(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "overrides": overrides, "rows": rows, "details": details}
        (RESULTS_DIR / f"{args.out}.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n",
                                                      encoding="utf-8")
        (RESULTS_DIR / f"{args.out}.md").write_text(fmt_markdown(rows, command), encoding="utf-8")
        print(f"wrote {RESULTS_DIR / args.out}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
