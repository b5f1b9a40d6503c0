"""Soak (issue 7): mixed push/search load against gunicorn for SOAK_SECONDS (default 600).

Run with `make soak` (SOAK_SECONDS=120 for a quick look). Reports errors (must be 0), latency
percentiles per time bucket (drift), the RSS of every gunicorn process over time (must be flat
after warm-up), and writes bench/results/soak.json and bench/results/soak.png.
"""
from __future__ import annotations

import json
import os
import platform
import random
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import ROOT, LiveServer

psutil = pytest.importorskip("psutil")

SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
PUSHERS, SEARCHERS = 2, 4
PUSH_THINK_S, SEARCH_THINK_S = 0.03, 0.01   # per request: two shared cores loaded, not saturated
RSS_GROWTH_MB = 64         # generous: per process, median of the last fifth vs end of warm-up
RESULTS = ROOT / "bench" / "results"
WORDS = ("order", "shipped", "invoice", "refund", "latency", "timeout", "deploy", "rollback", "cache",
         "订单", "发货", "退款", "延迟", "部署", "缓存", "用户", "搜索", "ORD-7890", "snake_case_id", "token")
TYPES = ("user_input", "model_thinking", "tool_output", "system_notice")
pytestmark = pytest.mark.soak


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 2)


class Soak:
    def __init__(self, url: str, seconds: float):
        self.url, self.seconds = url, seconds
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.samples: list[tuple[float, str, float]] = []   # (t, op, ms)
        self.errors: list[str] = []
        self.acked: list[tuple[str, str]] = []              # (cid, token)
        self.n = 0
        self.growth: list[tuple[float, int]] = []         # (t, units pushed so far)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, op: str, start: float, ok: bool, what: str = "") -> None:
        ms = (time.monotonic() - start) * 1000
        with self.lock:
            self.samples.append((self.now(), op, ms))
            if not ok:
                self.errors.append(f"{self.now():.1f}s {op}: {what[:200]}")

    def unit(self, rng: random.Random) -> dict:
        with self.lock:
            self.n += 1
            n = self.n
        token = f"soak{n:07d}t"
        now = int(time.time())
        ts = now - rng.choice((0, 0, 0, 86_400, 2 * 86_400))
        # One in ten lives 30-90 s, so the janitor purges all along (steady state, not only growth).
        ttl = (now - ts) + rng.randint(30, 90) if rng.random() < 0.1 else 7 * 86_400
        return {"type": rng.choice(TYPES), "source": f"soak_v1_{rng.randrange(8)}", "timestamp": ts, "ttl": ttl,
                "content": f"{token} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60))),
                "metadata": {"n": n, "token": token}}

    def session(self, s: requests.Session | None, k: int) -> requests.Session:
        """A fresh keep-alive connection every 100 requests, so both workers get a share of the load."""
        if s is None or k % 100 == 0:
            if s is not None:
                s.close()
            s = requests.Session()
        return s

    def pusher(self, seed: int) -> None:
        rng, s, k = random.Random(seed), None, 0
        while not self.stop.is_set():
            s, k = self.session(s, k), k + 1
            batch = [self.unit(rng) for _ in range(1 if rng.random() < 0.8 else 10)]
            start = time.monotonic()
            try:
                rv = s.post(self.url + "/mcp/push", json=batch if len(batch) > 1 else batch[0], timeout=30)
                ok = rv.status_code == 200
                results = (rv.json()["results"] if len(batch) > 1 else [rv.json()]) if ok else []
                ok = ok and all(r.get("status") in ("ok", "duplicate") for r in results)
                self.record("push", start, ok, rv.text)
                if ok:
                    with self.lock:
                        self.growth.append((round(self.now(), 1), self.n))
                        # Only long-lived units are read back later; short ones may be purged by then.
                        self.acked.extend((r["cid"], u["metadata"]["token"]) for r, u in zip(results, batch)
                                          if u["timestamp"] + u["ttl"] > time.time() + 3600)
            except requests.RequestException as e:
                self.record("push", start, False, repr(e))
            time.sleep(PUSH_THINK_S)

    def searcher(self, seed: int) -> None:
        rng, s, k = random.Random(seed), None, 0
        while not self.stop.is_set():
            s, k = self.session(s, k), k + 1
            r = rng.random()
            start = time.monotonic()
            try:
                if r < 0.7:
                    q = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
                    rv = s.post(self.url + "/mcp/search", json={"query": q, "top_k": 10}, timeout=30)
                    self.record("search", start, rv.status_code == 200, rv.text)
                elif r < 0.85 and self.acked:
                    cid, token = rng.choice(self.acked[-500:])
                    rv = s.post(self.url + "/mcp/search", json={"query": token, "consistency": "strong"}, timeout=30)
                    ok = rv.status_code == 200 and cid in [x["cid"] for x in rv.json()["results"]]
                    self.record("search_strong", start, ok, f"read-your-writes miss {cid}: {rv.text}")
                elif self.acked:
                    cid, _ = rng.choice(self.acked)
                    rv = s.get(f"{self.url}/mcp/units/{cid}", timeout=30)
                    self.record("get", start, rv.status_code == 200, f"{cid}: {rv.text}")
            except requests.RequestException as e:
                self.record("search", start, False, repr(e))
            time.sleep(SEARCH_THINK_S)


def rss_sampler(master: int, soak: Soak, series: dict, pids_seen: set, interval: float) -> None:
    while not soak.stop.is_set():
        try:
            procs = [psutil.Process(master)] + psutil.Process(master).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        t = round(soak.now(), 1)
        for p in procs:
            try:
                series.setdefault(str(p.pid), []).append((t, round(p.memory_info().rss / 2**20, 1)))
                pids_seen.add(p.pid)
            except psutil.NoSuchProcess:
                pass
        soak.stop.wait(interval)


def buckets(samples, growth, seconds: float, size: float) -> list[dict]:
    out = []
    for b in range(max(1, round(seconds / size))):   # a short remainder joins the last bucket
        lo = b * size
        hi = (b + 1) * size if (b + 1) * size + size / 2 <= seconds else seconds + 1
        row = {"t_start_s": lo, "t_end_s": round(min(hi, seconds), 1),
               "units_pushed_by_end": max([n for t, n in growth if t < hi], default=0)}
        span = max(1e-9, min(hi, seconds) - lo)
        for op in ("push", "search", "search_strong", "get"):
            ms = [m for t, o, m in samples if o == op and lo <= t < hi]
            row[op] = {"n": len(ms), "rps": round(len(ms) / span, 1), "p50_ms": pct(ms, 0.5),
                       "p95_ms": pct(ms, 0.95), "p99_ms": pct(ms, 0.99), "max_ms": pct(ms, 1.0)}
        out.append(row)
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 11), sharex=True)
    mids = [(b["t_start_s"] + b["t_end_s"]) / 2 for b in report["buckets"]]
    for op, color in (("push", "tab:blue"), ("search", "tab:green"), ("search_strong", "tab:orange"),
                      ("get", "tab:purple")):
        ax1.plot(mids, [b[op]["p50_ms"] for b in report["buckets"]], "-o", color=color, label=f"{op} p50")
        ax1.plot(mids, [b[op]["p99_ms"] for b in report["buckets"]], "--", color=color, label=f"{op} p99")
        ax2.plot(mids, [b[op]["rps"] for b in report["buckets"]], "-o", color=color, label=op)
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7, ncol=4)
    ax1.set_title(f"Soak: {report['seconds']:.0f} s, {report['requests']} requests, {report['errors']} errors, "
                  f"{report['acked_units']} units pushed")
    ax2.set_ylabel("requests/s")
    ax2.legend(fontsize=7)
    for pid, pts in report["rss_mb"].items():
        ax3.plot([t for t, _ in pts], [m for _, m in pts], label=f"{report['roles'].get(pid, '?')} {pid}")
    ax3.axvline(report["warmup_s"], color="grey", linestyle=":", label="end of warm-up")
    ax3.set_ylabel("RSS (MiB)")
    ax3.set_xlabel("time (s)")
    ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@pytest.mark.timeout(SECONDS + 600)   # pytest.ini_options sets --timeout=600 for everything else
def test_soak_mixed_load(tmp_path):
    seconds = SECONDS
    warmup = min(60.0, seconds * 0.2)
    bucket = 60.0 if seconds >= 300 else max(10.0, seconds / 8)
    server = LiveServer(tmp_path / "data", workers=2, env={"CONTEXT_JANITOR_INTERVAL_S": "10"})
    server.start(timeout=120)
    try:
        soak = Soak(server.url, seconds)
        rss: dict[str, list] = {}
        pids: set[int] = set()
        master = server.proc.pid
        threads = [threading.Thread(target=soak.pusher, args=(i,), daemon=True) for i in range(PUSHERS)]
        threads += [threading.Thread(target=soak.searcher, args=(100 + i,), daemon=True) for i in range(SEARCHERS)]
        threads.append(threading.Thread(target=rss_sampler, args=(master, soak, rss, pids, 2.0), daemon=True))
        for t in threads:
            t.start()
        while soak.now() < seconds:
            time.sleep(0.5)
        soak.stop.set()
        for t in threads:
            t.join(timeout=60)
        elapsed = soak.now()

        # After the load: a sample of acked units still reads back, and /readyz drains.
        s = requests.Session()
        for cid, _ in random.Random(1).sample(soak.acked, min(300, len(soak.acked))):
            rv = s.get(f"{server.url}/mcp/units/{cid}", timeout=30)
            if rv.status_code != 200:
                soak.errors.append(f"after soak: GET {cid} -> {rv.status_code}")
        ready = s.get(server.url + "/readyz", timeout=30).json()
    finally:
        server.stop()

    roles = {str(master): "master"}
    roles.update({pid: "worker" for pid in rss if pid != str(master)})
    growth = {}
    for pid, pts in rss.items():
        base = [m for t, m in pts if warmup - 10 <= t <= warmup + 10] or [pts[0][1]]
        tail = [m for t, m in pts if t >= seconds * 0.8]
        if tail:
            growth[pid] = round(pct(tail, 0.5) - pct(base, 0.5), 1)
    report = {
        "seconds": round(elapsed, 1), "warmup_s": warmup, "bucket_s": bucket, "pushers": PUSHERS,
        "searchers": SEARCHERS, "think_ms": {"push": PUSH_THINK_S * 1000, "search": SEARCH_THINK_S * 1000}, "requests": len(soak.samples),
        "errors": len(soak.errors), "error_samples": soak.errors[:20], "acked_units": soak.n,
        "buckets": buckets(soak.samples, soak.growth, elapsed, bucket), "rss_mb": rss, "roles": roles,
        "rss_growth_after_warmup_mb": growth, "rss_growth_bound_mb": RSS_GROWTH_MB,
        "processes_seen": len(pids), "readyz_after": ready,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_at_end": os.getloadavg()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, RESULTS / "soak.png")

    print(f"\nsoak {elapsed:.0f} s: {report['requests']} requests, {report['errors']} errors, "
          f"{soak.n} units pushed; RSS growth after warm-up (MiB): {growth}")
    for b in report["buckets"]:
        print(f"  {b['t_start_s']:>5.0f}-{b['t_end_s']:<5.0f}s {b['units_pushed_by_end']:>7} units " + "  ".join(
            f"{op} {b[op]['rps']}/s p50 {b[op]['p50_ms']} p99 {b[op]['p99_ms']}"
            for op in ("push", "search", "search_strong", "get")))
    assert not soak.errors, soak.errors[:10]
    # No worker was killed and replaced (a timeout or a crash would show up as a new pid).
    assert len(pids) == 3, f"gunicorn processes seen: {sorted(pids)}"
    assert all(g < RSS_GROWTH_MB for g in growth.values()), f"RSS grew after warm-up: {growth} MiB"
