"""HTTP throughput and latency under wrk (docs/design.md §10): the service under gunicorn (default workers and
threads) beside its limits and the naive baseline, every system up at once and measured in alternating cells,
loopback only, bounded in time:
- the bare app (bench/bare_app.py, issue 42): the fair limit, what a minimal service must do for the same
  answer: Flask under plain gunicorn with the same workers and threads, the same tokenizer, tantivy's OR of
  the terms, the top 10 with their stored fields and scores; nothing else (BM25 alone, so since threads
  rank a default search (issue 37) not the service's answer any more);
- the bare app with threads (``bare_threads``): the same bare app giving exactly the service's results (the
  read index, the thread-aware ranking and the shaping called directly; checked field for field on 200
  questions before the run): the fair limit of today's answer;
- the rows-free engine (bench/tantivy_engine.py under the service's gunicorn settings): tantivy's ids and
  scores only, no rows, no filters, so not the same answer;
- the naive baseline (Flask dev server, FTS5 per day file);
- with ``--postgresql``, a PostgreSQL node (tools/pg_cluster.py) serving the same units.

Workloads: search, push (single units, unique content), a 90/10 search/push mix, each at 1, 16
and 64 concurrent connections (push also at 50, the target's writer count), and GET /healthz on
the same server as the ceiling of the HTTP stack (the bare app and the engine take search and /healthz only).
``--rounds N`` runs each cell N times per system, the order turned each round; a figure is the median. The
ratios to the bare app and to the engine are in each size's ``limits``. Peak RSS and PSS (mapped index files
are shared between workers) of every server process are sampled (psutil) throughout. wrk (Debian package)
drives all with Lua scripts written to bench/results/tmp/; it shares the 2 cores.

    python bench/http_bench.py                            # full: 100k and 1M units, 20 s cells
    python bench/http_bench.py --sizes 20000 --duration 5

Real questions (issue 28): ``--queries questions`` searches with the judged sets' whole questions (STARD's
Chinese, SciFact's English, alternating; corpus.questions) instead of the 2-4 term bench queries, and adds
tantivy alone in-process on the same questions and tokens as a column. Issue 42's run:

    python bench/http_bench.py --queries questions --sizes 100000 --conns 1,64 --workloads search,healthz \
        --no-baseline --postgresql --rounds 3 --duration 10 --name limits-100k
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

from common import BENCH, TMP, app_parts, machine, plt, save_plot, service_rev, service_src, write_json

LUA_COMMON = r"""
local bodies_search, bodies_push = {}, {}
local function load(path, into)
  local f = io.open(path, "r")
  if f then for line in f:lines() do into[#into + 1] = line end f:close() end
end
load("%(search)s", bodies_search)
load("%(push)s", bodies_push)
local auth = "%(auth)s"
local function hdrs(t)
  if auth ~= "" then t["Authorization"] = "Bearer " .. auth end
  return t
end
local counter = 1
function setup(thread) thread:set("id", counter); counter = counter + 1 end
local i, n = 0, 0
function init(args)
  math.randomseed(id * 7919)
  i = (id * 9973) %% #bodies_search
end
local function search_req()
  i = i + 1
  if i > #bodies_search then i = 1 end
  return wrk.format("POST", "/mcp/search", hdrs({["Content-Type"] = "application/json"}), bodies_search[i])
end
local function push_req()
  n = n + 1
  local b = bodies_push[(n %% #bodies_push) + 1]
  b = string.gsub(b, "@N@", "%(nonce)s-" .. id .. "-" .. n)
  return wrk.format("POST", "/mcp/push", hdrs({["Content-Type"] = "application/json"}), b)
end
function done(summary, latency, requests)
  local out = {}
  for _, p in ipairs({50, 90, 95, 99, 99.9}) do out[#out + 1] = string.format('"p%%s": %%.3f', p, latency:percentile(p) / 1000) end
  io.write(string.format('JSON {"requests": %%d, "duration_s": %%.3f, "errors_status": %%d, "errors_connect": %%d, '
    .. '"errors_read": %%d, "errors_timeout": %%d, "mean_ms": %%.3f, "max_ms": %%.3f, %%s}\n',
    summary.requests, summary.duration / 1e6, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.timeout, latency.mean / 1000, latency.max / 1000, table.concat(out, ", ")))
end
"""
REQUEST = {
    "healthz": "function request() return wrk.format(\"GET\", \"/healthz\") end\n",
    "search": "request = search_req\n",
    "push": "request = push_req\n",
    "mix": "function request() if math.random() < 0.9 then return search_req() else return push_req() end end\n",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"server on port {port} did not become ready")


def role_of(pid: int, root_pid: int) -> str:
    """master, worker, or the service's maintainer process and its supervisor (service/maintainer.py)."""
    import psutil
    if pid == root_pid:
        return "master"
    try:
        name = psutil.Process(pid).name()       # the maintainer's processes name themselves (comm)
    except psutil.Error:
        return "worker"
    return {"cms-maintainer": "maintainer", "cms-supervisor": "supervisor"}.get(name, "worker")


class RssSampler(threading.Thread):
    """Peak RSS and PSS of a server process and its children, sampled every 0.25 s (PSS every 2 s:
    reading smaps is slow)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        import psutil
        self.root = psutil.Process(pid)
        self.peak: dict[int, int] = {}
        self.peak_pss: dict[int, int] = {}
        self.peak_anon: dict[int, int] = {}    # RssAnon: private memory, without mapped index files
        self.roles: dict[int, str] = {}        # role_of each pid, seen while it lived
        self.stop = threading.Event()

    def run(self):
        import psutil
        tick = 0
        while not self.stop.wait(0.25):
            tick += 1
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for p in procs:
                if p.pid not in self.roles:
                    self.roles[p.pid] = role_of(p.pid, self.root.pid)
                try:
                    rss = p.memory_info().rss
                    if tick % 8 == 0:
                        self.peak_pss[p.pid] = max(self.peak_pss.get(p.pid, 0), p.memory_full_info().pss)
                        with open(f"/proc/{p.pid}/status") as fh:
                            anon = next(int(x.split()[1]) * 1024 for x in fh if x.startswith("RssAnon:"))
                        self.peak_anon[p.pid] = max(self.peak_anon.get(p.pid, 0), anon)
                except psutil.Error:
                    continue
                self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)


def start_gunicorn(src: Path, app: str, port: int, log_name: str, pythonpath: str, conf: str = "service/gunicorn_conf.py",
                   **env_vars) -> subprocess.Popen:
    """``app`` under service/gunicorn_conf.py (or ``conf``) with the default workers and threads."""
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", PYTHONPATH=pythonpath, **env_vars)
    env.pop("CONTEXT_WORKERS", None)
    env.pop("CONTEXT_THREADS", None)
    log = open(TMP / log_name, "ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", conf, app],
                            cwd=src, env=env, stdout=log, stderr=log, start_new_session=True)


def start_service(src: Path, data_dir: Path, port: int) -> subprocess.Popen:
    return start_gunicorn(src, "service:create_app()", port, "http-service.log", str(src),
                          CONTEXT_DATA_DIR=str(data_dir))


def start_tantivy(src: Path, index: Path, port: int) -> subprocess.Popen:
    # the engine alone on the server's path, not bench/ (its bench/profile.py would shadow the stdlib's profile)
    app_dir = TMP / "tantivy-app"
    app_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / "tantivy_engine.py", app_dir / "tantivy_engine.py")
    return start_gunicorn(src, "tantivy_engine:create_app()", port, "http-tantivy.log",
                          f"{src}{os.pathsep}{app_dir}", TANTIVY_BENCH_INDEX=str(index))


def start_bare(src: Path, index: Path, port: int, threads: bool = False) -> subprocess.Popen:
    """The bare app (bench/bare_app.py) under plain gunicorn with the service's workers, threads and keep-alive:
    none of the service's gunicorn settings (no slow-client guard, no maintainer, no frozen heap). With
    ``threads``, ``index`` is a copy of the service's read index and the answer is the service's own."""
    app_dir = TMP / "bare-app"         # (its own folder on the path, as start_tantivy says why)
    app_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / "bare_app.py", app_dir / "bare_app.py")
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{app_dir}", **{"BARE_THREADS" if threads else "BARE_INDEX": str(index)})
    log = open(TMP / ("http-bare-threads.log" if threads else "http-bare.log"), "ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-b", f"127.0.0.1:{port}", "-w", "2",
                             "-k", "gthread", "--threads", "8", "--keep-alive", "5", "bare_app:create_app()"],
                            cwd=app_dir, env=env, stdout=log, stderr=log, start_new_session=True)


def start_baseline(db: Path, port: int) -> subprocess.Popen:
    log = open(TMP / "http-baseline.log", "ab")
    return subprocess.Popen([sys.executable, str(BENCH / "baseline" / "app.py"), "--db", str(db), "--port", str(port)],
                            stdout=log, stderr=log, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def search_queries(kind: str, seed: int) -> list[str]:
    """The bench's queries: ``short`` (2-4 terms of held-back units) or ``questions`` (the judged sets')."""
    from corpus import queries, questions
    return (questions if kind == "questions" else queries)(2000, seed)


def write_inputs(seed: int, nonce: str, kind: str = "short", key: str | None = None,
                 consistency: str | None = None) -> dict:
    """wrk's Lua scripts per workload (each request with ``Authorization: Bearer <key>`` when a key is given;
    searches with ``consistency`` when one is given)."""
    from corpus import Generator
    TMP.mkdir(parents=True, exist_ok=True)
    search = TMP / "http-search-bodies.txt"
    push = TMP / "http-push-bodies.txt"
    extra = {"consistency": consistency} if consistency else {}
    search.write_text("".join(json.dumps({"query": q, "top_k": 10, **extra}) + "\n"
                              for q in search_queries(kind, seed)))
    now = int(time.time()) - 60
    lines = []
    for u in Generator(seed + 77).units(2000):
        u.pop("cid"), u.pop("parent_cid", None)
        u["timestamp"] = now
        u["content"] = u["content"] + " @N@"
        lines.append(json.dumps(u))          # ASCII-escaped: safe for Lua's gsub
    push.write_text("\n".join(lines) + "\n")
    scripts = {}
    for name, req in REQUEST.items():
        path = TMP / f"http-{name}{'-key' if key else ''}.lua"
        path.write_text(LUA_COMMON % {"search": search, "push": push, "nonce": nonce, "auth": key or ""} + req)
        scripts[name] = path
    return scripts


def wrk(script: Path, port: int, conns: int, duration: float) -> dict:
    threads = min(2, conns)
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{max(1, int(round(duration)))}s", "--timeout", "30s",
           "-s", str(script), f"http://127.0.0.1:{port}/"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    line = next((x for x in res.stdout.splitlines() if x.startswith("JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {res.stdout}\n{res.stderr}")
    data = json.loads(line[5:])
    data["rps"] = round(data["requests"] / data["duration_s"], 1)
    data["errors"] = data["errors_status"] + data["errors_connect"] + data["errors_read"] + data["errors_timeout"]
    return data


def cpu_seconds(trees: dict[str, int]) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) used so far by every process on the machine, by pid, with who it is:
    each named process tree (``trees``: name -> root pid, e.g. a service node) by role (its workers,
    maintainer...), PostgreSQL's processes, wrk, or other. Two readings around a load say where its CPU
    went (``cpu_used``)."""
    import psutil
    of_tree: dict[int, str] = {}
    for name, pid in trees.items():
        try:
            root = psutil.Process(pid)
            for p in [root] + root.children(recursive=True):
                of_tree[p.pid] = f"{name} {role_of(p.pid, pid)}"
        except psutil.Error:
            pass
    out: dict[int, tuple[str, float]] = {}
    for p in psutil.process_iter(["name"]):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        who = of_tree.get(p.pid) or ("postgresql" if (p.info["name"] or "").startswith("postgres")
                                     else "wrk" if p.info["name"] == "wrk" else "other")
        out[p.pid] = (who, t.user + t.system)
    return out


def cpu_used(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds each kind of process used between two ``cpu_seconds`` readings (a process that started
    in between counts from zero; one that ended in between is not seen)."""
    used: dict[str, float] = {}
    for pid, (who, seconds) in after.items():
        used[who] = used.get(who, 0.0) + seconds - (before[pid][1] if pid in before else 0.0)
    return used


def cpu_ms_per_request(before: dict, after: dict, requests: int) -> dict[str, float]:
    """What each process kind spent per request between two ``cpu_seconds`` readings, in CPU ms."""
    return {who: round(s * 1000 / max(1, requests), 3) for who, s in sorted(cpu_used(before, after).items())}


def wait_idle(pid: int, limit_s: float = 90) -> float:
    """After a cell, wait until the server has finished the requests wrk abandoned (CPU < 5 % for 1 s),
    so one cell's backlog does not spill into the next. Returns the seconds waited."""
    import psutil
    t0 = time.time()
    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)
    for p in procs:
        p.cpu_percent(None)
    while time.time() - t0 < limit_s:
        time.sleep(1)
        busy = 0.0
        for p in procs:
            try:
                busy += p.cpu_percent(None)
            except psutil.Error:
                pass
        if busy < 5:
            break
    return round(time.time() - t0, 1)


class Server:
    """One system under test, started once and kept up for the whole run (so that cells alternate)."""

    def __init__(self, name: str, start, workloads: set[str]):
        self.name, self.start, self.workloads = name, start, workloads
        self.port = free_port()
        self.proc = self.sampler = None
        self.settle = None              # after /readyz: what else must be done before it is measured
        self.cells: dict[str, list[dict]] = {}

    def up(self) -> None:
        self.proc = self.start(self.port)

    def ready(self) -> None:
        wait_ready(self.port, 600)
        if self.settle is not None:
            self.settle()
        self.sampler = RssSampler(self.proc.pid)
        self.sampler.start()

    def rss(self) -> dict:
        self.sampler.stop.set()
        self.sampler.join()
        rss: dict = {}
        for pid, peak in self.sampler.peak.items():
            role = self.sampler.roles.get(pid) or role_of(pid, self.proc.pid)
            if self.name == "baseline":
                role = "process"
            rss.setdefault(role, []).append(round(peak / 2**20, 1))
            if pid in self.sampler.peak_pss:
                rss.setdefault(role + "_pss", []).append(round(self.sampler.peak_pss[pid] / 2**20, 1))
                rss.setdefault(role + "_anon", []).append(round(self.sampler.peak_anon[pid] / 2**20, 1))
        return rss


def run_alternating(servers: list[Server], cells: list, scripts: dict, duration: float, rounds: int,
                    scripts_of=None) -> None:
    """Every server up at once; each cell (workload, connections) runs on each server in turn, the order
    turned round each round, so that the shared machine's load falls on all alike. Before each cell every
    server is idle (no backlog of another's cell); the server's CPU per request is read around it.
    ``scripts_of(server)``, when given, picks a server's own scripts (e.g. with its key)."""
    for s in servers:
        s.up()
    for s in servers:
        s.ready()
        if "search" in s.workloads:
            wrk((scripts_of(s) if scripts_of else scripts)["search"], s.port, 16, 3)       # warm each alike: connections, caches, the index
    for rnd in range(rounds):
        for workload, conns in cells:
            turn = [s for s in servers if workload in s.workloads]
            k = rnd % max(1, len(turn))
            for s in turn[k:] + turn[:k]:
                for other in servers:
                    wait_idle(other.proc.pid)
                before = cpu_seconds({"node": s.proc.pid})
                data = wrk((scripts_of(s) if scripts_of else scripts)[workload], s.port, conns, duration)
                cpu = cpu_used(before, cpu_seconds({"node": s.proc.pid}))
                data["round"] = rnd
                data["server_cpu_ms_per_request"] = round(sum(v for k_, v in cpu.items() if k_.startswith("node "))
                                                          * 1000 / max(1, data["requests"]), 3)
                # where it went: the node's roles, PostgreSQL's processes (a node's round trips), wrk, the rest
                data["cpu_ms_per_request_by_role"] = {k_: round(v * 1000 / max(1, data["requests"]), 3)
                                                      for k_, v in sorted(cpu.items()) if v > 0.005}
                s.cells.setdefault(f"{workload}@{conns}", []).append(data)
                print(f"  r{rnd} {s.name:9s} {workload:7s} c={conns:<3d} {data['rps']:8.1f} req/s  "
                      f"p50 {data['p50']:7.2f}  p99 {data['p99']:8.2f} ms  errors {data['errors']}  "
                      f"CPU {data['server_cpu_ms_per_request']:.3f} ms/req", flush=True)


def medians(cells: dict[str, list[dict]]) -> dict:
    """A server's figure per cell: the median over its rounds (rps, p50, p99, CPU), with every round kept."""
    out = {}
    for key, runs in cells.items():
        fig = {k: round(statistics.median(r[k] for r in runs), 3)
               for k in ("rps", "p50", "p90", "p99", "server_cpu_ms_per_request")}
        fig["errors"] = sum(r["errors"] for r in runs)
        fig["rounds"] = runs
        out[key] = fig
    return out


def tantivy_alone(index: Path, qs: list[str], max_s: float = 20) -> dict:
    """tantivy alone in this process on the same index and tokens: each query's latency (ms), bounded in time."""
    import tantivy_engine
    from service.config import Config
    from service.tokenize import tokenizer_for
    search = tantivy_engine.searcher(index, tokenizer_for(Config()))
    for q in qs[:50]:
        search(q)
    times, deadline = [], time.perf_counter() + max_s
    for q in qs:
        t0 = time.perf_counter()
        search(q)
        times.append((time.perf_counter() - t0) * 1000)
        if t0 > deadline:
            break
    times.sort()
    return {"queries": len(times), "p50": round(times[len(times) // 2], 3),
            "p99": round(times[min(len(times) - 1, int(len(times) * 0.99))], 3)}


def question_targets(entry: dict) -> dict:
    """Issue 28's targets for real questions: searches/s at 64 connections >= half of /healthz's on the same
    server, and single-client p50 <= /healthz p50 + 3x tantivy alone's p50 + 0.5 ms."""
    svc, out = entry["service"], {}
    if "search@64" in svc and "healthz@64" in svc:
        out["search_over_healthz_at_64"] = round(svc["search@64"]["rps"] / svc["healthz@64"]["rps"], 3)
        if "search@64" in entry.get("tantivy", {}) and "healthz@64" in entry["tantivy"]:
            t = entry["tantivy"]
            out["tantivy_search_over_healthz_at_64"] = round(t["search@64"]["rps"] / t["healthz@64"]["rps"], 3)
    if "search@1" in svc and "healthz@1" in svc and "tantivy_alone" in entry:
        limit = svc["healthz@1"]["p50"] + 3 * entry["tantivy_alone"]["p50"] + 0.5
        out["p50_ms"] = svc["search@1"]["p50"]
        out["p50_limit_ms"] = round(limit, 3)
    return out


def limits(entry: dict) -> dict:
    """Issue 42's ratios, per cell both servers ran: the service's searches/s (and, at one connection, its
    p50) against the bare app with threads' (the fair limit: the same answer with nothing else), the BM25-only
    bare app's and the rows-free
    engine's (tantivy's ids and scores only), the build before (``--old``) against the same, and a
    PostgreSQL node's against the SQLite service's."""
    out = {}
    pairs = [("service", "bare_threads", "over_bare_threads"), ("service_pg", "bare_threads", "pg_over_bare_threads"),
             ("old", "bare_threads", "old_over_bare_threads"),
             ("service", "bare", "over_bare"), ("service", "tantivy", "over_engine"),
             ("service_pg", "service", "pg_over_sqlite"), ("old", "bare", "old_over_bare"),
             ("old", "tantivy", "old_over_engine"), ("service", "old", "over_old"),
             ("service_pg", "bare", "pg_over_bare"), ("old_pg", "bare", "old_pg_over_bare"),
             ("old_pg", "old", "old_pg_over_old_sqlite"), ("service_pg", "old_pg", "pg_over_old_pg")]
    for mine_name, base_name, label in pairs:
        mine, base = entry.get(mine_name) or {}, entry.get(base_name) or {}
        for cell in sorted(set(mine) & set(base)):
            ratio = {"rps": round(mine[cell]["rps"] / base[cell]["rps"], 3)}
            if cell.endswith("@1"):
                ratio["p50"] = round(mine[cell]["p50"] / base[cell]["p50"], 3)
            out.setdefault(label, {})[cell] = ratio
    return out


def units_of(data_dir: Path) -> list[dict]:
    """Every live unit of a service data dir (SQLite) as pushed, in seq order (parents before children)."""
    import sqlite3
    rows = []
    for f in sorted((data_dir / "tenants" / "default" / "primary").glob("*.db")):
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        rows += conn.execute("SELECT seq, cid, type, source, timestamp, ttl, content, metadata, parent_cid "
                             "FROM units WHERE expires_at > ?", (int(time.time()) + 3600,)).fetchall()
        conn.close()
    rows.sort()
    out = []
    for _, cid, type_, source, ts, ttl, content, meta, parent in rows:
        u = {"cid": cid, "type": type_, "source": source, "timestamp": ts, "ttl": ttl, "content": content}
        if meta:
            u["metadata"] = json.loads(meta)
        if parent:
            u["parent_cid"] = parent
        out.append(u)
    return out


def pg_store(data_dir: Path, base: Path):
    """A PostgreSQL primary and standby (tools/pg_cluster.py, fsync on, as bench/postgresql.py) holding the
    same units as ``data_dir``, indexed and vacuumed: (cluster, the node's environment)."""
    from servers import pg_cluster, push_all

    from service import create_app
    cluster = pg_cluster(base)
    units = units_of(data_dir)
    app = create_app({"data_dir": str(base / "load"), "background": False, "store": cluster.primary_url,
                      "store_replica": cluster.standby_url})
    t0 = time.perf_counter()
    push_all(app, units)
    maint = app_parts(app).maintenance
    while maint.run_once():
        pass
    app_parts(app).shutdown()
    import psycopg
    with psycopg.connect(cluster.primary_url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")         # what autovacuum does within a minute or two of a bulk load
        c.execute("CHECKPOINT")
    print(f"  PostgreSQL: {len(units)} units pushed and indexed in {time.perf_counter() - t0:.0f} s", flush=True)
    return cluster, {"CONTEXT_STORE": cluster.primary_url, "CONTEXT_STORE_REPLICA": cluster.standby_url}


def servers_for(a, src: Path, run_dir: Path, size: int, entry: dict) -> list[Server]:
    """The systems of one size: the service, and unless left out the bare app (the fair limit), the rows-free
    engine, the naive baseline and a PostgreSQL node over the same units."""
    from corpus import baseline_db
    read = {"search", "healthz"}
    servers = [Server("service", partial(start_service, src, run_dir / "service"), set(a.workloads.split(",")))]
    if a.old:
        # the service before, on its own copy of the corpus brought up to date with that build
        from servers import up_to_date
        old = service_src(a.old)
        shutil.copytree(run_dir / "service", run_dir / "old")
        up_to_date(old, run_dir / "old")
        servers.append(Server("old", partial(start_service, old, run_dir / "old"), set(a.workloads.split(","))))
        entry["old_rev"] = service_rev(old)
    if not a.no_bare:
        import bare_app
        n, secs = bare_app.build(run_dir / "service", run_dir / "bare")
        print(f"  bare app's index: {n} units in {secs:.1f} s", flush=True)
        servers.append(Server("bare", partial(start_bare, src, run_dir / "bare"), read))
        # the fair limit of today's answer: the service's thread-aware ranking and shaping, nothing else
        copy = bare_app.copy_read_index(run_dir / "service", run_dir / "bare-threads")
        qs = search_queries(a.queries, a.seed)[:200]
        same = bare_app.same_answers(run_dir / "service", copy, qs)
        entry["bare_threads_same_answers"] = f"{same}/{len(qs)}"
        print(f"  bare app with threads: {same} of {len(qs)} answers the service's, field for field", flush=True)
        servers.append(Server("bare_threads", partial(start_bare, src, copy, threads=True), read))
    if not a.no_tantivy:
        import tantivy_engine
        index = run_dir / "tantivy"
        tantivy_engine.build(run_dir / "service", index)
        entry["tantivy_alone"] = tantivy_alone(index, search_queries(a.queries, a.seed))
        print(f"  tantivy alone in-process p50 {entry['tantivy_alone']['p50']:.3f} ms  "
              f"p99 {entry['tantivy_alone']['p99']:.3f} ms", flush=True)
        servers.append(Server("tantivy", partial(start_tantivy, src, index), read))
    if a.postgresql:
        from servers import wait_index
        cluster, env = pg_store(run_dir / "service", TMP / "http-pg-cluster")
        entry["_cluster"] = cluster
        node = Server("service_pg", lambda port: start_gunicorn(
            src, "service:create_app()", port, "http-service-pg.log", str(src),
            CONTEXT_DATA_DIR=str(run_dir / "pg-node"), **env), read)
        node.settle = lambda: wait_index(node.port, 1800)        # its read index built from PostgreSQL
        servers.append(node)
        if a.old:
            # the build before as a node of the same cluster, its own read index
            old = service_src(a.old)
            old_node = Server("old_pg", lambda port: start_gunicorn(
                old, "service:create_app()", port, "http-old-pg.log", str(old),
                CONTEXT_DATA_DIR=str(run_dir / "old-pg-node"), **env), read)
            old_node.settle = lambda: wait_index(old_node.port, 1800)
            servers.append(old_node)
    if not a.no_baseline:
        db = run_dir / "baseline.db"
        shutil.copy(baseline_db(size, a.seed), db)
        servers.append(Server("baseline", partial(start_baseline, db), set(a.workloads.split(",")) - {"healthz"}))
    return servers


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=1, help="cells of each workload per system, alternating")
    ap.add_argument("--conns", default="1,16,64")
    ap.add_argument("--push-conns", default="1,16,50,64")
    ap.add_argument("--workloads", default="search,mix,push,healthz")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--no-bare", action="store_true")
    ap.add_argument("--no-tantivy", action="store_true")
    ap.add_argument("--postgresql", action="store_true", help="a PostgreSQL node over the same units too")
    ap.add_argument("--old", help="also this build of the service (before/after in the same run: 'old')")
    ap.add_argument("--queries", choices=("short", "questions"), default="short",
                    help="2-4 term bench queries, or the judged sets' whole questions")
    ap.add_argument("--name", default="http")
    a = ap.parse_args(argv)
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install -y wrk")
    src = service_src(a.service_src)
    from corpus import service_dir
    scripts = write_inputs(a.seed, nonce=f"r{int(time.time())}", kind=a.queries)
    cells = []
    for w in a.workloads.split(","):
        for c in (a.push_conns if w == "push" else a.conns).split(","):
            cells.append((w, int(c)))
    version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    out = {"machine": machine(), "service_rev": service_rev(src), "duration_s": a.duration, "rounds": a.rounds,
           "queries": a.queries, "load_generator": version.splitlines()[0] if version else "wrk",
           "load_at_start": os.getloadavg(),
           "service_config": "gunicorn gthread, CONTEXT_WORKERS/CONTEXT_THREADS defaults (2 x 8)",
           "bare_config": "plain gunicorn -w 2 -k gthread --threads 8 --keep-alive 5, Flask, bench/bare_app.py",
           "tantivy_config": "bench/tantivy_engine.py under service/gunicorn_conf.py: ids and scores, no rows",
           "baseline_config": "Flask dev server, threaded, one process", "sizes": {}}
    for size in [int(x) for x in a.sizes.split(",")]:
        print(f"== {size} units")
        run_dir = TMP / "run-http"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        # Pushes change the data: run on a copy, keep the cached corpus pristine.
        shutil.copytree(service_dir(size, a.seed), run_dir / "service")
        entry: dict = {}
        servers = servers_for(a, src, run_dir, size, entry)
        cluster = entry.pop("_cluster", None)
        try:
            run_alternating(servers, cells, scripts, a.duration, a.rounds)
            for s in servers:
                entry[s.name], entry[f"{s.name}_rss_mib"] = medians(s.cells), s.rss()
        finally:
            for s in servers:
                if s.proc is not None:
                    stop(s.proc)
            if cluster is not None:
                cluster.stop()
        print("  peak RSS MiB: " + "  ".join(f"{s.name} {entry[f'{s.name}_rss_mib']}" for s in servers))
        entry["limits"] = limits(entry)
        print(f"  ratios: {json.dumps(entry['limits'])}", flush=True)
        if a.queries == "questions":
            entry["targets"] = question_targets(entry)
            print(f"  targets: {entry['targets']}", flush=True)
        out["sizes"][str(size)] = entry
        shutil.rmtree(run_dir)
    out["targets"] = {"search_rps_at_64": {"100k": 1000, "1M": 500}, "mix_rps_at_64_1M": 400,
                      "rss_mib_per_worker_at_1M": 200,
                      "issue_42": {"search_at_64_over_bare": 0.7, "healthz_at_64_over_bare": 0.8,
                                   "search_p50_at_1_over_bare_max": 1.3, "pg_p50_over_sqlite_max": 1.2,
                                   "pg_search_at_64_over_sqlite": 0.9}}
    write_json(a.name, out)
    plot(out, a.name)


def plot(out: dict, name: str) -> None:
    pyplot = plt()
    sizes = list(out["sizes"])
    workloads = ("search", "mix", "push")
    fig, axes = pyplot.subplots(2, 3, figsize=(15, 8))
    for col, w in enumerate(workloads):
        for size in sizes:
            for system in ("service", "baseline", "tantivy", "bare", "bare_threads", "service_pg", "old", "old_pg"):
                cells = out["sizes"][size].get(system) or {}
                pts = sorted((int(k.split("@")[1]), v) for k, v in cells.items() if k.startswith(w + "@"))
                if not pts:
                    continue
                ls = {"service": "-", "baseline": "--", "tantivy": ":", "bare": "-.", "bare_threads": "-.", "service_pg": "-", "old": "--",
                      "old_pg": ":"}[system]
                xs = [c for c, _ in pts]
                axes[0][col].plot(xs, [v["rps"] for _, v in pts], marker="o", ls=ls, label=f"{system} {int(size):,}")
                axes[1][col].plot(xs, [v["p99"] for _, v in pts], marker="o", ls=ls, label=f"{system} {int(size):,} p99")
                axes[1][col].plot(xs, [v["p50"] for _, v in pts], marker=".", ls=":", label=f"{system} {int(size):,} p50")
        axes[0][col].set_title(f"{w}: throughput")
        axes[0][col].set_ylabel("requests/s (log)")
        axes[0][col].set_yscale("log")
        axes[1][col].set_title(f"{w}: latency")
        axes[1][col].set_ylabel("ms (log)")
        axes[1][col].set_yscale("log")
        for row in (0, 1):
            axes[row][col].set_xlabel("concurrent connections")
            axes[row][col].legend(fontsize=7)
    axes[0][0].axhline(1000, color="grey", lw=0.8, ls=":")
    save_plot(fig, name, dpi=100)


if __name__ == "__main__":
    main()
