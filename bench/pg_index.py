"""PostgreSQL indexing throughput, one service commit against another in one run.

Each run is a child process with its own fresh cluster (tools/pg_cluster.py: a primary and a streaming
standby, fsync on, 256 MB of shared buffers, as bench/postgresql.py): push the same N units in batches
of 1,000 (``push_many``), then time the maintenance pass that indexes them (``run_once`` until the queue
is empty). Reported per run: units/s (wall), CPU per unit of the Python process (tokenizing, building
rows; getrusage) and of each server (every process of the primary and of the standby, from /proc:
backends, WAL sender and receiver, startup/replay, checkpointer, autovacuum), WAL written; then, after
``VACUUM ANALYZE``, default (standby) and ``strong`` (primary) search p50/p99 over the same queries, and
whether both commits return the same top 10; last, the latency of ``--single-pushes`` one-unit pushes one
after another. Runs alternate between the commits (``--rounds``), so a load change on the shared machine
hits both.

    .venv/bin/python bench/pg_index.py [--units 20000] [--rounds 2] [--base main] [--test head]
        [--queries 200] [--name pg-index-20k]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from common import ROOT, TMP, app_parts, machine, quiet_service_logs, r, service_rev, service_src, summary, write_json

CLK = os.sysconf("SC_CLK_TCK")


def server_cpu(data_dir) -> float:
    """CPU seconds (user + system) of a PostgreSQL server: its postmaster and every child."""
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    total = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(p) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK


def own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def child(a) -> None:
    """One build on one commit; prints a JSON line."""
    src = service_src(a.service_src)
    quiet_service_logs()
    from postgresql import searches
    from servers import pg_cluster, push_all
    from corpus import Generator, queries
    import psycopg
    from service import create_app
    base = TMP / f"pg-index-cluster-{os.getpid()}"
    cluster = pg_cluster(base)
    out = {"service_rev": service_rev(src), "units": a.units}
    try:
        units = list(Generator(a.seed).units(a.units))
        app = create_app({"data_dir": str(TMP / f"pg-index-app-{os.getpid()}"), "background": False,
                          "store": cluster.primary_url, "store_replica": cluster.standby_url})
        maint = app_parts(app).maintenance
        t0 = time.perf_counter()
        push_all(app, units)
        out["push_units_per_s"] = round(len(units) / (time.perf_counter() - t0))
        with psycopg.connect(cluster.primary_url, autocommit=True) as c:
            c.execute("CHECKPOINT")         # both commits start the pass from the same state
            lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        time.sleep(1)
        cpu0 = (own_cpu(), server_cpu(cluster.primary_dir), server_cpu(cluster.standby_dir))
        t0 = time.perf_counter()
        indexed = 0
        while n := maint.run_once():
            indexed += n
        wall = time.perf_counter() - t0
        own = own_cpu() - cpu0[0]
        with psycopg.connect(cluster.primary_url, autocommit=True) as c:
            wal = float(c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)).fetchone()[0])
            for _ in range(100):            # the standby's replay of the pass counts too
                if c.execute("SELECT coalesce(bool_and(replay_lsn = pg_current_wal_lsn()), true) "
                             "FROM pg_stat_replication").fetchone()[0]:
                    break
                time.sleep(0.1)
        primary = server_cpu(cluster.primary_dir) - cpu0[1]
        standby = server_cpu(cluster.standby_dir) - cpu0[2]
        n = max(1, indexed)
        out["index"] = {"indexed": indexed, "seconds": r(wall), "units_per_s": round(indexed / wall),
                        "cpu_us_per_unit": {"python": round(own / n * 1e6), "primary": round(primary / n * 1e6),
                                            "standby": round(standby / n * 1e6),
                                            "total": round((own + primary + standby) / n * 1e6)},
                        "wal_bytes_per_unit": round(wal / n)}
        with psycopg.connect(cluster.primary_url, autocommit=True) as c:
            c.execute("VACUUM ANALYZE")     # what autovacuum does within a minute or two of a bulk load
        time.sleep(2)
        qs = queries(a.queries, a.seed)
        out["search_default"], _ = searches(app, qs, a.max_seconds)
        out["search_strong"], out["tops"] = searches(app, qs, a.max_seconds, consistency="strong")
        out["single_push_ms"] = single_pushes(app, a.single_pushes)
        app_parts(app).shutdown()
    finally:
        cluster.stop()
        shutil.rmtree(TMP / f"pg-index-app-{os.getpid()}", ignore_errors=True)
    print("RESULT " + json.dumps(out), flush=True)


def single_pushes(app, n: int) -> dict:
    """Latency of one-unit pushes one after another (today's day partition exists): what a push
    transaction costs on PostgreSQL, round trips included."""
    store, now = app_parts(app).store, int(time.time())
    lat = []
    for i in range(n + 100):                 # the first 100 warm the pool and the statements
        unit = {"type": "tool_output", "source": "bench_single", "timestamp": now - i % 3, "ttl": 86_400,
                "content": f"single push {i} {os.getpid()}"}
        t0 = time.perf_counter()
        if not isinstance(store.push_many("default", [unit])[0], dict):
            raise RuntimeError("a single push failed")
        if i >= 100:
            lat.append((time.perf_counter() - t0) * 1000)
    return summary(lat)


def run_child(a, rev: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--service-src", rev, "--units", str(a.units), "--seed", str(a.seed),
           "--queries", str(a.queries), "--max-seconds", str(a.max_seconds), "--single-pushes", str(a.single_pushes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"run on {rev} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--base", default="main", help="the commit measured against (default main)")
    ap.add_argument("--test", default="head", help="the commit under test (default HEAD; 'worktree')")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--max-seconds", type=float, default=30, help="per search kind and run")
    ap.add_argument("--single-pushes", type=int, default=2000, help="one-unit pushes timed after the searches")
    ap.add_argument("--timeout", type=float, default=1800, help="per run")
    ap.add_argument("--name", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--service-src", default="head", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return
    # commits pinned before the first run (a branch may move while the runs go on)
    revs = {label: rev if rev == "worktree" else service_rev(service_src(rev))
            for label, rev in {"base": a.base, "test": a.test}.items()}
    out = {"machine": machine(), "units": a.units, "rounds": a.rounds, "runs": {"base": [], "test": []}}
    for rnd in range(a.rounds):
        for label, rev in revs.items():
            res = run_child(a, rev)
            out["runs"][label].append(res)
            ix = res["index"]
            print(f"round {rnd + 1} {label} ({res['service_rev']}): {ix['units_per_s']} units/s, CPU us/unit "
                  f"{json.dumps(ix['cpu_us_per_unit'])}, WAL {ix['wal_bytes_per_unit']} B/unit; search default "
                  f"p50/p99 {res['search_default']['p50_ms']}/{res['search_default']['p99_ms']} ms, strong "
                  f"{res['search_strong']['p50_ms']}/{res['search_strong']['p99_ms']} ms; single push p50/p99 "
                  f"{res['single_push_ms']['p50_ms']}/{res['single_push_ms']['p99_ms']} ms", flush=True)
    tops = {label: runs[0].pop("tops") for label, runs in out["runs"].items()}
    for runs in out["runs"].values():
        for res in runs:
            res.pop("tops", None)
    same = sum(1 for x, y in zip(tops["base"], tops["test"]) if x == y)
    out["same_top10_strong"] = {"queries": min(len(tops["base"]), len(tops["test"])), "same_cids_and_scores": same}
    summ = {}
    for label, runs in out["runs"].items():
        summ[label] = {"service_rev": runs[0]["service_rev"],
                       "units_per_s": median([x["index"]["units_per_s"] for x in runs]),
                       "cpu_us_per_unit": {k: median([x["index"]["cpu_us_per_unit"][k] for x in runs])
                                           for k in ("python", "primary", "standby", "total")},
                       "wal_bytes_per_unit": median([x["index"]["wal_bytes_per_unit"] for x in runs]),
                       "search_default_p50_p99_ms": [median([x["search_default"][k] for x in runs])
                                                     for k in ("p50_ms", "p99_ms")],
                       "search_strong_p50_p99_ms": [median([x["search_strong"][k] for x in runs])
                                                    for k in ("p50_ms", "p99_ms")],
                       "single_push_p50_p99_ms": [median([x["single_push_ms"][k] for x in runs])
                                                  for k in ("p50_ms", "p99_ms")]}
    out["median"] = summ
    print(json.dumps({"median": summ, "same_top10_strong": out["same_top10_strong"]}, indent=1))
    write_json(a.name or f"pg-index-{a.units // 1000}k", out)


if __name__ == "__main__":
    main()
