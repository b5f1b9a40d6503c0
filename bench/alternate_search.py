"""Two builds of the service serving searches side by side, each on its own copy of the same corpus, both up
at once and measured in alternating cells (A B, B A, ...), so that a shared machine's load moves both alike:
searches/s at 64 connections with the workers' CPU per search, then single-client p50 and ``GET /healthz`` at
64 connections on each. wrk drives both (bench/http_bench.py's scripts); loopback only, bounded in time.

    python bench/alternate_search.py --old 91440ab --queries questions --rounds 4 --name alternate-search-questions
    python bench/alternate_search.py --old 91440ab --queries short --size 1000000 \
        --data bench/results/tmp/pg-bench-sqlite-1000000 --name alternate-search-short-1m

``--gc-probe`` also times every full (generation 2) garbage collection in each build's processes: a
``sitecustomize`` put on their path adds a ``gc.callbacks`` hook that appends one line per full collection
(pid, time, ms, objects it walked, objects frozen) to a file per build; the service's code is not touched.
Those made once both servers answer (under load) are reported apart from those at start-up (2646d45's
own collection before it freezes). The workers' PSS is read at the end.

    python bench/alternate_search.py --old 3fb48b7 --queries questions --rounds 4 --gc-probe --name gc-freeze
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

import http_bench as H
from servers import up_to_date
from common import TMP, add_build_pair, machine, pct, service_rev, service_src, write_json


GC_PROBE = """import gc, os, time
_started = {}
def _full(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        _started[os.getpid()] = time.perf_counter()
        return
    t0 = _started.pop(os.getpid(), None)
    if t0 is not None:
        ms = (time.perf_counter() - t0) * 1000
        with open(os.environ["GC_PROBE"], "a") as f:
            f.write("%d %.3f %.3f %d %d\\n" % (os.getpid(), time.time(), ms, len(gc.get_objects(2)),
                                              gc.get_freeze_count()))
if os.environ.get("GC_PROBE"):
    gc.callbacks.append(_full)
"""


def gc_probe_dir():
    """A folder holding the probe's ``sitecustomize.py``, to put on a server's PYTHONPATH."""
    d = TMP / "gc-probe"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text(GC_PROBE)
    return d


def full_collections(path, since: float) -> dict:
    """The probe's lines for one build: how many full collections, and how long they held the GIL, at
    start-up and once serving (from ``since``)."""
    lines = [x.split() for x in path.read_text().splitlines()] if path.exists() else []
    out = {}
    for when, part in (("start_up", [x for x in lines if float(x[1]) < since]),
                       ("serving", [x for x in lines if float(x[1]) >= since])):
        ms = sorted(float(x[2]) for x in part)
        out[when] = {"count": len(ms), "processes": len({x[0] for x in part}),
                     "p50_ms": pct(ms, 50), "max_ms": max(ms) if ms else None, "total_ms": round(sum(ms), 1),
                     "objects_walked_median": pct(sorted(int(x[3]) for x in part), 50),
                     "frozen_max": max((int(x[4]) for x in part), default=None)}
    return out


def workers_pss_mib(proc) -> list[float]:
    import psutil
    out = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        if H.role_of(child.pid, proc.pid) == "worker":
            try:
                out.append(round(child.memory_full_info().pss / 2 ** 20, 1))
            except psutil.Error:
                pass
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_build_pair(ap, rounds=4)
    ap.add_argument("--queries", choices=("short", "questions"), default="questions")
    ap.add_argument("--data", help="a service data dir to copy instead of corpus.py's cached corpus of --size "
                    "(e.g. bench/postgresql.py's SQLite side, results/tmp/pg-bench-sqlite-1000000)")
    ap.add_argument("--consistency", choices=("default", "strong"), default="default",
                    help="strong: every search asks for what was acknowledged (the primaries answer)")
    ap.add_argument("--gc-probe", action="store_true", help="time every full garbage collection in both builds")
    ap.add_argument("--name", default="alternate-search")
    a = ap.parse_args(argv)
    from pathlib import Path

    from corpus import service_dir
    corpus = Path(a.data) if a.data else service_dir(a.size, a.seed)
    scripts = H.write_inputs(a.seed, nonce=f"alts{int(time.time())}", kind=a.queries,
                              consistency="strong" if a.consistency == "strong" else None)
    builds = {"new": a.new, "old": a.old}
    out = {"machine": machine(), "queries": a.queries, "consistency": a.consistency, "size": a.size, "data": str(a.data or "corpus.py"), "duration_s": a.duration,
           "load_at_start": os.getloadavg(), "builds": {}, "cells": []}
    servers = {}
    try:
        for name, rev in builds.items():
            src = service_src(rev)
            d = TMP / f"run-alternate-search-{name}"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(corpus, d)
            up_to_date(src, d)
            port = H.free_port()
            path, probe = str(src), {}
            if a.gc_probe:
                path += os.pathsep + str(gc_probe_dir())
                probe = {"GC_PROBE": str(TMP / f"gc-probe-{name}.txt")}
                Path(probe["GC_PROBE"]).unlink(missing_ok=True)
            servers[name] = (port, H.start_gunicorn(src, "service:create_app()", port, f"alternate-search-{name}.log",
                                                    path, CONTEXT_DATA_DIR=str(d), **probe))
            out["builds"][name] = service_rev(src)
        for port, _ in servers.values():
            H.wait_ready(port, 180)
            H.wrk(scripts["search"], port, 64, 3)        # warm both alike
        serving = time.time()
        for rnd in range(a.rounds):
            for name in (("new", "old") if rnd % 2 == 0 else ("old", "new")):
                port, proc = servers[name]
                H.wait_idle(proc.pid)
                trees = {"node": proc.pid}
                before = H.cpu_seconds(trees)
                run = H.wrk(scripts["search"], port, 64, a.duration)
                cpu = H.cpu_ms_per_request(before, H.cpu_seconds(trees), run["requests"])
                out["cells"].append({"round": rnd, "build": name, "workload": "search@64", "rps": run["rps"],
                                     "errors": run["errors"], "p50": run["p50"], "p99": run["p99"],
                                     "worker_cpu_ms_per_search": cpu.get("node worker")})
                print(f"  round {rnd} {name:3s} search@64 {run['rps']:7.1f}/s  errors {run['errors']}  "
                      f"worker CPU {cpu.get('node worker')} ms/search", flush=True)
        for workload, conns in (("search", 1), ("healthz", 64)):
            for name in ("new", "old"):
                port, proc = servers[name]
                H.wait_idle(proc.pid)
                run = H.wrk(scripts[workload], port, conns, a.duration)
                out["cells"].append({"build": name, "workload": f"{workload}@{conns}", "rps": run["rps"],
                                     "errors": run["errors"], "p50": run["p50"], "p99": run["p99"]})
                print(f"  {name:3s} {workload}@{conns} {run['rps']:7.1f}/s  p50 {run['p50']:.2f} ms", flush=True)
        if a.gc_probe:
            out["workers_pss_mib"] = {name: workers_pss_mib(proc) for name, (_, proc) in servers.items()}
    finally:
        for _, proc in servers.values():
            H.stop(proc)
    if a.gc_probe:
        out["full_collections"] = {name: full_collections(TMP / f"gc-probe-{name}.txt", serving) for name in builds}
        for name, fc in out["full_collections"].items():
            print(f"  {name:3s} full collections: {fc}  workers' PSS MiB {out['workers_pss_mib'][name]}")
    summary = {}
    for name in ("new", "old"):
        cells = [c for c in out["cells"] if c["build"] == name and c["workload"] == "search@64"]
        summary[name] = {"search_at_64_median": statistics.median(c["rps"] for c in cells),
                         "worker_cpu_ms_per_search_median": statistics.median(c["worker_cpu_ms_per_search"]
                                                                              for c in cells),
                         **{c["workload"]: {"rps": c["rps"], "p50": c["p50"]} for c in out["cells"]
                            if c["build"] == name and c["workload"] != "search@64"}}
    summary["new_over_old_search_at_64"] = round(summary["new"]["search_at_64_median"]
                                                 / summary["old"]["search_at_64_median"], 3)
    out["summary"] = summary
    print(f"  summary: {summary}")
    write_json(a.name, out)


if __name__ == "__main__":
    main()
