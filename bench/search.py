"""In-process search latency (DESIGN.md section 10): 2-4-term queries from held-back text,
service (30 day shards, replicas) vs the naive baseline (one table), same units.

    python bench/search.py                       # full: 100k and 1M units
    python bench/search.py --sizes 20000 --queries 100
"""
from __future__ import annotations

import os as _os
import sys as _sys
# bench/http.py would shadow the stdlib's http package: keep bench/ last on sys.path.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _HERE] + [_HERE]

import argparse
import time

from common import machine, plt, quiet_service_logs, save_plot, service_rev, service_src, summary, write_json


def run_queries(fn, qs: list[str], warmup: int, max_s: float) -> tuple[list[float], list[int]]:
    for q in qs[:warmup]:
        fn(q)
    lat, hits = [], []
    deadline = time.perf_counter() + max_s
    for q in qs:
        t0 = time.perf_counter()
        n = fn(q)
        lat.append((time.perf_counter() - t0) * 1000)
        hits.append(n)
        if time.perf_counter() > deadline:
            break
    return lat, hits


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=240, help="per system and size")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--name", default="search")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    quiet_service_logs()
    from corpus import baseline_db, queries, service_dir
    from service import create_app
    from service.search import parse_search

    sizes = [int(x) for x in a.sizes.split(",")]
    qs = queries(a.queries + a.warmup, a.seed)
    warm, timed = qs[a.queries:], qs[:a.queries]
    out = {"machine": machine(), "service_rev": service_rev(src), "top_k": a.top_k, "queries": len(timed),
           "query_examples": timed[:8], "sizes": {}}
    raw = {}
    for size in sizes:
        print(f"== {size} units")
        d = service_dir(size, a.seed)
        app = create_app({"data_dir": str(d), "background": False})
        store = app.extensions["context_store"]
        cfg = app.config["CONTEXT"]

        def svc(q):
            res = store.search("default", parse_search({"query": q, "top_k": a.top_k}, cfg))
            return len(res["results"])
        shards = store.search("default", parse_search({"query": "x"}, cfg))["shards_searched"]
        for q in warm:
            svc(q)
        lat_s, hits_s = run_queries(svc, timed, 0, a.max_seconds)
        app.extensions["context_shutdown"]()
        entry = {"shards": shards, "service": summary(lat_s),
                 "service_zero_hit_queries": sum(1 for h in hits_s if h == 0)}
        raw[size] = {"service": lat_s}
        print(f"  service  ({shards} shards): {entry['service']}")
        if not a.no_baseline:
            from baseline.app import BaselineStore
            b = BaselineStore(baseline_db(size, a.seed))

            def base(q):
                return len(b.search(q, a.top_k)["results"])
            for q in warm:
                base(q)
            lat_b, hits_b = run_queries(base, timed, 0, a.max_seconds)
            b.close()
            entry["baseline"] = summary(lat_b)
            raw[size]["baseline"] = lat_b
            entry["ratio_p50_baseline_over_service"] = round(entry["baseline"]["p50_ms"] / entry["service"]["p50_ms"], 2)
            entry["ratio_p99_baseline_over_service"] = round(entry["baseline"]["p99_ms"] / entry["service"]["p99_ms"], 2)
            print(f"  baseline (1 table):  {entry['baseline']}")
        out["sizes"][str(size)] = entry
    out["targets"] = {"p50_ms": 15, "p99_ms": 80, "at": 1_000_000}
    write_json(a.name, out)
    plot(raw, a.name)


def plot(raw: dict, name: str) -> None:
    pyplot = plt()
    from common import pct
    fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for size, systems in raw.items():
        for system, lat in systems.items():
            v = sorted(lat)
            ax.plot(v, [i / len(v) for i in range(1, len(v) + 1)], label=f"{system} {size:,}",
                    linestyle="-" if system == "service" else "--")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of queries")
    ax.axvline(15, color="grey", lw=0.8, ls=":")
    ax.axvline(80, color="grey", lw=0.8, ls=":")
    ax.set_title("in-process search latency CDF (targets 15 / 80 ms)")
    ax.legend(fontsize=8)
    ax = axes[1]
    sizes = sorted(raw)
    for system in ("service", "baseline"):
        xs = [s for s in sizes if system in raw[s]]
        if not xs:
            continue
        for p, ls in ((50, "-"), (99, "--")):
            ax.plot(xs, [pct(raw[s][system], p) for s in xs], marker="o", ls=ls, label=f"{system} p{p}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("units (log)")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title("search latency vs corpus size")
    ax.legend(fontsize=8)
    save_plot(fig, name)


if __name__ == "__main__":
    main()
