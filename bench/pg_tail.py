"""A PostgreSQL node's default searches beside SQLite's, in process: searches/s with N request handlers in one
process (a worker's), the process's CPU and PostgreSQL's server's CPU per search (issue 53, item 3: what a
node's tail read costs). Each build runs in a process of its own on the cached corpus, its PostgreSQL node
over one throwaway primary and standby holding the same units, alternating with the SQLite store.

    .venv/bin/python bench/pg_tail.py --builds main,worktree [--size 100000] [--threads 8] [--seconds 8]
        [--rounds 3] [--name pg-tail]

The SQLite store runs with the first build. Whole questions (corpus.questions), each handler from its own
place in them.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time

from common import TMP, app_parts, machine, quiet_service_logs, service_rev, service_src, write_json


def pg_cpu() -> float:
    """CPU seconds of every PostgreSQL process on the machine so far (http_bench's reading of every process)."""
    from http_bench import cpu_seconds
    return sum(seconds for who, seconds in cpu_seconds({}).values() if who == "postgresql")


def one(a) -> dict:
    """In a build's own process: ``a.threads`` handlers searching for ``a.seconds``."""
    service_src(a.one)
    quiet_service_logs()
    from corpus import questions
    from service import create_app
    from service.params import parse_search
    config = {"data_dir": a.data, "background": False}
    if a.store == "postgresql":
        config.update(store=a.primary, store_replica=a.standby)
    app = create_app(config)
    parts = app_parts(app)
    while a.store == "postgresql" and (parts.maintenance.run_once() or parts.maintenance.sync_read_indexes()):
        pass
    store, cfg = parts.store, app.config["CONTEXT"]
    params = [parse_search({"query": q, "top_k": 10}, cfg) for q in questions(1500, 1)]
    for p in params[:300]:
        store.search("default", p)
    counts = [0] * a.threads
    stop = time.perf_counter() + a.seconds

    def handler(i: int) -> None:
        k = i * 97
        while time.perf_counter() < stop:
            store.search("default", params[k % len(params)])
            k += 1
            counts[i] += 1
    pg0, cpu0, t0 = pg_cpu(), time.process_time(), time.perf_counter()
    handlers = [threading.Thread(target=handler, args=(i,)) for i in range(a.threads)]
    for h in handlers:
        h.start()
    for h in handlers:
        h.join()
    n, wall = sum(counts), time.perf_counter() - t0
    out = {"searches": n, "per_s": round(n / wall, 1), "cpu_ms_per_search": round((time.process_time() - cpu0) / n * 1e3, 3),
           "postgresql_cpu_ms_per_search": round((pg_cpu() - pg0) / n * 1e3, 3)}
    parts.shutdown()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builds", default="main,worktree")
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="pg-tail")
    for hidden in ("--one", "--store", "--data", "--primary", "--standby"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a)))
        return
    from corpus import service_dir
    from http_bench import pg_store
    builds = a.builds.split(",")
    systems = [(b, "postgresql") for b in builds] + [(builds[0], "sqlite")]
    run_dir = TMP / "run-pg-tail"
    shutil.rmtree(run_dir, ignore_errors=True)
    corpus = service_dir(a.size)
    cluster, _env = pg_store(corpus, TMP / "pg-tail-cluster")
    runs: dict[str, list[dict]] = {f"{b} {s}": [] for b, s in systems}
    try:
        for b, _ in systems:
            service_src(b)          # (extracted before the rounds)
        shutil.copytree(corpus, run_dir / "sqlite")
        for r in range(a.rounds):
            for b, store in (systems if r % 2 == 0 else systems[::-1]):
                data = run_dir / ("sqlite" if store == "sqlite" else f"node-{builds.index(b)}")
                done = subprocess.run([sys.executable, __file__, "--one", b, "--store", store, "--data", str(data),
                                       "--primary", cluster.primary_url, "--standby", cluster.standby_url,
                                       "--threads", str(a.threads), "--seconds", str(a.seconds)],
                                      check=True, capture_output=True, text=True)
                got = json.loads(done.stdout.strip().splitlines()[-1])
                runs[f"{b} {store}"].append(got)
                print(f"  r{r} {b:10s} {store:10s} {got['per_s']:7.1f} searches/s  CPU {got['cpu_ms_per_search']:.3f} ms"
                      f"  PostgreSQL {got['postgresql_cpu_ms_per_search']:.3f} ms", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    reference = runs[f"{builds[0]} sqlite"]
    out = {"machine": machine(), "size": a.size, "threads": a.threads, "seconds": a.seconds, "rounds": a.rounds,
           "systems": {}}
    for key, got in runs.items():
        b = key.split()[0]
        out["systems"][key] = {"service": service_rev(service_src(b)), "runs": got,
                               "per_s": statistics.median(x["per_s"] for x in got),
                               "over_sqlite_same_round": [round(x["per_s"] / y["per_s"], 3) for x, y in zip(got, reference)]}
        print(f"{key}: {out['systems'][key]['per_s']} searches/s (median), ÷ SQLite by round "
              f"{out['systems'][key]['over_sqlite_same_round']}")
    write_json(a.name, out)


if __name__ == "__main__":
    main()
