"""Default searches over large units, and what they cost another tenant (issue 39, finding 3).

One tenant holds 100 units of about 1 MB, each holding the word ``big`` (a fetched page, a log); another holds
ordinary units. Through HTTP on one gunicorn (2 workers, as ``make run`` serves), loopback only, bounded in time:

- the large tenant's default search for ``big`` alone, timed (it was 14.6-35.7 s when rescoring split every
  candidate's stored tokens);
- the other tenant's search p50, quiet, and while 8 threads of the large tenant's key search ``big`` over and
  over (the target: within 2x of quiet).

    .venv/bin/python bench/large_units.py [--units 100] [--mb 1] [--seconds 20] [--name large-units]
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


def big_unit(i: int, mb: float) -> dict:
    words = " ".join(f"w{j % 5000}x{i}" for j in range(int(mb * 1024 * 1024 / 10)))
    return {"type": "tool_output", "source": "fetch_v1", "content": f"big page {i} {words} big",
            "timestamp": int(time.time()) - 60, "ttl": 86_400}


def timed(session: requests.Session, url: str, key: str, query: str) -> tuple[float, int]:
    t = time.perf_counter()
    rv = session.post(f"{url}/mcp/search", json={"query": query, "top_k": 10},
                      headers={"Authorization": f"Bearer {key}"}, timeout=120)
    return time.perf_counter() - t, rv.status_code


def other_p50(url: str, seconds: float) -> dict:
    """The other tenant's search p50 (and /healthz's, asked between them) over ``seconds``."""
    s = requests.Session()
    times, codes, health = [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        took, code = timed(s, url, "other-units-key-0123456789", "order shipped")
        times.append(took * 1000)
        codes.append(code)
        t = time.perf_counter()
        codes.append(s.get(f"{url}/healthz", timeout=60).status_code)
        health.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
    return {"p50_ms": round(statistics.median(times), 2), "n": len(times),
            "healthz_p50_ms": round(statistics.median(health), 2), "non_200": sum(c != 200 for c in codes)}


def hammer(url: str, key: str, threads: int, stop, results) -> None:
    """The flood, in its own process (its client threads must not share the measuring client's GIL): ``threads``
    threads searching ``big`` without pause until ``stop``; every (seconds, status) put on ``results``."""
    loads = []

    def loop():
        hs = requests.Session()
        while not stop.is_set():
            loads.append(timed(hs, url, key, "big"))
    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(150)
    results.put(loads)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--service-src", default="worktree")
    ap.add_argument("--name", default="large-units")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    data = Path(tempfile.mkdtemp(prefix="large-units-", dir=TMP))
    port = H.free_port()
    proc = H.start_gunicorn(src, "service:create_app()", port, "large-units.log", str(src), CONTEXT_DATA_DIR=str(data),
                            CONTEXT_API_KEYS=";".join(f"{k}:{t}:push+search" for k, t in KEYS.items()))
    url = f"http://127.0.0.1:{port}"
    out = {"machine": machine(), "service_rev": service_rev(src), "units": a.units, "mb": a.mb}
    try:
        H.wait_ready(port)
        s = requests.Session()
        big_key, other_key = list(KEYS)
        for i in range(a.units):
            rv = s.post(f"{url}/mcp/push", json=big_unit(i, a.mb), headers={"Authorization": f"Bearer {big_key}"},
                        timeout=120)
            rv.raise_for_status()
        for i in range(200):
            s.post(f"{url}/mcp/push", json={"type": "tool_output", "source": "orders_v1", "timestamp": int(time.time()),
                                            "content": f"order ORD-{i} shipped status {i}"},
                   headers={"Authorization": f"Bearer {other_key}"}, timeout=30).raise_for_status()
        # every unit in the read index before anything is timed
        while s.post(f"{url}/mcp/search", json={"query": "zzzz"}, headers={"Authorization": f"Bearer {big_key}"},
                     timeout=60).json()["freshness"]["index_pending"]:
            time.sleep(1)
        out["other_quiet"] = other_p50(url, a.seconds / 2)
        alone = [timed(s, url, big_key, "big") for _ in range(5)]
        out["large_search_alone_s"] = [round(t, 3) for t, _ in alone]
        out["large_search_alone_status"] = [c for _, c in alone]
        stop = mp.Event()
        results = mp.Queue()
        flood = mp.Process(target=hammer, args=(url, big_key, a.threads, stop, results), daemon=True)
        flood.start()
        time.sleep(1)
        out["other_under_load"] = other_p50(url, a.seconds)
        stop.set()
        loads = results.get(timeout=180)
        flood.join(30)
        out["large_searches_under_load"] = {"n": len(loads), "p50_s": round(statistics.median(t for t, _ in loads), 3)
                                            if loads else None,
                                            "status": dict(collections.Counter(c for _, c in loads))}
        out["other_ratio_to_quiet"] = round(out["other_under_load"]["p50_ms"] / out["other_quiet"]["p50_ms"], 2)
        out["healthz_ratio_to_quiet"] = round(out["other_under_load"]["healthz_p50_ms"]
                                              / out["other_quiet"]["healthz_p50_ms"], 2)
        print(f"large search alone: {out['large_search_alone_s']} s; other tenant p50 quiet "
              f"{out['other_quiet']['p50_ms']} ms, under load {out['other_under_load']['p50_ms']} ms "
              f"({out['other_ratio_to_quiet']}x); /healthz {out['other_quiet']['healthz_p50_ms']} -> "
              f"{out['other_under_load']['healthz_p50_ms']} ms ({out['healthz_ratio_to_quiet']}x); flood "
              f"{out['large_searches_under_load']}", flush=True)
    finally:
        H.stop(proc)
        shutil.rmtree(data, ignore_errors=True)
    write_json(a.name, out)


if __name__ == "__main__":
    main()
