"""Default searches over large units, and what they cost another tenant (issue 39 finding 3, issue 50 H1).

One tenant holds 100 units of about 1 MB, each holding the word ``big`` (a fetched page, a log); another holds
ordinary units. Through HTTP on one gunicorn (2 workers, as ``make run`` serves), loopback only, bounded in time:

- the large tenant's default search for ``big`` alone, timed (it was 14.6-35.7 s when rescoring split every
  candidate's stored tokens);
- the other tenant's search p50 and ``/healthz`` p50, quiet, and while one key of the large tenant opens N
  connections (``--connections``, 16 and 64 by default), each searching ``big`` with ``top_k`` 100 without
  pause (issue 50's targets: the other tenant within 3x quiet, ``/healthz`` within 2x);
- each cell with CPU shares on (the default) and off (``CONTEXT_SEARCH_CPU_SHARE=0``), alternating, ``--rounds``
  times, on one corpus: the server is restarted on the same data folder between cells.

    .venv/bin/python bench/large_units.py [--units 100] [--mb 1] [--seconds 20] [--connections 16,64]
                                          [--rounds 2] [--shares on,off] [--service-src worktree|<rev>]
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

import http_bench as H
from common import TMP, machine, service_rev, service_src, write_json

KEYS = {"large-units-key-0123456789": "big", "other-units-key-0123456789": "other"}
BIG_KEY, OTHER_KEY = list(KEYS)
SHARES = {"on": {}, "off": {"CONTEXT_SEARCH_CPU_SHARE": "0"}}


def big_unit(i: int, mb: float) -> dict:
    words = " ".join(f"w{j % 5000}x{i}" for j in range(int(mb * 1024 * 1024 / 10)))
    return {"type": "tool_output", "source": "fetch_v1", "content": f"big page {i} {words} big",
            "timestamp": int(time.time()) - 60, "ttl": 86_400}


def timed(session: requests.Session, url: str, key: str, query: str, top_k: int = 10) -> tuple[float, int]:
    t = time.perf_counter()
    rv = session.post(f"{url}/mcp/search", json={"query": query, "top_k": top_k},
                      headers={"Authorization": f"Bearer {key}"}, timeout=120)
    return time.perf_counter() - t, rv.status_code


def other_p50(url: str, seconds: float) -> dict:
    """The other tenant's search p50 (and /healthz's, asked between them) over ``seconds``."""
    s = requests.Session()
    times, codes, health = [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        took, code = timed(s, url, OTHER_KEY, "order shipped")
        times.append(took * 1000)
        codes.append(code)
        t = time.perf_counter()
        codes.append(s.get(f"{url}/healthz", timeout=60).status_code)
        health.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
    return {"p50_ms": round(statistics.median(times), 2), "n": len(times),
            "healthz_p50_ms": round(statistics.median(health), 2), "non_200": sum(c != 200 for c in codes)}


def hammer(url: str, connections: int, stop, results) -> None:
    """The flood, in its own process (its client threads must not share the measuring client's GIL): one key,
    ``connections`` connections each searching ``big`` with ``top_k`` 100 without pause (ignoring Retry-After)
    until ``stop``; every (seconds, status) put on ``results``."""
    loads = []

    def loop():
        hs = requests.Session()
        while not stop.is_set():
            try:
                loads.append(timed(hs, url, BIG_KEY, "big", top_k=100))
            except requests.RequestException:
                loads.append((0.0, 0))          # reset or timed out: counted as status 0
                hs = requests.Session()
    workers = [threading.Thread(target=loop, daemon=True) for _ in range(connections)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(150)
    results.put(loads)


def load(data: Path) -> None:
    """Fill ``data`` once: the large tenant's units and the other tenant's, all in the read index."""
    port = H.free_port()
    proc = serve(data, port, {})
    url, s = f"http://127.0.0.1:{port}", requests.Session()
    try:
        for i in range(ARGS.units):
            s.post(f"{url}/mcp/push", json=big_unit(i, ARGS.mb), headers={"Authorization": f"Bearer {BIG_KEY}"},
                   timeout=120).raise_for_status()
        for i in range(200):
            s.post(f"{url}/mcp/push", json={"type": "tool_output", "source": "orders_v1", "timestamp": int(time.time()),
                                            "content": f"order ORD-{i} shipped status {i}"},
                   headers={"Authorization": f"Bearer {OTHER_KEY}"}, timeout=30).raise_for_status()
        while s.post(f"{url}/mcp/search", json={"query": "zzzz"}, headers={"Authorization": f"Bearer {BIG_KEY}"},
                     timeout=60).json()["freshness"]["index_pending"]:
            time.sleep(1)
    finally:
        H.stop(proc)


def serve(data: Path, port: int, env: dict):
    proc = H.start_gunicorn(SRC, "service:create_app()", port, "large-units.log", str(SRC), CONTEXT_DATA_DIR=str(data),
                            CONTEXT_API_KEYS=";".join(f"{k}:{t}:push+search" for k, t in KEYS.items()), **env)
    H.wait_ready(port)
    return proc


def flood(url: str, connections: int) -> dict:
    """The other tenant measured while the large tenant's key floods with ``connections`` connections."""
    stop, results = mp.Event(), mp.Queue()
    attacker = mp.Process(target=hammer, args=(url, connections, stop, results), daemon=True)
    attacker.start()
    time.sleep(2)
    other = other_p50(url, ARGS.seconds)
    stop.set()
    loads = results.get(timeout=180)
    attacker.join(30)
    ok = [t for t, c in loads if c == 200]
    return {"other": other, "flood": {"n": len(loads), "p50_ok_s": round(statistics.median(ok), 3) if ok else None,
                                      "status": dict(collections.Counter(c for _, c in loads))}}


def cell(data: Path, shares: str) -> dict:
    """One server with CPU shares ``on`` or ``off``: quiet, the large search alone, then each flood."""
    port = H.free_port()
    proc = serve(data, port, SHARES[shares])
    url, s = f"http://127.0.0.1:{port}", requests.Session()
    try:
        for _ in range(20):                 # warm: each worker's views and caches
            timed(s, url, OTHER_KEY, "order shipped")
        out = {"shares": shares, "quiet": other_p50(url, ARGS.seconds / 2)}
        out["large_search_alone_s"] = [round(timed(s, url, BIG_KEY, "big", top_k=100)[0], 3) for _ in range(3)]
        for n in ARGS.connections:
            row = flood(url, n)
            row["other_ratio_to_quiet"] = round(row["other"]["p50_ms"] / out["quiet"]["p50_ms"], 2)
            row["healthz_ratio_to_quiet"] = round(row["other"]["healthz_p50_ms"] / out["quiet"]["healthz_p50_ms"], 2)
            out[f"at_{n}"] = row
            print(f"shares {shares} @{n}: other p50 {out['quiet']['p50_ms']} -> {row['other']['p50_ms']} ms "
                  f"({row['other_ratio_to_quiet']}x), /healthz {out['quiet']['healthz_p50_ms']} -> "
                  f"{row['other']['healthz_p50_ms']} ms ({row['healthz_ratio_to_quiet']}x), other non-200 "
                  f"{row['other']['non_200']}; flood {row['flood']}", flush=True)
            time.sleep(3)                   # the flood's decayed CPU forgotten before the next row
        return out
    finally:
        H.stop(proc)


def main(argv=None) -> None:
    global ARGS, SRC
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--connections", default="16,64", help="the flood's connections, one row each")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shares", default="on,off", help="CPU shares on (default) and off, alternating")
    ap.add_argument("--service-src", default="worktree")
    ap.add_argument("--name", default="large-units")
    ARGS = ap.parse_args(argv)
    ARGS.connections = [int(n) for n in ARGS.connections.split(",")]
    SRC = service_src(ARGS.service_src)
    data = Path(tempfile.mkdtemp(prefix="large-units-", dir=TMP))
    out = {"machine": machine(), "service_rev": service_rev(SRC), "units": ARGS.units, "mb": ARGS.mb,
           "connections": ARGS.connections, "cells": []}
    try:
        load(data)
        for r in range(ARGS.rounds):
            for shares in ARGS.shares.split(","):
                out["cells"].append({"round": r + 1, **cell(data, shares)})
    finally:
        shutil.rmtree(data, ignore_errors=True)
    write_json(ARGS.name, out)


ARGS: argparse.Namespace
SRC: Path

if __name__ == "__main__":
    main()
