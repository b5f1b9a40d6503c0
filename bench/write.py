"""The write path, service vs the naive baseline (and optionally the service at an older
commit) in one run, each on a copy of the same corpus, loopback only, every cell bounded in time:

- single-unit pushes from 50 closed-loop writers (wrk): pushes/s, ack p50/p95/p99, and the server's
  CPU per push (user+sys of every server process over the cell / pushes answered: on a shared
  machine this moves far less than throughput does);
- fixed offered loads (open loop, bench/openloop.mjs: sent on schedule whether or not answered,
  latency from the scheduled time): ack p50/p99 at each of --rates pushes/s;
- batch ingest over HTTP (1000 units per request, --clients clients), units/s, with a probe unit
  pushed every 0.5 s and searched for (default consistency) until found: index lag p50/p99;
- RSS, PSS and private (anonymous) memory per server process: peak under load and idle after it.

    python bench/write.py --sizes 100000 --duration 10 --name write-100k
    python bench/write.py --sizes 1000000 --duration 10 --compare-src 80df381 --name write-1m
    python bench/write.py --sizes 20000 --synchronous NORMAL,FULL --no-baseline --name write-synchronous

``--synchronous NORMAL,FULL`` runs the service once per CONTEXT_SYNCHRONOUS value, one after the
other in the same run (what an acknowledged push being on disk costs, side by side).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from functools import partial

import http_bench as H
from common import BENCH, TMP, machine, service_rev, service_src, summary, write_json


def server_cpu(pid: int) -> float:
    import psutil
    root = psutil.Process(pid)
    total = 0.0
    for p in [root] + root.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def closed_loop(pid: int, port: int, script, conns: int, duration: float) -> dict:
    c0 = server_cpu(pid)
    data = H.wrk(script, port, conns, duration)
    time.sleep(0.5)
    data["server_cpu_ms_per_push"] = round((server_cpu(pid) - c0) * 1000 / max(1, data["requests"]), 3)
    return data


def open_loop(port: int, bodies, rate: float, duration: float) -> dict:
    cmd = ["node", str(BENCH / "openloop.mjs"), "--url", f"http://127.0.0.1:{port}/mcp/push", "--bodies", str(bodies),
           "--rate", str(rate), "--duration", str(duration), "--drain", "30", "--nonce", f"o{uuid.uuid4().hex[:8]}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 90)
    line = next((x for x in res.stdout.splitlines() if x.startswith("JSON ")), None)
    if line is None:
        raise RuntimeError(f"openloop failed: {res.stdout}\n{res.stderr}")
    return json.loads(line[5:])


class Probe(threading.Thread):
    """Pushes a unique unit every 0.5 s and, every 50 ms, searches (default consistency) for all those
    not found yet: the lag of each is from its ack to the first search that returns it."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.lags, self.misses = port, [], 0
        self.stop = threading.Event()

    def _post(self, c, path: str, body: dict) -> tuple[int, dict]:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = c.getresponse()
        return resp.status, json.loads(resp.read())

    def run(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        waiting: dict[str, tuple[str, float]] = {}      # token -> (cid, acked at)
        next_push = time.perf_counter()
        stopped_at = None
        while True:
            now = time.perf_counter()
            if self.stop.is_set():
                stopped_at = stopped_at or now
                if not waiting or now - stopped_at > 30:
                    break
            elif now >= next_push:
                token = "probe" + uuid.uuid4().hex[:10]
                unit = {"type": "system_notice", "source": "bench_probe_v1_local", "timestamp": int(time.time()),
                        "ttl": 86_400, "content": f"write path probe {token}"}
                status, body = self._post(c, "/mcp/push", unit)
                if status == 200:
                    waiting[token] = (body["cid"], time.perf_counter())
                next_push += 0.5
            if waiting:
                status, body = self._post(c, "/mcp/search", {"query": " ".join(waiting), "top_k": 50})
                found = {r["cid"] for r in body.get("results", [])} if status == 200 else set()
                t = time.perf_counter()
                for token, (cid, acked) in list(waiting.items()):
                    if cid in found:
                        self.lags.append((t - acked) * 1000)
                        del waiting[token]
            time.sleep(0.05)
        self.misses = len(waiting)


def batch_ingest(port: int, units: list[dict], clients: int) -> dict:
    from ingest import http_batch_ingest
    probe = Probe(port)
    probe.start()
    try:
        out = http_batch_ingest(port, units, clients=clients)
    finally:
        probe.stop.set()
        probe.join(timeout=40)
    out["index_lag_while_ingesting"] = summary(probe.lags)
    out["probe_misses"] = probe.misses
    return out


def ingest_units(n: int, seed: int) -> list[dict]:
    from corpus import Generator
    now = int(time.time()) - 60
    units = []
    for i, u in enumerate(Generator(seed + 901).units(n)):
        u.pop("cid", None), u.pop("parent_cid", None)
        u["timestamp"] = now
        u["content"] = f"{u['content']} w{seed}x{i}x{uuid.uuid4().hex[:6]}"
        units.append(u)
    return units


def memory(sampler, proc_pid: int, idle: dict) -> dict:
    out = {}
    for pid, peak in sampler.peak.items():
        role = sampler.roles.get(pid) or H.role_of(pid, proc_pid)
        out.setdefault(role + "_rss_peak", []).append(round(peak / 2**20, 1))
        if pid in sampler.peak_pss:
            out.setdefault(role + "_pss_peak", []).append(round(sampler.peak_pss[pid] / 2**20, 1))
            out.setdefault(role + "_anon_peak", []).append(round(sampler.peak_anon[pid] / 2**20, 1))
    out.update(idle)
    return out


def idle_memory(pid: int) -> dict:
    import psutil
    root = psutil.Process(pid)
    out: dict = {}
    for p in [root] + root.children(recursive=True):
        role = H.role_of(p.pid, pid)
        try:
            full = p.memory_full_info()
        except psutil.Error:
            continue
        out.setdefault(role + "_rss_idle", []).append(round(full.rss / 2**20, 1))
        out.setdefault(role + "_pss_idle", []).append(round(full.pss / 2**20, 1))
    return out


def run_system(name: str, start, port: int, a, scripts: dict, bodies, units: list[dict]) -> dict:
    proc = start()
    out: dict = {}
    try:
        H.wait_ready(port, 180)
        sampler = H.RssSampler(proc.pid)
        sampler.start()
        H.wrk(scripts["push"], port, 8, 2)          # warm up: connections, first day file
        H.wait_idle(proc.pid)
        out["push_closed_50"] = closed_loop(proc.pid, port, scripts["push"], 50, a.duration)
        print(f"  {name:10s} push x50 closed  {out['push_closed_50']['rps']:8.1f}/s  p50 {out['push_closed_50']['p50']:7.2f}  "
              f"p99 {out['push_closed_50']['p99']:7.2f} ms  server CPU {out['push_closed_50']['server_cpu_ms_per_push']} ms/push",
              flush=True)
        H.wait_idle(proc.pid)
        out["healthz_closed_50"] = closed_loop(proc.pid, port, scripts["healthz"], 50, min(a.duration, 5)) \
            if name != "baseline" else None
        H.wait_idle(proc.pid)
        out["push_open_loop"] = {}
        for rate in a.rates:
            ol = out["push_open_loop"][str(int(rate))] = open_loop(port, bodies, rate, a.duration)
            print(f"  {name:10s} push open {rate:.0f}/s  answered {ol['achieved_per_s']}/s  p50 {ol['p50']:7.2f}  "
                  f"p99 {ol['p99']:7.2f} ms  errors {ol['errors']} dropped {ol['dropped']}", flush=True)
            H.wait_idle(proc.pid)
        bi = out["batch_ingest"] = batch_ingest(port, units, a.clients)
        lag = bi["index_lag_while_ingesting"]
        print(f"  {name:10s} batch ingest {bi['units_per_s']:8d} units/s  index lag p50 {lag.get('p50_ms')}  "
              f"p99 {lag.get('p99_ms')} ms  misses {bi['probe_misses']}", flush=True)
        H.wait_idle(proc.pid, 120)
        time.sleep(3)
        sampler.stop.set()
        sampler.join()
        out["memory_mib"] = memory(sampler, proc.pid, idle_memory(proc.pid))
        print(f"  {name:10s} memory MiB {out['memory_mib']}", flush=True)
        return out
    finally:
        H.stop(proc)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--rates", default="250,1000", help="open-loop offered pushes/s, one cell each")
    ap.add_argument("--ingest-units", type=int, default=60_000)
    ap.add_argument("--clients", type=int, default=4, help="batch-ingest clients")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--compare-src", default=None, help="also run the service at this older commit")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--synchronous", default=None,
                    help="comma list of CONTEXT_SYNCHRONOUS values (e.g. NORMAL,FULL): one service run each")
    ap.add_argument("--name", default="write")
    a = ap.parse_args(argv)
    a.rates = [float(x) for x in a.rates.split(",")]
    if not shutil.which("wrk") or not shutil.which("node"):
        raise SystemExit("wrk and node are needed (apt-get install -y wrk; Node 20)")
    src = service_src(a.service_src)
    old = service_src(a.compare_src) if a.compare_src else None
    from corpus import baseline_db, service_dir
    scripts = H.write_inputs(a.seed, nonce=f"w{int(time.time())}")
    bodies = TMP / "http-push-bodies.txt"
    out = {"machine": machine(), "service_rev": service_rev(src), "duration_s": a.duration, "rates": a.rates,
           "synchronous": a.synchronous,
           "load_at_start": os.getloadavg(), "sizes": {}}
    if old is not None:
        out["compare_rev"] = service_rev(old)
    for size in [int(x) for x in a.sizes.split(",")]:
        print(f"== {size} units")
        entry = {}
        modes = [m.strip().upper() for m in a.synchronous.split(",")] if a.synchronous else [None]
        systems = [("service" + (f" sync={m}" if m else ""), src, m) for m in modes] \
            + ([("service@" + service_rev(old), old, None)] if old is not None else [])
        for name, code, mode in systems:
            run_dir = TMP / "run-write"
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(service_dir(size, a.seed), run_dir / "service")
            port = H.free_port()
            extra = {"CONTEXT_SYNCHRONOUS": mode} if mode else {}
            start = partial(H.start_gunicorn, code, "service:create_app()", port, "http-service.log", str(code),
                            CONTEXT_DATA_DIR=str(run_dir / "service"), **extra)
            entry[name] = run_system(name, start, port, a, scripts, bodies, ingest_units(a.ingest_units, a.seed))
            shutil.rmtree(run_dir, ignore_errors=True)
        if not a.no_baseline:
            run_dir = TMP / "run-write"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            db = run_dir / "baseline.db"
            shutil.copy(baseline_db(size, a.seed), db)
            port = H.free_port()
            entry["baseline"] = run_system("baseline", partial(H.start_baseline, db, port), port, a, scripts, bodies,
                                           ingest_units(a.ingest_units, a.seed))
            shutil.rmtree(run_dir, ignore_errors=True)
        out["sizes"][str(size)] = entry
    out["load_at_end"] = os.getloadavg()
    out["targets"] = {"push_closed_50_per_s": 2000, "open_loop_1000_p50_ms": 5, "open_loop_1000_p99_ms": 20,
                      "batch_ingest_units_per_s": 20_000, "index_lag_p99_ms": 2000,
                      "worker_rss_mib_under_load_1m": 150, "worker_rss_mib_idle": 100}
    write_json(a.name, out)


if __name__ == "__main__":
    main()
