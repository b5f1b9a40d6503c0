"""Read-your-writes: what it costs a default search, and what it buys.

The same gunicorn (2 workers) on copies of the same 100k-unit corpus, read-your-writes on (the
default) and off (``CONTEXT_READ_YOUR_WRITES_MS=0``: the read index alone), one after the other:

- ``idle``: default searches (2-4-term queries, top 10, one client) with no pushes;
- ``load``: the same searches while two threads push 1,000 units/s in batches of 50; between
  searches a probe unit with a unique token is pushed, then searched for at once and every 20 ms
  until found: ``found_first`` is the share of probes the very first search found, ``lag`` the
  time from the push's ack to the search that found it.

    .venv/bin/python bench/ryw.py [--size 100000] [--queries 300] [--duration 30] [--rate 1000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import uuid

from common import TMP, machine, quiet_service_logs, service_rev, service_src, summary, write_json
from ingest import Client, gen_units, push_load


def searches(c: Client, qs: list[str]) -> list[float]:
    lat = []
    for q in qs:
        t0 = time.perf_counter()
        status, _ = c.post("/mcp/search", json.dumps({"query": q, "top_k": 10}).encode())
        lat.append((time.perf_counter() - t0) * 1000)
        assert status == 200, status
    return lat


def under_load(port: int, load_units: list[dict], qs: list[str], rate: float, duration: float) -> dict:
    t_start = time.perf_counter()
    stop, pushed, threads = push_load(port, load_units, rate, tag="R")
    c = Client(port)
    lat, lags, first, probes = [], [], 0, 0
    deadline = time.perf_counter() + duration
    qi = 0
    while time.perf_counter() < deadline:
        token = "probe" + uuid.uuid4().hex[:10]
        status, _ = c.post("/mcp/push", json.dumps({
            "type": "system_notice", "source": "bench_probe_v1_local", "timestamp": int(time.time()),
            "ttl": 86_400, "content": f"read your writes probe {token}"}).encode())
        assert status == 200, status
        acked = time.perf_counter()
        q = json.dumps({"query": token, "top_k": 1}).encode()
        probes += 1
        tries = 0
        while time.perf_counter() - acked < 30:
            tries += 1
            status, data = c.post("/mcp/search", q)
            if status == 200 and data.get("results"):
                lags.append((time.perf_counter() - acked) * 1000)
                first += tries == 1
                break
            time.sleep(0.02)
        lat += searches(c, qs[qi:qi + 10])
        qi = (qi + 10) % max(1, len(qs) - 10)
    stop.set()
    for th in threads:
        th.join(timeout=30)
    return {"search_ms": summary(lat), "probes": probes, "found_first": round(first / probes, 3) if probes else None,
            "lag_ms": summary(lags), "achieved_units_per_s": round(pushed[0] / (time.perf_counter() - t_start))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="ryw")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    quiet_service_logs()
    from corpus import queries, service_dir
    import http_bench as hb
    qs = queries(a.queries, a.seed)
    base = service_dir(a.size, a.seed)
    load_units = gen_units(20_000, a.seed + 700)
    out = {"machine": machine(), "service_rev": service_rev(src), "size": a.size, "queries": len(qs),
           "rate": a.rate, "duration_s": a.duration, "modes": {}}
    for mode, env in (("on", {}), ("off", {"CONTEXT_READ_YOUR_WRITES_MS": "0"})):
        d = TMP / f"ryw-{mode}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        port = hb.free_port()
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            proc = hb.start_service(src, d, port)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            hb.wait_ready(port, 180)
            c = Client(port)
            searches(c, qs[:30])       # warm up
            res = {"idle_search_ms": summary(searches(c, qs))}
            res["load"] = under_load(port, load_units, qs, a.rate, a.duration)
            out["modes"][mode] = res
            print(f"== read-your-writes {mode}: idle search {json.dumps(res['idle_search_ms'])}")
            print(f"   under {a.rate:.0f} units/s: {json.dumps(res['load'])}")
        finally:
            hb.stop(proc)
            shutil.rmtree(d, ignore_errors=True)
    write_json(a.name, out)


if __name__ == "__main__":
    main()
