"""PostgreSQL vs SQLite, side by side in one run: the same units, queries and load on both (issue 24's targets).

- ingest in-process: the same corpus pushed in batches of 1,000 (``push_many``), then indexed (SQLite: FTS5
  and the read index; PostgreSQL: term frequencies and statistics, then the node's read index);
- a node's read index built from PostgreSQL alone (a new node joining: units/s, disk);
- search in-process: 2-4-term queries from held-back text, p50/p99, ``default`` (both: the read index plus
  the tail) and ``strong`` (SQLite: the day files; PostgreSQL: the primary's tables), tantivy alone over the
  same tokens as the limit, and whether both stores return the same top 10 (CIDs in order) per query;
  both stores' searches run after both builds, interleaved query by query (the machine's noise falls
  on both alike);
- HTTP per node: wrk on /mcp/search and /healthz at --conns connections, one SQLite service vs one of two
  PostgreSQL nodes (2 workers each), all up at once, the stores' cells alternating; CPU per request by
  process kind, peak RSS per process;
- freshness across nodes: under --rate units/s pushed to one PostgreSQL node, a probe pushed to that node
  is searched (default) on the other until found; SQLite, one node, for comparison.

PostgreSQL runs from tools/pg_cluster.py (a primary and a standby on loopback, fsync on, 256 MB of
shared buffers each); after the bulk load the script runs VACUUM ANALYZE, as autovacuum would within a
minute or two. The machine is shared: runs are bounded, ratios matter more than absolutes.

    .venv/bin/python bench/postgresql.py [--size 100000] [--queries 300] [--http-seconds 15] [--http-rounds 2]
        [--lag-seconds 20] [--rate 1000] [--conns 64] [--reuse-sqlite]
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import time

from common import TMP, app_parts, machine, quiet_service_logs, r, service_rev, service_src, summary, write_json
from ingest import gen_units, index_lag
from servers import pg_cluster, push_all, wait_index


def build(app, units: list[dict]) -> dict:
    """Push the units in batches of 1,000, then drain the maintenance (index); timed apart."""
    maint = app_parts(app).maintenance
    node_s = [0.0]
    sync = getattr(maint, "sync_read_indexes", None)      # (PostgreSQL: the node's read index, same loop)
    if sync is not None:
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return sync(*args, **kwargs)
            finally:
                node_s[0] += time.perf_counter() - t
        maint.sync_read_indexes = timed
    t0 = time.perf_counter()
    push_all(app, units)
    t1 = time.perf_counter()
    while maint.run_once():
        pass
    t2 = time.perf_counter()
    out = {"units": len(units), "push_s": round(t1 - t0, 2), "push_units_per_s": round(len(units) / (t1 - t0)),
           "index_s": round(t2 - t1, 2), "index_units_per_s": round(len(units) / (t2 - t1))}
    if sync is not None:
        del maint.sync_read_indexes
        out["of_which_read_index_s"] = round(node_s[0], 2)
        out["terms_units_per_s"] = round(len(units) / (t2 - t1 - node_s[0]))
    return out


def drain_node_index(app) -> float:
    """Passes of this process's read-index builder until its index holds every indexed unit; seconds."""
    maint = app_parts(app).maintenance
    t0 = time.perf_counter()
    while True:
        sent = maint.sync_read_indexes()
        ni = maint.read_syncs.get("default")
        if ni is not None and not ni.building and sent == 0:
            return time.perf_counter() - t0


def node_build(cluster, units: int) -> dict:
    """A new node: its read index built from PostgreSQL alone (from the standby when it answers)."""
    from service import create_app
    from service.readindex.schema import index_dir
    root = TMP / "pg-bench-new-node"
    shutil.rmtree(root, ignore_errors=True)
    app = create_app({"data_dir": str(root), "background": False, "store": cluster.primary_url,
                      "store_replica": cluster.standby_url})
    try:
        seconds = drain_node_index(app)
    finally:
        app_parts(app).shutdown()
    disk = sum(f.stat().st_size for f in index_dir(root, "default").rglob("*") if f.is_file())
    return {"units": units, "seconds": round(seconds, 1), "units_per_s": round(units / seconds),
            "disk_mb": round(disk / 2**20, 1)}


def searches(app, qs: list[str], max_s: float, **extra) -> tuple[dict, list]:
    """One app's searches: (summary, tops)."""
    lat, tops = searches_side_by_side({"app": app}, qs, max_s, **extra)
    return lat["app"], tops["app"]


SLOWEST = 10           # queries timed again after a side-by-side run


def searches_side_by_side(apps: dict, qs: list[str], max_s: float, **extra) -> tuple[dict, dict]:
    """``searches`` on every app, one query at a time on each in turn (so that the machine's noise falls
    on both alike): {name: summary}, {name: tops}."""
    from service.params import parse_search
    runs = {name: (app_parts(app).store, app.config["CONTEXT"]) for name, app in apps.items()}

    def search(name: str, q: str) -> dict:
        store, config = runs[name]
        return store.search("default", parse_search({"query": q, "top_k": 10, **extra}, config))

    for name in runs:
        for q in qs[:20]:
            search(name, q)
    lat: dict = {name: [] for name in runs}
    tops: dict = {name: [] for name in runs}
    deadline = time.perf_counter() + max_s * len(runs)
    for q in qs:
        for name in runs:
            t0 = time.perf_counter()
            body = search(name, q)
            lat[name].append((time.perf_counter() - t0) * 1000)
            tops[name].append([(r["cid"], r["bm25_score"]) for r in body["results"]])
        if time.perf_counter() > deadline:
            break
    out = {name: summary(v) for name, v in lat.items()}
    # The p99 of single-shot searches is a handful of queries: the slowest ones on any store, each timed
    # again (3 times on each store in turn) so that a pause that fell on one call shows as such.
    names = list(runs)
    slow = sorted(range(len(lat[names[0]])), key=lambda i: -max(lat[n][i] for n in names))[:SLOWEST]
    again: dict = {i: {n: [] for n in names} for i in slow}
    for _ in range(3):
        for i in slow:
            for name in runs:
                t0 = time.perf_counter()
                search(name, qs[i])
                again[i][name].append((time.perf_counter() - t0) * 1000)
    for name in names:
        out[name]["slowest"] = [{"query": qs[i], "ms": r(lat[name][i]), "again_min_ms": r(min(again[i][name])),
                                 "again_max_ms": r(max(again[i][name]))} for i in slow]
    return out, tops


def tantivy_alone(sqlite_dir, qs: list[str], tokenizer) -> dict:
    """The engine limit: tantivy over the same tokens, no rows fetched, no filters (bench/tantivy_engine.py)."""
    import tantivy_engine
    path = TMP / f"{sqlite_dir.name}-tantivy"
    tantivy_engine.build(sqlite_dir, path)
    search = tantivy_engine.searcher(path, tokenizer)
    for q in qs[:20]:
        search(q)
    lat = []
    for q in qs:
        t0 = time.perf_counter()
        search(q)
        lat.append((time.perf_counter() - t0) * 1000)
    return summary(lat)


def agreement(a: list, b: list) -> dict:
    same = sum(1 for x, y in zip(a, b) if [c for c, _ in x] == [c for c, _ in y])
    # the same CIDs with exactly equal scores in another order: ties, broken by each engine's own order
    tied = sum(1 for x, y in zip(a, b) if [c for c, _ in x] != [c for c, _ in y]
               and sorted(x) == sorted(y))
    diff = max((abs(s - t) for x, y in zip(a, b) for (_, s), (_, t) in zip(x, y)), default=0.0)
    # the same score at every place (other CIDs only where units tie exactly: which of the tied units
    # fill the last places is each index's document order, see tied_at_tenth)
    scores = sum(1 for x, y in zip(a, b) if [s for _, s in x] == [s for _, s in y])
    return {"queries": min(len(a), len(b)), "same_top10": same, "same_set_other_order": tied,
            "same_scores": scores, "max_bm25_diff": diff}


def tied_at_tenth(app, qs: list[str], a: list, b: list) -> list[int]:
    """For each query whose top 10 differs between the stores, how many units of the read index score
    exactly what its 10th does (tantivy's score): ties no candidate list of a bounded size breaks alike."""
    from tantivy import Occur, Query

    from service.ranking.results import MAX_QUERY_TERMS
    store = app_parts(app).store
    view = store.searcher.readers.view("default")
    out = []
    for q, x, y in zip(qs, a, b):
        if [c for c, _ in x] == [c for c, _ in y] or len(x) < 10:
            continue
        terms = store.tokenizer.query_terms(q)[:MAX_QUERY_TERMS]      # (the terms the search used)
        query = Query.boolean_query([(Occur.Should, Query.term_query(view.schema, "t", t)) for t in terms])
        hits = view.searcher.search(query, 20_000, count=False).hits
        out.append(sum(1 for s, _ in hits if s == hits[9][0]) if len(hits) >= 10 else 0)
    return sorted(out)


def start_node(hb, src, data_dir, port: int, env: dict):
    return hb.start_gunicorn(src, "service:create_app()", port, f"pg-bench-{port}.log", str(src),
                             CONTEXT_DATA_DIR=str(data_dir), **env)


def rss_of(sampler, pid: int) -> dict:
    from http_bench import role_of
    out: dict = {}
    for p, peak in sampler.peak.items():
        out.setdefault(sampler.roles.get(p) or role_of(p, pid), []).append(round(peak / 2**20, 1))
    return out


def run_http(hb, src, a, sqlite_dir, pg_env: dict, load_units: list[dict]) -> dict:
    """Per node: HTTP search and /healthz throughput at --conns, peak RSS; then freshness under load (on
    PostgreSQL pushed to one node and searched on the other). Every node is up at once and the stores'
    cells alternate, --http-rounds of each (the machine's noise falls on both alike; one store's cells a
    minute after the other's differed by a quarter between runs); a store's figure is its cells' median."""
    import statistics
    scripts = hb.write_inputs(a.seed, "pg")
    out: dict = {}
    nodes: dict = {}        # store -> (ports, processes); node0 answers, node1 (PostgreSQL) is the other node

    def trees(name: str) -> dict:
        return {f"node{i}": proc.pid for i, proc in enumerate(nodes[name][1])}

    def wait_all_idle() -> None:
        for _, procs in nodes.values():
            for proc in procs:
                hb.wait_idle(proc.pid)
    try:
        for name in ("sqlite", "postgresql"):
            ports = [hb.free_port()] + ([hb.free_port()] if name == "postgresql" else [])
            dirs = [TMP / "pg-bench-sqlite-http"] if name == "sqlite" else [TMP / f"pg-node{i}" for i in range(2)]
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            if name == "sqlite":        # a copy: the load below must not change the build --reuse-sqlite reuses
                shutil.copytree(sqlite_dir, dirs[0])
            nodes[name] = (ports, [start_node(hb, src, d, port, {} if name == "sqlite" else pg_env)
                                   for d, port in zip(dirs, ports)])
        for name, (ports, _procs) in nodes.items():
            for port in ports:
                hb.wait_ready(port, 180)
            out[name] = {"node_ready_s": [wait_index(port, 1800) for port in ports]}
        samplers = {name: hb.RssSampler(procs[0].pid) for name, (_, procs) in nodes.items()}
        for sampler in samplers.values():
            sampler.start()
        for workload in ("search", "healthz"):
            cells: dict = {name: [] for name in nodes}
            for _ in range(a.http_rounds):
                for name, (ports, _procs) in nodes.items():
                    wait_all_idle()
                    before = hb.cpu_seconds(trees(name))
                    run = hb.wrk(scripts[workload], ports[0], a.conns, a.http_seconds)
                    cell = {k: run[k] for k in ("rps", "errors", "p50", "p99")}
                    # where a request's CPU went (node0 answers; on PostgreSQL also its server and node1)
                    cell["cpu_ms_per_request"] = hb.cpu_ms_per_request(before, hb.cpu_seconds(trees(name)),
                                                                       run["requests"])
                    cells[name].append(cell)
                    print(f"   {name}: HTTP {workload} @{a.conns} {json.dumps(cell)}", flush=True)
            for name in nodes:
                out[name][f"{workload}@{a.conns}"] = {
                    "rps": statistics.median(c["rps"] for c in cells[name]),
                    "errors": sum(c["errors"] for c in cells[name]), "cells": cells[name]}
                print(f"== {name}: HTTP {workload} @{a.conns} median of {len(cells[name])} cells: "
                      f"{out[name][f'{workload}@{a.conns}']['rps']} req/s", flush=True)
        for name, sampler in samplers.items():
            sampler.stop.set()
            sampler.join()
            out[name]["peak_rss_mb"] = rss_of(sampler, nodes[name][1][0].pid)
        for name, (ports, _procs) in nodes.items():
            wait_all_idle()
            before, t0 = hb.cpu_seconds(trees(name)), time.perf_counter()
            lag = index_lag(ports[0], load_units, a.rate, a.lag_seconds, search_port=ports[-1])
            lag.pop("raw_ms", None)
            # how busy the machine was (2 cores: 2.0 is all of it; a rate short of the target while
            # near 2.0 is the machine's limit, not the service's) and who used it, in cores
            used, elapsed = hb.cpu_used(before, hb.cpu_seconds(trees(name))), time.perf_counter() - t0
            lag["cores_busy"] = {k: round(v / elapsed, 2) for k, v in used.items() if v > 0.05}
            lag["cores_busy"]["total"] = round(sum(used.values()) / elapsed, 2)
            out[name]["freshness_under_load"] = lag
            print(f"   under {a.rate:.0f} units/s pushed to one node, found on {'the other' if len(ports) > 1 else 'it'}: "
                  f"{json.dumps(lag)}", flush=True)
    finally:
        for _, procs in nodes.values():
            for proc in procs:
                hb.stop(proc)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--max-seconds", type=float, default=60, help="per search kind and backend")
    ap.add_argument("--http-seconds", type=float, default=15)
    ap.add_argument("--http-rounds", type=int, default=2, help="cells of each workload per store, alternating")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--lag-seconds", type=float, default=20)
    ap.add_argument("--rate", type=float, default=1000, help="units/s pushed during the freshness run")
    ap.add_argument("--reuse-sqlite", action="store_true",
                    help="keep the SQLite build a previous run of this size finished (its figures are reported)")
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default=None)
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    quiet_service_logs()
    from corpus import Generator, queries
    from service import create_app
    import http_bench as hb
    cluster = pg_cluster(TMP / "pg-cluster")
    out = {"machine": machine(), "service_rev": service_rev(src), "size": a.size, "postgresql": {}, "sqlite": {}}
    try:
        sqlite_dir = TMP / f"pg-bench-sqlite-{a.size}"
        sqlite_built = TMP / f"pg-bench-sqlite-{a.size}.json"     # the SQLite build's figures, once finished
        built = json.loads(sqlite_built.read_text()) if a.reuse_sqlite and sqlite_built.exists() else {}
        # The units' timestamps, so their CIDs, follow the day the corpus is made: a build is reused with
        # the day it was made on (one that did not record it is made again), or no CID would match.
        reuse = "anchor" in built
        if a.reuse_sqlite and not reuse:
            print("== the SQLite build is made again: none recorded its corpus day", flush=True)
        gen = Generator(a.seed, anchor=built["anchor"] if reuse else None)
        units = list(gen.units(a.size))
        qs = queries(a.queries, a.seed)
        if not reuse:
            shutil.rmtree(sqlite_dir, ignore_errors=True)
            sqlite_built.unlink(missing_ok=True)
        pg_env = {"CONTEXT_STORE": cluster.primary_url, "CONTEXT_STORE_REPLICA": cluster.standby_url}
        # In process, no cap on a search's CPU (as make quality): at 1M, SQLite's strong path passes the
        # default 1 s on common terms, and every query is compared. The HTTP phases keep the default.
        shutil.rmtree(TMP / "pg-bench-app", ignore_errors=True)
        apps = {"sqlite": create_app({"data_dir": str(sqlite_dir), "background": False, "search_cpu_ms": 0}),
                "postgresql": create_app({"data_dir": str(TMP / "pg-bench-app"), "background": False,
                                          "search_cpu_ms": 0,
                                          "store": cluster.primary_url, "store_replica": cluster.standby_url})}
        tops: dict = {"default": {}, "strong": {}}
        for name, app in apps.items():
            res = out[name]
            if name == "sqlite" and reuse:
                res["ingest_inprocess"] = {**built, "reused": True}
                # a read index of an older format (the build is kept across service changes) starts again
                # from the primaries at the first pass
                t0 = time.perf_counter()
                store = app_parts(app).store
                for _ in range(10):
                    app_parts(app).maintenance.run_once()
                    if store.readers.view("default") is not None:
                        break
                res["ingest_inprocess"]["read_index_pass_s"] = round(time.perf_counter() - t0, 1)
            else:
                res["ingest_inprocess"] = build(app, units)
            if name == "sqlite":
                sqlite_built.write_text(json.dumps({**res["ingest_inprocess"], "anchor": gen.anchor}))
            print(f"== {name}: in-process ingest {json.dumps(res['ingest_inprocess'])}", flush=True)
            if name == "postgresql":
                # what autovacuum does within a minute or two of a bulk load: statistics, no dead rows
                import psycopg
                with psycopg.connect(cluster.primary_url, autocommit=True) as c:
                    c.execute("VACUUM ANALYZE")
                    c.execute("CHECKPOINT")     # (the load's dirty pages written before the searches)
                res["ingest_inprocess"]["read_index_s"] = round(drain_node_index(app), 1)
                time.sleep(2)            # the standby replays the build
        # the searches of both stores interleaved query by query, after both builds; the corpus let go
        # first (a million dicts held through the searches made every collection of the garbage
        # collector walk them: PostgreSQL's searches, which allocate more, took 13 ms p50 instead of 6.5)
        del units
        gc.collect()
        for kind, extra in (("default", {}), ("strong", {"consistency": "strong"})):
            lat, tops[kind] = searches_side_by_side(apps, qs, a.max_seconds, **extra)
            for name in apps:
                out[name][f"search_{kind}"] = lat[name]
                print(f"   {name} search {kind} {json.dumps({k: v for k, v in lat[name].items() if k != 'slowest'})}",
                      flush=True)
            for i, row in enumerate(lat["postgresql"]["slowest"]):
                other = lat["sqlite"]["slowest"][i]
                print(f"     slowest {kind}: PG {row['ms']} (again {row['again_min_ms']}-{row['again_max_ms']}) ms, "
                      f"SQLite {other['ms']} (again {other['again_min_ms']}-{other['again_max_ms']}) ms  "
                      f"{row['query'][:50]}", flush=True)
        reads = app_parts(apps["postgresql"]).store.searcher.reads
        out["postgresql"]["searches_read"] = dict(reads)
        for kind in ("default", "strong"):
            out[f"agreement_{kind}_top10"] = agreement(tops[kind]["sqlite"], tops[kind]["postgresql"])
            if kind == "default":
                out["agreement_default_top10"]["tied_at_tenth"] = tied_at_tenth(
                    apps["sqlite"], qs, tops[kind]["sqlite"], tops[kind]["postgresql"])
            print(f"== same top 10 on both ({kind}): {json.dumps(out[f'agreement_{kind}_top10'])}", flush=True)
        tokenizer = app_parts(apps["sqlite"]).store.tokenizer
        for app in apps.values():
            app_parts(app).shutdown()
        out["tantivy_alone"] = tantivy_alone(sqlite_dir, qs, tokenizer)
        print(f"== tantivy alone: {json.dumps(out['tantivy_alone'])}", flush=True)
        out["postgresql"]["node_build"] = node_build(cluster, a.size)
        print(f"== a new node's read index from PostgreSQL: {json.dumps(out['postgresql']['node_build'])}", flush=True)
        ratio = {k: round(out["postgresql"]["search_default"][k] / out["sqlite"]["search_default"][k], 2)
                 for k in ("p50_ms", "p99_ms")}
        out["ratio_default_pg_over_sqlite"] = ratio
        print(f"== default search PostgreSQL / SQLite: {json.dumps(ratio)}", flush=True)
        if not a.skip_http:
            http = run_http(hb, src, a, sqlite_dir, pg_env, gen_units(20_000, a.seed + 700))
            for name in http:
                out[name].update(http[name])
            key = f"search@{a.conns}"
            out["ratio_http_search_pg_over_sqlite"] = round(http["postgresql"][key]["rps"] / http["sqlite"][key]["rps"], 2)
    finally:
        cluster.stop()
    size = f"{a.size // 1000}k" if a.size < 1_000_000 else f"{a.size // 1_000_000}m"
    write_json(a.name or f"postgresql-{size}", out)


if __name__ == "__main__":
    main()
