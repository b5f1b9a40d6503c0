"""Slow readers of large answers against gunicorn reached directly, as `make run` serves it (issue 39, finding 2):
does the other tenant keep its /healthz, searches and pushes?

For each build (``--before`` and the code under test, alternating round by round), a fresh gunicorn with the
defaults of `make run` (2 workers x 8 threads, the slow-client guard, no nginx) and keys for two tenants:
``alpha`` holds ``--units`` units of 1 MB, ``beta`` a few hundred small ones. Then, for ``--quiet`` seconds,
beta's probes alone: /healthz, a search and a push, each in its own loop with a 10 s timeout; then for
``--attack`` seconds the same probes while alpha's search key opens 16 sockets reading /mcp/export at
20 KiB/s (above CONTEXT_MIN_SEND_RATE, so the guard lets them be) and 4 reading a top_k=100 search the same
way, each reopened a second after it ends or is refused. Reported per build and phase: beta's p50/p95 and
timeouts, the attack phase's p50 over the quiet one's, every 5xx, what the slow readers got, and the size of
one top_k=100 search answer.

    .venv/bin/python bench/large_answers.py                  # before = 14e547d, this worktree's HEAD after
    .venv/bin/python bench/large_answers.py --rounds 2 --attack 40
    .venv/bin/python bench/large_answers.py --cap --exports 64 --path '/mcp/units?limit=7' --name slow-readers-cap

``--cap``: one build, the slow readers' cap (CONTEXT_SLOW_READER_BYTES, _KEY_BYTES) as shipped against turned
off, alternating; each run also reports the peak of what the workers held for the readers (the unlinked
temporary files of answers spooled past memory, and their RSS).

Writes bench/results/large-answers.json. Loopback only, bounded in time and count.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from common import TMP, machine, service_rev, service_src, summary, write_json

ALPHA, BETA = "bench-alpha-search-0123456789ab", "bench-beta-key-0123456789abcdef"
ALPHA_PUSH = "bench-alpha-push-0123456789abcd"
ALPHA_ADMIN = "bench-alpha-admin-0123456789abc"          # bench/registry_load.py's
KEYS = {"keys": [{"key": ALPHA, "tenant": "alpha", "scopes": ["search"]},
                 {"key": ALPHA_PUSH, "tenant": "alpha", "scopes": ["push"]},
                 {"key": ALPHA_ADMIN, "tenant": "alpha", "scopes": ["admin"]},
                 {"key": BETA, "tenant": "beta", "scopes": ["push", "search"]}]}
FILLER = "the quick brown fox jumps over the lazy dog while 快速的狐狸 watches the parcel ship "
MB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unit(content: str, source: str) -> dict:
    return {"type": "tool_output", "source": source, "timestamp": int(time.time()), "ttl": 86_400,
            "content": content}


def start(src: Path, name: str, extra_env: dict | None = None) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    data = TMP / f"large-answers-{os.getpid()}-{name}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    (data.parent / f"{data.name}-keys.json").write_text(json.dumps(KEYS))
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(data), PYTHONPATH=str(src),
               CONTEXT_API_KEYS_FILE=str(data.parent / f"{data.name}-keys.json"), CONTEXT_ACCESS_LOG="0",
               CONTEXT_RATE_LIMIT="off", **(extra_env or {}))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = open(TMP / f"large-answers-{name}.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", "service/gunicorn_conf.py",
                             "service:create_app()"], cwd=src, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if requests.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url, data
        except requests.RequestException:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"server did not start (see {log.name})")
        time.sleep(0.2)


def stop(proc: subprocess.Popen, data: Path) -> None:
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=10)
    shutil.rmtree(data, ignore_errors=True)


def load(url: str, units: int) -> None:
    body = (FILLER * (MB // len(FILLER.encode()) + 1)).encode()[:MB - 64].decode("utf-8", "ignore")
    auth = {"Authorization": f"Bearer {ALPHA_PUSH}"}
    for first in range(0, units, 10):
        batch = [unit(f"big {i} {body}", f"big_v{i}") for i in range(first, min(units, first + 10))]
        requests.post(url + "/mcp/push", json=batch, headers=auth, timeout=300).raise_for_status()
    small = [unit(f"order ORD-{i} shipped by carrier {i % 7}, 订单 {i} 已发货", "orders_v1") for i in range(300)]
    requests.post(url + "/mcp/push", json=small, headers={"Authorization": f"Bearer {BETA}"}, timeout=60).raise_for_status()
    deadline = time.monotonic() + 900                # until the read index holds every unit of both tenants
    while time.monotonic() < deadline:
        behind = 0
        for key in (ALPHA, BETA):
            stats = requests.get(url + "/mcp/stats", headers={"Authorization": f"Bearer {key}"}, timeout=60).json()
            behind += stats["index_pending"] + (stats["read_index"].get("pending") or 0)
            behind += 0 if stats["read_index"].get("in_use") else 1
        if not behind:
            return
        time.sleep(2)
    raise RuntimeError("the units were not indexed in time")


class Probes:
    """Beta's /healthz, search and push, each in its own loop; latencies, timeouts and statuses per phase."""

    def __init__(self, url: str):
        self.url, self.phase, self.stopping = url, "quiet", False
        self.seen: dict = {}
        self.threads = [threading.Thread(target=self._loop, args=(name,), daemon=True)
                        for name in ("healthz", "search", "push")]

    def _call(self, name: str, i: int) -> requests.Response:
        auth = {"Authorization": f"Bearer {BETA}"}
        if name == "healthz":
            return requests.get(self.url + "/healthz", timeout=10)
        if name == "search":
            return requests.post(self.url + "/mcp/search", json={"query": f"ORD-{i % 300} shipped", "top_k": 5},
                                 headers=auth, timeout=10)
        return requests.post(self.url + "/mcp/push", json=unit(f"probe {i} {time.time()}", "probe_v1"), headers=auth,
                             timeout=10)

    def _loop(self, name: str) -> None:
        i = 0
        while not self.stopping:
            phase = self.phase
            row = self.seen.setdefault((phase, name), {"ms": [], "timeouts": 0, "statuses": {}})
            started = time.perf_counter()
            try:
                rv = self._call(name, i)
                row["ms"].append((time.perf_counter() - started) * 1000)
                row["statuses"][str(rv.status_code)] = row["statuses"].get(str(rv.status_code), 0) + 1
            except requests.RequestException:
                row["timeouts"] += 1
            i += 1
            time.sleep(0.2)

    def report(self) -> dict:
        out = {}
        for (phase, name), row in self.seen.items():
            out.setdefault(phase, {})[name] = {**summary(row["ms"]), "timeouts": row["timeouts"],
                                               "statuses": row["statuses"]}
        for name in ("healthz", "search", "push"):
            quiet, attack = out.get("quiet", {}).get(name, {}), out.get("attack", {}).get(name, {})
            if quiet.get("p50_ms") and attack.get("p50_ms"):
                out.setdefault("attack_over_quiet_p50", {})[name] = round(attack["p50_ms"] / quiet["p50_ms"], 2)
        return out


class SlowReader(threading.Thread):
    """One socket reading an answer at ``rate`` bytes/s, reopened a second after it ends or is refused."""

    def __init__(self, port: int, request: bytes, rate: int, until: float, tally: dict):
        super().__init__(daemon=True)
        self.port, self.request, self.rate, self.until, self.tally = port, request, rate, until, tally

    def run(self) -> None:
        while time.monotonic() < self.until:
            status = self._one()
            self.tally[status] = self.tally.get(status, 0) + 1
            time.sleep(1.0)

    def _one(self) -> str:
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", self.port))
            sock.sendall(self.request)
            first = sock.recv(2048)
            status = first.split(b" ", 2)[1].decode() if first.startswith(b"HTTP/") else "?"
            while time.monotonic() < self.until:
                piece = sock.recv(2048)
                if not piece:
                    break
                time.sleep(len(piece) / self.rate)
            sock.close()
            return status
        except OSError as e:
            return type(e).__name__


class Held(threading.Thread):
    """What the workers keep for their slow readers, every 0.5 s: the bytes of the unlinked temporary files each
    holds open (answers spooled past memory, issue 50 M3) and its RSS; the peaks of each and of their sum."""

    def __init__(self, root_pid: int):
        super().__init__(daemon=True)
        self.root_pid, self.stopping = root_pid, False
        self.peak = {"spooled_mb_total": 0.0, "spooled_mb_worker": 0.0, "rss_mb_worker": 0.0}

    def run(self) -> None:
        import psutil
        while not self.stopping:
            try:
                workers = psutil.Process(self.root_pid).children(recursive=True)
            except psutil.Error:
                return
            total = 0
            for w in workers:
                spooled = 0
                try:
                    for fd in os.listdir(f"/proc/{w.pid}/fd"):
                        path = f"/proc/{w.pid}/fd/{fd}"
                        if os.readlink(path).endswith("(deleted)"):
                            spooled += os.stat(path).st_size
                    rss = w.memory_info().rss
                except (OSError, psutil.Error):
                    continue
                total += spooled
                self.peak["spooled_mb_worker"] = max(self.peak["spooled_mb_worker"], round(spooled / MB, 1))
                self.peak["rss_mb_worker"] = max(self.peak["rss_mb_worker"], round(rss / MB, 1))
            self.peak["spooled_mb_total"] = max(self.peak["spooled_mb_total"], round(total / MB, 1))
            time.sleep(0.5)


def attack(port: int, seconds: float, tally: dict, exports: int = 16, path: str = "/mcp/export") -> list:
    until = time.monotonic() + seconds
    head = f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {ALPHA}\r\n"
    export = f"GET {path} HTTP/1.1\r\n{head}\r\n".encode()
    body = json.dumps({"query": "big", "top_k": 100}).encode()
    search = (f"POST /mcp/search HTTP/1.1\r\n{head}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
              ).encode() + body
    readers = [SlowReader(port, export, 20 * 1024, until, tally.setdefault("export", {})) for _ in range(exports)]
    readers += [SlowReader(port, search, 20 * 1024, until, tally.setdefault("search_top_k_100", {})) for _ in range(4)]
    for r in readers:
        r.start()
    return readers


def one_build(src: Path, name: str, units: int, quiet: float, seconds: float, extra_env: dict | None = None,
              exports: int = 16, path: str = "/mcp/export") -> dict:
    proc, url, data = start(src, name, extra_env)
    try:
        load(url, units)
        rv = requests.post(url + "/mcp/search", json={"query": "big", "top_k": 100},
                           headers={"Authorization": f"Bearer {ALPHA}"}, timeout=300)
        answer = {"status": rv.status_code, "bytes": len(rv.content), "results": len(rv.json().get("results", []))}
        probes = Probes(url)
        for t in probes.threads:
            t.start()
        time.sleep(quiet)
        tally: dict = {}
        probes.phase = "attack"
        held = Held(proc.pid)
        held.start()
        readers = attack(int(url.rsplit(":", 1)[1]), seconds, tally, exports, path)
        for r in readers:
            r.join(timeout=seconds + 60)
        held.stopping = True
        probes.stopping = True
        for t in probes.threads:
            t.join(timeout=15)
        return {"build": name, "service": service_rev(src), "env": extra_env or {}, "top_k_100_search": answer,
                "probes": probes.report(), "slow_readers": tally, "held": held.peak}
    finally:
        stop(proc, data)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="14e547d")
    ap.add_argument("--after", default="worktree")
    ap.add_argument("--units", type=int, default=40, help="alpha's units of 1 MB")
    ap.add_argument("--quiet", type=float, default=15.0)
    ap.add_argument("--attack", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--exports", type=int, default=16, help="slow readers of /mcp/export (one key)")
    ap.add_argument("--cap", action="store_true", help="instead of two builds: the code under test with the slow "
                    "readers' cap (issue 50 M3) as shipped and turned off, alternating")
    ap.add_argument("--path", default="/mcp/export", help="what the slow readers read (M3: /mcp/units?limit=7, "
                    "pages of 7 MB, under the large-answer bound, which the worker's poller writes)")
    ap.add_argument("--name", default="large-answers")
    args = ap.parse_args(argv)
    if args.cap:
        after = service_src(args.after)
        off = {"CONTEXT_SLOW_READER_BYTES": "0", "CONTEXT_SLOW_READER_KEY_BYTES": "0"}
        builds = {"cap": (after, None), "no cap": (after, off)}
    else:
        builds = {"before": (service_src(args.before), None), "after": (service_src(args.after), None)}
    runs = []
    for _ in range(args.rounds):
        for name, (src, env) in builds.items():
            row = one_build(src, name, args.units, args.quiet, args.attack, env, args.exports, args.path)
            print(json.dumps(row), flush=True)
            runs.append(row)
    write_json(args.name, {"machine": machine(), "units_mb": args.units, "quiet_s": args.quiet,
                           "attack_s": args.attack, "exports": args.exports, "path": args.path, "runs": runs})


if __name__ == "__main__":
    main()
