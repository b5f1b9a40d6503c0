"""In-process search latency (docs/design.md §10): 2-4-term queries from held-back text,
service (30 day shards, read index) vs the naive baseline (one table) and tantivy over the same
tokens (the engine limit), same units; plus the read index's build rate and size, filter costs,
and top-10 agreement with exhaustive exact-length BM25 scoring.

    python bench/search.py                       # full: 100k and 1M units
    python bench/search.py --sizes 20000 --queries 100
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from common import app_parts, machine, plt, quiet_service_logs, save_plot, service_rev, service_src, summary, write_json


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


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=240, help="per system and size")
    ap.add_argument("--agreement-queries", type=int, default=300,
                    help="queries compared with exhaustive exact-length scoring (slow at 1M)")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--no-rebuild", action="store_true", help="do not time a rebuild of the read index")
    ap.add_argument("--name", default="search")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    quiet_service_logs()
    from corpus import baseline_db, queries, service_dir
    from service import create_app
    from service.params import parse_search

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
        store = app_parts(app).store
        maint = app_parts(app).maintenance
        cfg = app.config["CONTEXT"]
        t = store.tenant("default")
        entry: dict = {}
        index_path = d / "tenants" / "default" / "replica" / "index"
        if not a.no_rebuild:
            # The read index from nothing: every indexed row of every shard sent again.
            maint.read_syncs.clear()
            shutil.rmtree(index_path, ignore_errors=True)
            t0 = time.perf_counter()
            sent = maint.sync_read_index(maint.read_sync(t.name))
            build_s = time.perf_counter() - t0
            entry["read_index_build"] = {"units": sent, "seconds": round(build_s, 2),
                                         "units_per_s": round(sent / build_s)}
            print(f"  read index built: {sent} units in {build_s:.1f} s ({sent / build_s:.0f}/s)")
        else:
            maint.run_once()
        units = store.searcher.view(t).searcher.num_docs
        replica_bytes = dir_bytes(index_path)
        primary_bytes = dir_bytes(d / "tenants" / "default" / "primary")
        entry["disk"] = {"read_index_bytes": replica_bytes, "read_index_bytes_per_unit": round(replica_bytes / units, 1),
                         "primary_bytes_per_unit": round(primary_bytes / units, 1),
                         "previous_replica_bytes_per_unit": round(79e6 / 33_000, 1)}
        print(f"  disk: read index {replica_bytes / 1e6:.1f} MB = {replica_bytes / units:.0f} B/unit "
              f"(per-day replicas with impact lists were ~{79e6 / 33_000:.0f} B/unit)")

        def svc(q, store=store, cfg=cfg, **extra):
            res = store.search("default", parse_search({"query": q, "top_k": a.top_k, **extra}, cfg))
            return len(res["results"])
        shards = store.search("default", parse_search({"query": "x"}, cfg))["shards_searched"]
        for q in warm:
            svc(q)
        lat_s, hits_s = run_queries(svc, timed, 0, a.max_seconds)
        entry.update({"shards": shards, "service": summary(lat_s),
                      "service_zero_hit_queries": sum(1 for h in hits_s if h == 0)})
        raw[size] = {"service": lat_s}
        print(f"  service  ({shards} shards): {entry['service']}")
        # Filters and AND on the same path, relative to the unfiltered p50.
        now = int(time.time())
        variants = {"types": {"types": ["tool_output"]}, "source_prefix": {"source": "curl_tool*"},
                    "since_7_days": {"since": now - 7 * 86_400}, "operator_and": {"operator": "and"},
                    "highlight": {"highlight": True}, "explain": {"explain": True}}
        entry["variants"] = {}
        for name, extra in variants.items():
            lat_v, _ = run_queries(lambda q, extra=extra: svc(q, **extra), timed[:200], 10, a.max_seconds / 4)
            v = summary(lat_v)
            v["p50_over_unfiltered"] = round(v["p50_ms"] / entry["service"]["p50_ms"], 2)
            entry["variants"][name] = v
            print(f"  service {name}: p50 {v['p50_ms']} ms ({v['p50_over_unfiltered']}x unfiltered)")
        # Agreement with exhaustive scoring at exact lengths (the FTS5 path scoring every match).
        exact = store.searcher
        exact_cfg = cfg.replace(exact_match_limit=10 ** 12)
        exact.config = exact_cfg
        same = same_mod_ties = total = identical = same_scores = 0
        for q in timed[:a.agreement_queries]:
            fast = store.search("default", parse_search({"query": q, "top_k": a.top_k}, cfg))["results"]
            ref = store.search("default", parse_search({"query": q, "top_k": a.top_k, "consistency": "strong"},
                                                       cfg))["results"]
            ref_cids = {r["cid"] for r in ref}
            cut = ref[-1]["bm25_score"] if len(ref) == a.top_k else -1.0
            same += sum(r["cid"] in ref_cids for r in fast)
            # a unit tied with the reference's k-th score may stand in for another (ties may reorder)
            same_mod_ties += sum(r["cid"] in ref_cids or abs(r["bm25_score"] - cut) <= 1e-4 * max(1.0, cut)
                                 for r in fast)
            total += len(ref)
            identical += [r["cid"] for r in fast] == [r["cid"] for r in ref]
            same_scores += len(fast) == len(ref) and all(
                abs(x["bm25_score"] - y["bm25_score"]) <= 1e-4 * max(1.0, y["bm25_score"]) for x, y in zip(fast, ref))
        exact.config = cfg
        n_agree = min(a.agreement_queries, len(timed))
        entry["agreement_with_exact_lengths"] = {
            "queries": n_agree, "top10_overlap": round(same / max(total, 1), 4),
            "top10_overlap_mod_ties_at_cut": round(same_mod_ties / max(total, 1), 4),
            "identical_lists": round(identical / n_agree, 4), "identical_score_lists": round(same_scores / n_agree, 4)}
        print(f"  top-{a.top_k} vs exact-length exhaustive scoring: overlap {same / max(total, 1):.1%}, "
              f"{same_mod_ties / max(total, 1):.1%} counting ties at the cut; score lists equal in "
              f"{same_scores}/{n_agree}, identical lists {identical}/{n_agree}")
        tokenizer = store.tokenizer
        app_parts(app).shutdown()

        import tantivy_engine
        tv_path = d.parent / (d.name + "-tantivy")
        tv_units, tv_build_s = tantivy_engine.build(d, tv_path)
        search_tv = tantivy_engine.searcher(tv_path, tokenizer, a.top_k)
        for q in warm:
            search_tv(q)
        lat_t, _ = run_queries(search_tv, timed, 0, a.max_seconds)
        shutil.rmtree(tv_path, ignore_errors=True)
        entry["tantivy"] = summary(lat_t)
        entry["tantivy_build_units_per_s"] = round(tv_units / tv_build_s)
        raw[size]["tantivy"] = lat_t
        entry["ratio_p50_service_over_tantivy"] = round(entry["service"]["p50_ms"] / entry["tantivy"]["p50_ms"], 1)
        print(f"  tantivy (engine only): {entry['tantivy']}; service/tantivy p50 {entry['ratio_p50_service_over_tantivy']}x")
        if not a.no_baseline:
            from baseline.app import BaselineStore
            b = BaselineStore(baseline_db(size, a.seed))

            def base(q, b=b):
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
    out["targets"] = {"100k": {"p50_ms": 2, "p99_ms": 10}, "1M": {"p50_ms": 5, "p99_ms": 25}}
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
    ax.axvline(2, color="grey", lw=0.8, ls=":")
    ax.axvline(5, color="grey", lw=0.8, ls=":")
    ax.set_title("in-process search latency CDF (p50 targets 2 / 5 ms)")
    ax.legend(fontsize=8)
    ax = axes[1]
    sizes = sorted(raw)
    for system in ("service", "baseline", "tantivy"):
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
