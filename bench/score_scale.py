"""What a score threshold keeps, on the judged sets of bench/quality.py (QUALITY_DATA).

Every document of each set is pushed through the service and every query searched (top 10, with
``explain``), exactly as bench/quality.py does. For each candidate normalisation of the raw BM25
score into 0-1 this reports, at thresholds 0.3/0.5/0.7:

- ``kept_relevant``: of the judged-relevant units in the top 10, the share whose score passes
  (the issue's target: at least 90 % at 0.5, on both sets);
- ``kept_other``: the same share for the top-10 units not judged relevant (lower is better:
  a threshold that keeps everything means nothing);
- ``empty_queries``: queries left with no result at that threshold.

The raw top-10 lists (with explain) are cached under bench/results/tmp/ so that candidates can be
compared again without re-indexing (``--cached``).

    .venv/bin/python bench/score_scale.py [--sets stard,scifact] [--limit-queries N] [--cached]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import quality  # noqa: E402  (bench/quality.py: the judged data and the service run)

RESULTS_DIR = ROOT / "bench" / "results"
THRESHOLDS = (0.3, 0.5, 0.7)


def collect(set_name: str, limit_queries: int | None) -> list[dict]:
    """[{qid, relevant: [...], results: [{doc, bm25, score, idf_sum, explain...}]}] for one set."""
    from common import app_parts
    corpus, queries, qrels = quality.load_set(set_name, limit_queries)
    print(f"[{set_name}] {len(corpus)} docs, {len(queries)} queries", file=sys.stderr, flush=True)
    out = []
    with tempfile.TemporaryDirectory(prefix="score-scale-") as tmp:
        app = quality._create_app({"data_dir": os.path.join(tmp, "data"), "background": False}, {})
        try:
            client = app.test_client()
            maint = app_parts(app).maintenance
            now = int(time.time())
            cid_to_doc = {}
            for start in range(0, len(corpus), quality.BATCH):
                chunk = corpus[start:start + quality.BATCH]
                units = [{"type": "tool_output", "source": "eval_quality", "timestamp": now,
                          "ttl": 31_536_000, "content": quality.content_of(title, text)} for _, title, text in chunk]
                resp = client.post("/mcp/push", json={"units": units})
                for (doc_id, _, _), r in zip(chunk, resp.get_json()["results"]):
                    cid_to_doc[r["cid"]] = doc_id
            while maint.run_once() > 0:
                pass
            for _ in range(50):
                maint.run_once()
                fresh = client.post("/mcp/search", json={"query": "x", "top_k": 1}).get_json()["freshness"]
                if fresh["index_pending"] == 0:
                    break
                time.sleep(0.25)
            for qid, text in queries:
                body = client.post("/mcp/search", json={"query": text, "top_k": 10, "explain": True}).get_json()
                results = []
                for r in body["results"]:
                    ex = r["explain"]
                    results.append({"doc": cid_to_doc[r["cid"]], "bm25": r["bm25_score"], "score": r["score"],
                                    "idf": [t["idf"] for t in ex["terms"]], "tf": [t["tf"] for t in ex["terms"]],
                                    "doc_len": ex["doc_len"], "avgdl": ex["avg_doc_len"], "k1": ex["k1"],
                                    "b": ex["b"], "documents": ex["documents"]})
                out.append({"qid": qid, "relevant": sorted(qrels.get(qid, {})), "results": results})
        finally:
            app_parts(app).shutdown()
    return out


# --- candidate normalisations: f(result, results of its query) -> 0..1 --------------------------
def _sat(r) -> list[float]:
    """Each query term's saturation tf*(k1+1)/(tf+norm): 1 for one occurrence at average length."""
    k1, b = r["k1"], r["b"]
    norm = k1 * (1 - b + b * r["doc_len"] / r["avgdl"])
    return [tf * (k1 + 1) / (tf + norm) for tf in r["tf"]]


def former(r, rs):
    """The score before issue 14: bm25 / sum(idf * (k1 + 1)), a score no document reaches."""
    return r["bm25"] / (sum(w * (r["k1"] + 1) for w in r["idf"]) or 1.0)


def service_scale(r, rs):
    """The service's normalisation (service/store/sqlite/search.py Scale), recomputed from the raw scores."""
    from service.ranking.scoring import Scale
    return Scale.of(rs[0]["bm25"], rs[0]["idf"], rs[0]["documents"]).score(r["bm25"])


def served(r, rs):
    """The score the service returned in this run (equals service_scale unless the cache is older)."""
    return r["score"]


def per_term_once(r, rs):
    """bm25 / sum(idf): 1 when every query term occurs once at average length (capped at 1)."""
    s = sum(w for w in r["idf"] if w) or 1.0
    return min(1.0, r["bm25"] / s)


def relative(r, rs):
    """bm25 / the query's best bm25."""
    return r["bm25"] / rs[0]["bm25"] if rs and rs[0]["bm25"] else 0.0


CANDIDATES = {f.__name__: f for f in (former, per_term_once, relative, service_scale, served)}


def evaluate(data: list[dict], fn) -> dict:
    out = {}
    for th in THRESHOLDS:
        rel_n = rel_kept = other_n = other_kept = empty = 0
        for q in data:
            rs = q["results"]
            relevant = set(q["relevant"])
            kept_any = False
            for r in rs:
                s = fn(r, rs)
                keep = s >= th
                kept_any |= keep
                if r["doc"] in relevant:
                    rel_n += 1
                    rel_kept += keep
                else:
                    other_n += 1
                    other_kept += keep
            empty += not kept_any
        out[str(th)] = {"kept_relevant": round(rel_kept / rel_n, 4) if rel_n else None,
                        "kept_other": round(other_kept / other_n, 4) if other_n else None,
                        "empty_queries": round(empty / len(data), 4) if data else None,
                        "relevant_in_top10": rel_n}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="stard,scifact")
    ap.add_argument("--limit-queries", type=int, default=None)
    ap.add_argument("--cached", action="store_true", help="reuse bench/results/tmp/score-scale-<set>.json")
    ap.add_argument("--name", default="score-scale")
    args = ap.parse_args(argv)
    report = {"command": "python bench/score_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "sets": {}}
    for set_name in [s for s in args.sets.split(",") if s]:
        cache = RESULTS_DIR / "tmp" / f"score-scale-{set_name}.json"
        if args.cached and cache.exists():
            data = json.loads(cache.read_text())
        else:
            data = collect(set_name, args.limit_queries)
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(data))
        report["sets"][set_name] = {name: evaluate(data, fn) for name, fn in CANDIDATES.items()}
        print(f"\n[{set_name}] {len(data)} queries; share kept at threshold "
              + " / ".join(map(str, THRESHOLDS)) + " (relevant | other | queries left empty)")
        for name, res in report["sets"][set_name].items():
            cells = [f"{res[str(t)]['kept_relevant']:.3f} | {res[str(t)]['kept_other']:.3f} | "
                     f"{res[str(t)]['empty_queries']:.3f}" for t in THRESHOLDS]
            print(f"  {name:20s} " + "   ".join(cells))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
