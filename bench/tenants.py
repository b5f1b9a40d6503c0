"""Many tenants on one node (issue 49): what a tenant costs while it works and while it is idle.

One node started as `make run` starts it (gunicorn with service/gunicorn_conf.py: 2 workers, the maintainer
process beside them), under an open-files limit of ``--nofile`` (soft and hard, as `ulimit -n 1024` sets them),
with N tenants in its keys file. Through HTTP only:

1. every tenant pushes ``--units`` small units (one batch each, ``--clients`` tenants at a time);
2. once the maintainer is idle (everything indexed and in the read index), a *cold* round: one search per
   tenant, one client, each tenant's first search in the node; then a *warm* round (the same again);
3. every process's threads, open files (/proc/<pid>/fd) and RSS (and PSS), a second after the searches (a
   read index a process let go of ends its tantivy thread within half a second), and their peaks while the
   rounds ran (sampled every 0.25 s);
4. ``--idle-s`` seconds with no request, the same counts again, then a round after idle (tenants the node
   let go of answer again).

A search must answer 200 and find the one unit of its tenant that holds the tenant's own word; a push must
answer ``ok`` for every unit. Anything else counts as failed. A node of ``--reference`` tenants runs the same
way first: the warm p50 of the large node is compared with it.

Both stores: ``--stores sqlite,postgresql`` (PostgreSQL: a throwaway primary and standby from
tools/pg_cluster.py; the node keeps its read indexes in its own data folder). The machine is shared: the
figures are for one run, ratios say more than absolutes.

    .venv/bin/python bench/tenants.py --tenants 100,1000 [--units 20] [--nofile 1024] [--stores sqlite]
        [--idle-s 60] [--reference 10] [--service-src head|worktree] [--name tenants]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import TMP, machine, r, service_rev, service_src, summary, write_json
from http_bench import free_port, role_of, stop, wait_idle, wait_ready

WORDS = ("order shipped invoice refund parcel courier warehouse customer ticket deploy build error retry cache "
         "index query tenant budget socket thread").split()


def keys_file(path: Path, n: int) -> list[tuple[str, str]]:
    """A keys file of ``n`` tenants (t00000, t00001, ...), one push+search key each: [(tenant, key)]."""
    pairs = [(f"t{i:05d}", f"k{i:05d}-{random.getrandbits(64):016x}") for i in range(n)]
    path.write_text(json.dumps({"keys": [{"key": k, "tenant": t, "scopes": ["push", "search"]} for t, k in pairs]}))
    return pairs


def units_of(tenant: str, n: int) -> list[dict]:
    """``n`` small units; the first holds the tenant's own word (``w<tenant>``), which a search must find."""
    rng = random.Random(tenant)
    now = int(time.time())
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(12))
        own = f" w{tenant}" if i == 0 else ""
        out.append({"type": "tool_output", "source": "bench_tenants", "timestamp": now - i,
                    "content": f"{words}{own} #{i}"})
    return out


class Client:
    """One keep-alive HTTP connection (per thread)."""

    def __init__(self, port: int):
        self.port = port
        self.conn = None

    def call(self, method: str, path: str, key: str, body: dict | None = None) -> tuple[int, dict | None, float]:
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            headers = {"Authorization": f"Bearer {key}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            t0 = time.perf_counter()
            try:
                self.conn.request(method, path, data, headers)
                resp = self.conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    return 0, None, 0.0
                continue
            ms = (time.perf_counter() - t0) * 1000
            try:
                return resp.status, json.loads(raw), ms
            except ValueError:
                return resp.status, None, ms
        return 0, None, 0.0


def push_all(port: int, pairs, units: int, clients: int) -> dict:
    """Every tenant's units in one batch; failed = a request not 200 or any unit not ``ok``."""
    local = threading.local()
    failed, errors = [], {}

    def push(pair):
        tenant, key = pair
        if not hasattr(local, "client"):
            local.client = Client(port)
        status, body, ms = local.client.call("POST", "/mcp/push", key, {"units": units_of(tenant, units)})
        ok = status == 200 and body and all(x.get("status") == "ok" for x in body.get("results", []))
        if not ok:
            failed.append(tenant)
            errors[str(status)] = (body or {}).get("error") if isinstance(body, dict) else None
        return ms

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        times = list(pool.map(push, pairs))
    took = time.perf_counter() - t0
    return {"requests": len(pairs), "failed": len(failed), "errors": errors, "seconds": r(took, 1),
            "units_per_s": round(len(pairs) * units / took), "latency": summary(times)}


def search_round(port: int, pairs) -> dict:
    """One default search per tenant, one client, for the tenant's own word: it must find its unit."""
    c = Client(port)
    times, failed, errors = [], 0, {}
    for tenant, key in pairs:
        status, body, ms = c.call("GET", f"/mcp/search?q=w{tenant}&top_k=3", key)
        found = status == 200 and body and any(f"w{tenant}" in x.get("content", "") for x in body.get("results", []))
        if not found:
            failed += 1
            errors[str(status)] = (body or {}).get("error") if isinstance(body, dict) and status != 200 else "not found"
        times.append(ms)
    return {"failed": failed, "errors": errors, "latency": summary(times)}


def processes(root_pid: int) -> list[dict]:
    """Every process of the node: role, threads, open files, RSS and PSS (MiB), read from /proc."""
    import psutil
    out = []
    root = psutil.Process(root_pid)
    for p in [root] + root.children(recursive=True):
        try:
            with open(f"/proc/{p.pid}/status") as fh:
                status = dict(line.split(":", 1) for line in fh if ":" in line)
            fds = len(os.listdir(f"/proc/{p.pid}/fd"))
            pss = p.memory_full_info().pss
        except (OSError, psutil.Error):
            continue
        out.append({"pid": p.pid, "role": role_of(p.pid, root_pid), "threads": int(status["Threads"]),
                    "open_files": fds, "rss_mib": r(int(status["VmRSS"].split()[0]) / 1024, 1),
                    "pss_mib": r(pss / 2**20, 1)})
    return out


def node_totals(procs: list[dict]) -> dict:
    return {"rss_mib": r(sum(p["rss_mib"] for p in procs), 1), "pss_mib": r(sum(p["pss_mib"] for p in procs), 1),
            "max_threads": max(p["threads"] for p in procs), "max_open_files": max(p["open_files"] for p in procs)}


class Peaks(threading.Thread):
    """The most threads and open files any process of the node held, and the node's RSS, every 0.25 s."""

    def __init__(self, root_pid: int):
        super().__init__(daemon=True)
        self.root_pid = root_pid
        self.peak = {"max_threads": 0, "max_open_files": 0, "rss_mib": 0.0}
        self.stop = threading.Event()

    def run(self):
        import psutil
        while not self.stop.wait(0.25):
            try:
                procs = [psutil.Process(self.root_pid)] + psutil.Process(self.root_pid).children(recursive=True)
            except psutil.Error:
                return
            rss = 0
            for p in procs:
                try:
                    self.peak["max_threads"] = max(self.peak["max_threads"], p.num_threads())
                    self.peak["max_open_files"] = max(self.peak["max_open_files"], p.num_fds())
                    rss += p.memory_info().rss
                except psutil.Error:
                    continue
            self.peak["rss_mib"] = max(self.peak["rss_mib"], r(rss / 2**20, 1))

    def result(self) -> dict:
        self.stop.set()
        self.join()
        return self.peak


def start_node(src: Path, data: Path, keys: Path, port: int, nofile: int, env_extra: dict) -> subprocess.Popen:
    """gunicorn as `make run` starts it, under RLIMIT_NOFILE = ``nofile`` (soft and hard)."""
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(data), PYTHONPATH=str(src),
               CONTEXT_API_KEYS_FILE=str(keys), CONTEXT_PUBLIC_URL=f"http://127.0.0.1:{port}", **env_extra)
    for name in ("CONTEXT_WORKERS", "CONTEXT_THREADS"):
        env.pop(name, None)

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log = open(data.parent / "gunicorn.log", "ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", "service/gunicorn_conf.py",
                             "service:create_app()"], cwd=src, env=env, stdout=log, stderr=log,
                            start_new_session=True, preexec_fn=limit)


def run_node(src: Path, store: str, n: int, a, env_extra: dict) -> dict:
    base = TMP / f"tenants-{store}-{n}"
    shutil.rmtree(base, ignore_errors=True)
    data = base / "data"
    data.mkdir(parents=True)
    pairs = keys_file(base / "keys.json", n)
    port = free_port()
    proc = start_node(src, data, base / "keys.json", port, a.nofile, env_extra)
    out: dict = {"store": store, "tenants": n, "units_per_tenant": a.units, "nofile": a.nofile}
    try:
        wait_ready(port, 300)
        print(f"[{store} {n}] pushing", flush=True)
        out["push"] = push_all(port, pairs, a.units, a.clients)
        out["settle_s"] = wait_idle(proc.pid, 600)
        print(f"[{store} {n}] push {out['push']['failed']} failed; searching", flush=True)
        peaks = Peaks(proc.pid)
        peaks.start()
        out["cold"] = search_round(port, pairs)
        out["warm"] = search_round(port, pairs)
        out["peak_while_searching"] = peaks.result()
        time.sleep(1)
        out["after_searches"] = procs = processes(proc.pid)
        out["after_searches_node"] = node_totals(procs)
        print(f"[{store} {n}] cold {out['cold']['latency']['p99_ms']} ms p99, warm {out['warm']['latency']['p50_ms']}"
              f" ms p50; {out['after_searches_node']}; idle {a.idle_s} s", flush=True)
        time.sleep(a.idle_s)
        out["after_idle"] = procs = processes(proc.pid)
        out["after_idle_node"] = node_totals(procs)
        peaks = Peaks(proc.pid)
        peaks.start()
        out["after_idle_round"] = search_round(port, pairs)
        out["peak_after_idle"] = peaks.result()
        time.sleep(1)           # (counted as after the first rounds: a let-go index's thread ends within a second)
        out["after_idle_round_node"] = node_totals(processes(proc.pid))
        out["data_mib"] = r(sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) / 2**20, 1)
        print(f"[{store} {n}] after idle {out['after_idle_node']}; round after idle "
              f"{out['after_idle_round']['failed']} failed, p99 {out['after_idle_round']['latency']['p99_ms']} ms",
              flush=True)
    finally:
        stop(proc)
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    return out


def targets(node: dict, reference: dict | None) -> dict:
    """Issue 49's targets for one node (threads and files per process; RSS of the whole node)."""
    worst = [node["after_searches_node"], node["after_idle_node"], node["after_idle_round_node"]]
    out = {"no_failed": node["push"]["failed"] == 0 and node["cold"]["failed"] == 0 and node["warm"]["failed"] == 0
           and node["after_idle_round"]["failed"] == 0,
           "rss_le_1gib": max(w["rss_mib"] for w in worst) <= 1024,
           "threads_le_128": max(w["max_threads"] for w in worst) <= 128,
           "files_le_900": max(w["max_open_files"] for w in worst) <= 900,
           "cold_p99_le_100ms": (node["cold"]["latency"]["p99_ms"] or 0) <= 100}
    if reference is not None:
        ratio = node["warm"]["latency"]["p50_ms"] / reference["warm"]["latency"]["p50_ms"]
        out["warm_p50_ratio_to_reference"] = r(ratio)
        out["warm_p50_le_1_5x"] = ratio <= 1.5
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", default="100,1000", help="comma-separated node sizes")
    ap.add_argument("--units", type=int, default=20)
    ap.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of the node, soft and hard")
    ap.add_argument("--stores", default="sqlite", help="sqlite, postgresql or both (comma-separated)")
    ap.add_argument("--idle-s", type=float, default=60)
    ap.add_argument("--reference", type=int, default=10, help="tenants of the reference node (0: none)")
    ap.add_argument("--clients", type=int, default=8, help="tenants pushing at once")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="tenants")
    ap.add_argument("--keep", action="store_true", help="keep the data folders")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    out = {"machine": machine(), "service_rev": service_rev(src), "args": vars(a), "nodes": []}
    for store in a.stores.split(","):
        env_extra, cluster = {}, None
        if store == "postgresql":
            from postgresql import pg_cluster
            cluster = pg_cluster(TMP / "tenants-pg")
            env_extra = {"CONTEXT_STORE": cluster.primary_url, "CONTEXT_STORE_REPLICA": cluster.standby_url}
        try:
            reference = run_node(src, store, a.reference, a, env_extra) if a.reference else None
            if reference is not None:
                out["nodes"].append(reference)
            for n in (int(x) for x in a.tenants.split(",")):
                if cluster is not None:
                    _empty(cluster)
                node = run_node(src, store, n, a, env_extra)
                node["targets"] = targets(node, reference)
                print(f"[{store} {n}] targets {node['targets']}", flush=True)
                out["nodes"].append(node)
                write_json(a.name, out)
        finally:
            if cluster is not None:
                cluster.stop()
    write_json(a.name, out)


def _empty(cluster) -> None:
    """Drop every tenant's rows between two PostgreSQL nodes (each node's tenants start from nothing)."""
    import psycopg
    with psycopg.connect(cluster.primary_url, autocommit=True) as c:
        c.execute("DROP SCHEMA public CASCADE")
        c.execute("CREATE SCHEMA public")


if __name__ == "__main__":
    main()
