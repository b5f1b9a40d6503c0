"""HTTP throughput and latency under wrk (docs/design.md §10): gunicorn (default workers and
threads) vs the naive baseline (Flask dev server) and tantivy alone behind the same gunicorn
(bench/tantivy_engine.py, same tokens), same run, loopback only, bounded in time.

Workloads: search, push (single units, unique content), a 90/10 search/push mix, each at 1, 16
and 64 concurrent connections (push also at 50, the target's writer count), and GET /healthz on
the same server as the ceiling of the HTTP stack. Peak RSS and PSS (mapped index files are
shared between workers) of every server process are sampled (psutil) throughout. wrk (Debian
package) drives all with Lua scripts written to bench/results/tmp/; it shares the 2 cores.

    python bench/http_bench.py                            # full: 100k and 1M units, 20 s cells
    python bench/http_bench.py --sizes 20000 --duration 5

Real questions (issue 28): ``--queries questions`` searches with the judged sets' whole questions (STARD's
Chinese, SciFact's English, alternating; corpus.questions) instead of the 2-4 term bench queries, and adds
tantivy alone in-process on the same questions and tokens as a column:

    python bench/http_bench.py --queries questions --sizes 100000 --conns 1,64 --workloads search,healthz \
        --no-baseline --name questions-100k
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

from common import BENCH, TMP, machine, plt, save_plot, service_rev, service_src, write_json

LUA_COMMON = r"""
local bodies_search, bodies_push = {}, {}
local function load(path, into)
  local f = io.open(path, "r")
  if f then for line in f:lines() do into[#into + 1] = line end f:close() end
end
load("%(search)s", bodies_search)
load("%(push)s", bodies_push)
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
  return wrk.format("POST", "/mcp/search", {["Content-Type"] = "application/json"}, bodies_search[i])
end
local function push_req()
  n = n + 1
  local b = bodies_push[(n %% #bodies_push) + 1]
  b = string.gsub(b, "@N@", "%(nonce)s-" .. id .. "-" .. n)
  return wrk.format("POST", "/mcp/push", {["Content-Type"] = "application/json"}, b)
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


def start_gunicorn(src: Path, app: str, port: int, log_name: str, pythonpath: str, **env_vars) -> subprocess.Popen:
    """``app`` under service/gunicorn_conf.py with the default workers and threads."""
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", PYTHONPATH=pythonpath, **env_vars)
    env.pop("CONTEXT_WORKERS", None)
    env.pop("CONTEXT_THREADS", None)
    log = open(TMP / log_name, "ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", "service/gunicorn_conf.py", app],
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


def write_inputs(seed: int, nonce: str, kind: str = "short") -> dict:
    from corpus import Generator
    TMP.mkdir(parents=True, exist_ok=True)
    search = TMP / "http-search-bodies.txt"
    push = TMP / "http-push-bodies.txt"
    search.write_text("".join(json.dumps({"query": q, "top_k": 10}) + "\n" for q in search_queries(kind, seed)))
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
        path = TMP / f"http-{name}.lua"
        path.write_text(LUA_COMMON % {"search": search, "push": push, "nonce": nonce} + req)
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


def run_system(name: str, start, port: int, cells: list, scripts: dict, duration: float) -> tuple[dict, dict]:
    proc = start()
    try:
        wait_ready(port, 120)
        sampler = RssSampler(proc.pid)
        sampler.start()
        out = {}
        for workload, conns in cells:
            data = wrk(scripts[workload], port, conns, duration)
            out[f"{workload}@{conns}"] = data
            print(f"  {name:8s} {workload:6s} c={conns:<3d} {data['rps']:8.1f} req/s  p50 {data['p50']:8.2f}  "
                  f"p95 {data['p95']:8.2f}  p99 {data['p99']:8.2f} ms  errors {data['errors']}", flush=True)
            data["drain_s"] = wait_idle(proc.pid)
        sampler.stop.set()
        sampler.join()
        rss = {}
        for pid, peak in sampler.peak.items():
            role = sampler.roles.get(pid) or role_of(pid, proc.pid)
            if name == "baseline":
                role = "process"
            rss.setdefault(role, []).append(round(peak / 2**20, 1))
            if pid in sampler.peak_pss:
                rss.setdefault(role + "_pss", []).append(round(sampler.peak_pss[pid] / 2**20, 1))
                rss.setdefault(role + "_anon", []).append(round(sampler.peak_anon[pid] / 2**20, 1))
        return out, rss
    finally:
        stop(proc)


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--conns", default="1,16,64")
    ap.add_argument("--push-conns", default="1,16,50,64")
    ap.add_argument("--workloads", default="search,mix,push,healthz")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--no-tantivy", action="store_true")
    ap.add_argument("--queries", choices=("short", "questions"), default="short",
                    help="2-4 term bench queries, or the judged sets' whole questions")
    ap.add_argument("--name", default="http")
    a = ap.parse_args(argv)
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install -y wrk")
    src = service_src(a.service_src)
    from corpus import baseline_db, service_dir
    scripts = write_inputs(a.seed, nonce=f"r{int(time.time())}", kind=a.queries)
    cells = []
    for w in a.workloads.split(","):
        for c in (a.push_conns if w == "push" else a.conns).split(","):
            cells.append((w, int(c)))
    out = {"machine": machine(), "service_rev": service_rev(src), "duration_s": a.duration, "queries": a.queries,
           "load_generator": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[0]
           if subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout else "wrk",
           "service_config": "gunicorn gthread, CONTEXT_WORKERS/CONTEXT_THREADS defaults (2 x 8)",
           "baseline_config": "Flask dev server, threaded, one process", "sizes": {}}
    for size in [int(x) for x in a.sizes.split(",")]:
        print(f"== {size} units")
        run_dir = TMP / "run-http"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        # Pushes change the data: run on a copy, keep the cached corpus pristine.
        shutil.copytree(service_dir(size, a.seed), run_dir / "service")
        entry = {}
        port = free_port()
        entry["service"], entry["service_rss_mib"] = run_system(
            "service", partial(start_service, src, run_dir / "service", port), port, cells, scripts, a.duration)
        if not a.no_tantivy:
            import tantivy_engine
            index = run_dir / "tantivy"
            n, secs = tantivy_engine.build(run_dir / "service", index)
            entry["tantivy_alone"] = tantivy_alone(index, search_queries(a.queries, a.seed))
            print(f"  tantivy alone in-process p50 {entry['tantivy_alone']['p50']:.3f} ms  "
                  f"p99 {entry['tantivy_alone']['p99']:.3f} ms", flush=True)
            port = free_port()
            read_cells = [c for c in cells if c[0] in ("search", "healthz")]
            entry["tantivy"], entry["tantivy_rss_mib"] = run_system(
                "tantivy", partial(start_tantivy, src, index, port), port, read_cells, scripts, a.duration)
        if not a.no_baseline:
            db = run_dir / "baseline.db"
            shutil.copy(baseline_db(size, a.seed), db)
            port = free_port()
            base_cells = [c for c in cells if c[0] != "healthz"]
            entry["baseline"], entry["baseline_rss_mib"] = run_system(
                "baseline", partial(start_baseline, db, port), port, base_cells, scripts, a.duration)
        print(f"  peak RSS MiB: service {entry['service_rss_mib']}  baseline {entry.get('baseline_rss_mib')}  "
              f"tantivy {entry.get('tantivy_rss_mib')}")
        if a.queries == "questions":
            entry["targets"] = question_targets(entry)
            print(f"  targets: {entry['targets']}", flush=True)
        out["sizes"][str(size)] = entry
        shutil.rmtree(run_dir)
    out["targets"] = {"search_rps_at_64": {"100k": 1000, "1M": 500}, "mix_rps_at_64_1M": 400,
                      "rss_mib_per_worker_at_1M": 200}
    write_json(a.name, out)
    plot(out, a.name)


def plot(out: dict, name: str) -> None:
    pyplot = plt()
    sizes = list(out["sizes"])
    workloads = ("search", "mix", "push")
    fig, axes = pyplot.subplots(2, 3, figsize=(15, 8))
    for col, w in enumerate(workloads):
        for size in sizes:
            for system in ("service", "baseline", "tantivy"):
                cells = out["sizes"][size].get(system) or {}
                pts = sorted((int(k.split("@")[1]), v) for k, v in cells.items() if k.startswith(w + "@"))
                if not pts:
                    continue
                ls = {"service": "-", "baseline": "--", "tantivy": ":"}[system]
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
