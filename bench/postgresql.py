"""PostgreSQL vs SQLite, side by side in one run: the same units, queries and load on both.

- ingest in-process: the same corpus pushed in batches of 1,000 (``push_many``), then indexed (the
  maintenance pass: on SQLite FTS5 and the read index, on PostgreSQL term frequencies and statistics);
- search in-process: 2-4-term queries from held-back text, default (SQLite: the read index;
  PostgreSQL: the streaming standby) and ``strong`` (both: the primary), p50/p99, and whether both
  backends return the same top 10 (CIDs in order) for every query;
- HTTP: wrk on /mcp/search, one SQLite service process vs two service processes on one PostgreSQL
  primary (the scale-out shape), 2 workers each; batch ingest over HTTP;
- freshness under a sustained push load: index lag (ack to found by a default search, probes) on
  both, and the standby's replication lag (pg_stat_replication.replay_lag, sampled every 100 ms).

PostgreSQL runs from tools/pg_cluster.py (a primary and a standby on loopback, fsync on, 256 MB of
shared buffers each); after the bulk load the script runs VACUUM ANALYZE, as autovacuum would within a
minute or two. The machine is shared: runs are bounded, ratios matter more than absolutes.

    .venv/bin/python bench/postgresql.py [--size 100000] [--queries 300] [--http-seconds 15]
        [--lag-seconds 20] [--rate 200] [--conns 32]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common import ROOT, TMP, machine, quiet_service_logs, service_rev, service_src, summary, write_json
from ingest import _drain, gen_units, http_batch_ingest, index_lag


def pg_cluster(base):
    spec = importlib.util.spec_from_file_location("pg_cluster", ROOT / "tools" / "pg_cluster.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    shutil.rmtree(base, ignore_errors=True)
    return tool.Cluster(base, shared_buffers="256MB").start()     # fsync on


def push_all(app, units: list[dict]) -> None:
    """Push the units in batches of 1,000 (``push_many``, in process); any refused unit stops the run."""
    store = app.extensions["context_store"]
    for i in range(0, len(units), 1000):
        for r in store.push_many("default", units[i:i + 1000]):
            if not isinstance(r, dict):
                raise RuntimeError(f"push failed: {r}")


def build(app, units: list[dict]) -> dict:
    """Push the units in batches of 1,000, then drain the maintenance (index); timed apart."""
    maint = app.extensions["context_maintenance"]
    t0 = time.perf_counter()
    push_all(app, units)
    t1 = time.perf_counter()
    while maint.run_once():
        pass
    t2 = time.perf_counter()
    return {"units": len(units), "push_s": round(t1 - t0, 2), "push_units_per_s": round(len(units) / (t1 - t0)),
            "index_s": round(t2 - t1, 2), "index_units_per_s": round(len(units) / (t2 - t1))}


def searches(app, qs: list[str], max_s: float, **extra) -> tuple[dict, list]:
    from service.params import parse_search
    store, config = app.extensions["context_store"], app.config["CONTEXT"]
    for q in qs[:20]:
        store.search("default", parse_search({"query": q, "top_k": 10, **extra}, config))
    lat, tops = [], []
    deadline = time.perf_counter() + max_s
    for q in qs:
        t0 = time.perf_counter()
        body = store.search("default", parse_search({"query": q, "top_k": 10, **extra}, config))
        lat.append((time.perf_counter() - t0) * 1000)
        tops.append([(r["cid"], r["bm25_score"]) for r in body["results"]])
        if time.perf_counter() > deadline:
            break
    return summary(lat), tops


def agreement(a: list, b: list) -> dict:
    same = sum(1 for x, y in zip(a, b) if [c for c, _ in x] == [c for c, _ in y])
    diff = max((abs(s - t) for x, y in zip(a, b) for (_, s), (_, t) in zip(x, y)), default=0.0)
    return {"queries": min(len(a), len(b)), "same_top10": same, "max_bm25_diff": diff}


def wrk_pair(hb, script, ports: list[int], conns: int, seconds: float) -> dict:
    """wrk on each port at once (conns split between them); summed throughput, each one's latencies."""
    with ThreadPoolExecutor(len(ports)) as pool:
        runs = list(pool.map(lambda port: hb.wrk(script, port, max(1, conns // len(ports)), seconds), ports))
    return {"rps": round(sum(r["rps"] for r in runs), 1), "errors": sum(r["errors"] for r in runs),
            "p50_ms": [r["p50"] for r in runs], "p99_ms": [r["p99"] for r in runs], "processes": len(ports)}


class ReplicationSampler(threading.Thread):
    """pg_stat_replication.replay_lag (ms) every 100 ms while the load runs."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.lags, self.bytes = url, threading.Event(), [], []

    def run(self) -> None:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop.wait(0.1):
                row = c.execute("SELECT coalesce(extract(epoch FROM replay_lag) * 1000, 0), "
                                "pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) FROM pg_stat_replication").fetchone()
                if row:
                    self.lags.append(float(row[0]))
                    self.bytes.append(float(row[1] or 0))


def start_node(hb, src, data_dir, port: int, env: dict):
    return hb.start_gunicorn(src, "service:create_app()", port, f"pg-bench-{port}.log", str(src),
                             CONTEXT_DATA_DIR=str(data_dir), **env)


def run_http(hb, src, a, sqlite_dir, pg_env: dict, load_units: list[dict], primary_url: str) -> dict:
    """HTTP search throughput, HTTP batch ingest and freshness under load, one backend after the other."""
    scripts = hb.write_inputs(a.seed, "pg")
    out: dict = {}
    for name in ("sqlite", "postgresql"):
        ports = [hb.free_port()] + ([hb.free_port()] if name == "postgresql" else [])
        procs = [start_node(hb, src, sqlite_dir if name == "sqlite" else TMP / f"pg-node{i}", port,
                            {} if name == "sqlite" else pg_env) for i, port in enumerate(ports)]
        try:
            for port in ports:
                hb.wait_ready(port, 180)
            res = {"search": wrk_pair(hb, scripts["search"], ports, a.conns, a.http_seconds)}
            print(f"== {name}: HTTP search {json.dumps(res['search'])}", flush=True)
            for proc in procs:
                hb.wait_idle(proc.pid)
            res["http_ingest"] = http_batch_ingest(ports[0], gen_units(a.http_units, a.seed + 900))
            print(f"   HTTP batch ingest {json.dumps(res['http_ingest'])}", flush=True)
            # freshness from an empty queue: the batch ingest above must not count as lag
            drained = time.perf_counter()
            _drain(ports[0], timeout=600)
            res["http_ingest"]["indexed_after_s"] = round(time.perf_counter() - drained, 1)
            sampler = ReplicationSampler(primary_url) if name == "postgresql" else None
            if sampler:
                sampler.start()
            lag = index_lag(ports[-1], load_units, a.rate, a.lag_seconds)
            lag.pop("raw_ms", None)
            res["freshness_under_load"] = lag
            if sampler:
                sampler.stop.set()
                sampler.join()
                res["replication_lag_ms"] = summary(sampler.lags)
                res["replication_lag_bytes"] = summary(sampler.bytes)
            print(f"   under {a.rate:.0f} units/s: index lag {json.dumps(lag['lag'])}"
                  + (f", replication lag {json.dumps(res['replication_lag_ms'])}" if sampler else ""), flush=True)
            out[name] = res
        finally:
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
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--http-units", type=int, default=20_000)
    ap.add_argument("--lag-seconds", type=float, default=20)
    ap.add_argument("--rate", type=float, default=200, help="units/s during the freshness run (below both "
                    "backends' indexing rate on this machine)")
    ap.add_argument("--reuse-sqlite", action="store_true",
                    help="keep the SQLite build a previous run of this size finished (its figures are reported)")
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
        units = list(Generator(a.seed).units(a.size))
        qs = queries(a.queries, a.seed)
        sqlite_dir = TMP / f"pg-bench-sqlite-{a.size}"
        sqlite_built = TMP / f"pg-bench-sqlite-{a.size}.json"     # the SQLite build's figures, once finished
        reuse = a.reuse_sqlite and sqlite_built.exists()
        if not reuse:
            shutil.rmtree(sqlite_dir, ignore_errors=True)
            sqlite_built.unlink(missing_ok=True)
        pg_env = {"CONTEXT_STORE": cluster.primary_url, "CONTEXT_STORE_REPLICA": cluster.standby_url}
        # In process, no cap on a search's CPU (as make quality): at 1M, SQLite's strong path passes the
        # default 1 s on common terms, and every query is compared. The HTTP phases keep the default.
        apps = {"sqlite": create_app({"data_dir": str(sqlite_dir), "background": False, "search_cpu_ms": 0}),
                "postgresql": create_app({"data_dir": str(TMP / "pg-bench-app"), "background": False,
                                          "search_cpu_ms": 0,
                                          "store": cluster.primary_url, "store_replica": cluster.standby_url})}
        tops = {}
        for name, app in apps.items():
            res = out[name]
            if name == "sqlite" and reuse:
                res["ingest_inprocess"] = {**json.loads(sqlite_built.read_text()), "reused": True}
            else:
                res["ingest_inprocess"] = build(app, units)
            if name == "sqlite":
                sqlite_built.write_text(json.dumps(res["ingest_inprocess"]))
            print(f"== {name}: in-process ingest {json.dumps(res['ingest_inprocess'])}", flush=True)
            if name == "postgresql":
                # what autovacuum does within a minute or two of a bulk load: statistics, no dead rows
                import psycopg
                with psycopg.connect(cluster.primary_url, autocommit=True) as c:
                    c.execute("VACUUM ANALYZE")
            time.sleep(2)            # (PostgreSQL: the standby replays the build)
            res["search_default"], _ = searches(app, qs, a.max_seconds)
            res["search_strong"], tops[name] = searches(app, qs, a.max_seconds, consistency="strong")
            print(f"   search default {json.dumps(res['search_default'])}\n"
                  f"   search strong  {json.dumps(res['search_strong'])}", flush=True)
        reads = apps["postgresql"].extensions["context_store"].searcher.reads
        out["postgresql"]["default_searches_read"] = dict(reads)
        out["agreement_strong_top10"] = agreement(tops["sqlite"], tops["postgresql"])
        print(f"== same top 10 on both: {json.dumps(out['agreement_strong_top10'])}", flush=True)
        for app in apps.values():
            app.extensions["context_shutdown"]()
        http = run_http(hb, src, a, sqlite_dir, pg_env, gen_units(20_000, a.seed + 700), cluster.primary_url)
        for name in http:
            out[name].update(http[name])
    finally:
        cluster.stop()
    size = f"{a.size // 1000}k" if a.size < 1_000_000 else f"{a.size // 1_000_000}m"
    write_json(a.name or f"postgresql-{size}", out)


if __name__ == "__main__":
    main()
