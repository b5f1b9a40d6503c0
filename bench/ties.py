"""Ties past the read index's candidates: the answer against exhaustive (score, CID) order, in process.

For each bench query whose tie at the k-th place goes past the candidates (the search asks tantivy for
more than 2 x RESCORE_MAX), every one of tantivy's best TIE_MAX is scored exactly from its stored tokens
and ordered by (score, CID), the order both stores define, and compared with the service's answer;
timed beside that exhaustive scoring (the naive way to the same answer) and tantivy's own best k.
Run on a built SQLite data folder (bench/postgresql.py leaves one per size):

    .venv/bin/python bench/ties.py [--data bench/results/tmp/pg-bench-sqlite-1000000] [--queries 300]
        [--name ties-1m]
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import TMP, app_parts, machine, quiet_service_logs, service_rev, service_src, write_json


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(TMP / "pg-bench-sqlite-1000000"))
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--name", default="ties-1m")
    a = ap.parse_args(argv)
    src = service_src("head")
    quiet_service_logs()
    from corpus import queries
    from service import create_app
    from service.params import parse_search
    from service.ranking.bm25 import K1, length_norm
    from service.readindex import searcher as index
    from tantivy import Occur, Query

    app = create_app({"data_dir": a.data, "background": False, "search_cpu_ms": 0})
    store, cfg = app_parts(app).store, app.config["CONTEXT"]
    wide = {"n": 0}
    search = index.search

    def counting(view, p, terms, now, want=None):
        wide["n"] += bool(want and want > 2 * index.RESCORE_MAX)
        return search(view, p, terms, now, want=want)
    index.search = counting
    out = {"machine": machine(), "service_rev": service_rev(src), "data": a.data, "tie_max": index.TIE_MAX,
           "queries": a.queries, "past_candidates": [], "same": 0}
    try:
        view = store.readers.view("default")
        now = int(time.time())
        for q in queries(a.queries, a.seed):
            p = parse_search({"query": q, "top_k": a.top_k}, cfg)
            before = wide["n"]
            t = time.perf_counter()
            got = [r["cid"] for r in store.search("default", p)["results"]]
            ms = (time.perf_counter() - t) * 1000
            if wide["n"] == before:
                continue
            terms = store.tokenizer.query_terms(q)
            t = time.perf_counter()                 # tantivy alone: its own best k, nothing else
            view.searcher.search(Query.boolean_query(
                [(Occur.Should, Query.term_query(view.schema, "t", term)) for term in terms]), a.top_k, count=False)
            engine_ms = (time.perf_counter() - t) * 1000
            t = time.perf_counter()                 # the naive answer: every one of tantivy's best TIE_MAX scored
            weights = [view.idf(term) * (K1 + 1) for term in terms]
            hits = search(view, p, terms, now, want=index.TIE_MAX)
            lengths = view.searcher.fast_field_values("len", [h.address for h in hits])
            avgdl = index.average_length(view, terms, hits[0])
            scoring = index.scoring_terms(terms, weights)
            exact = sorted((-x.score, index.unit_of(x.document(view.searcher))["cid"]) for x in (
                index.score_exactly(view.searcher, h, n, length_norm(n, avgdl), scoring, len(terms))
                for h, n in zip(hits, lengths)))[:a.top_k]
            naive_ms = (time.perf_counter() - t) * 1000
            same = [cid for _, cid in exact] == got
            out["same"] += same
            out["past_candidates"].append({"query": q, "same": same, "search_ms": round(ms, 1),
                                           "exhaustive_ms": round(naive_ms, 1), "tantivy_alone_ms": round(engine_ms, 2),
                                           "candidates_scored_here": len(hits)})
            print(f"{'same' if same else 'DIFFERENT'}  service {ms:6.1f} ms  exhaustive {naive_ms:7.1f} ms  "
                  f"tantivy alone {engine_ms:5.2f} ms  {q}", flush=True)
    finally:
        index.search = search
        app_parts(app).shutdown()
    rows = out["past_candidates"]
    if rows:
        out["median_ms"] = {key: statistics.median(r[key] for r in rows)
                            for key in ("search_ms", "exhaustive_ms", "tantivy_alone_ms")}
        med = out["median_ms"]
        out["median_ratio"] = {"service_over_exhaustive": round(med["search_ms"] / med["exhaustive_ms"], 3),
                               "service_over_tantivy_alone": round(med["search_ms"] / med["tantivy_alone_ms"], 1)}
    print(f"== {len(rows)} queries tie past the candidates; {out['same']} answer the "
          f"exhaustive (score, CID) order over tantivy's best {index.TIE_MAX}; medians {out.get('median_ms')}, "
          f"ratios {out.get('median_ratio')}")
    write_json(a.name, out)


if __name__ == "__main__":
    main()
