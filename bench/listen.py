"""Live context delivery latency: from a push's acknowledgement to the listener's event.

One gunicorn (2 workers) with N listeners open at once (default 100): MCP ``subscriptions/listen``
streams subscribed to unit URIs (and list changes), MCP streams subscribed to search URIs, and plain
``GET /mcp/stream`` streams. Units are pushed one at a time at a fixed rate over keep-alive
connections spread over both workers; every listener knows the worker that holds its stream, and
every push the worker that took it, so cross-worker delivery is reported apart. Latency is measured
on one clock (this process) from the moment the push's 200 arrived to the moment the listener read
the event's last byte. Bounded: about a minute in all (the machine is shared).

    .venv/bin/python bench/listen.py                      # 100 listeners, 300 pushes at 20/s
    .venv/bin/python bench/listen.py --listeners 20 --pushes 60 --name listen-quick
    .venv/bin/python bench/listen.py --pg --name listen-postgresql   # the store on PostgreSQL

With ``--pg`` the service stores on a PostgreSQL primary and standby started for the run
(tools/pg_cluster.py, fsync on): new units reach listeners through the catalog feed and LISTEN/NOTIFY
wake-ups (service/store/postgresql/live.py) instead of SQLite files.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import ROOT, TMP, machine, service_rev, service_src, summary, write_json

# which gunicorn worker holds a connection: the helper the live-context tests use (tests/workers.py)
sys.path.append(str(ROOT / "tests"))
from workers import worker_holding, worker_pids  # noqa: E402

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "bench-listen", "version": "1"}}
WORDS = [f"topic{i:02d}" for i in range(50)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cid_of(content: str, ts: int, source: str) -> str:
    import hashlib
    return hashlib.sha256((content + str(ts) + source).encode()).hexdigest()[:12]


# --- listeners -------------------------------------------------------------------------------------
class Listener(threading.Thread):
    """One open stream; records (key, monotonic time) of every event."""

    def __init__(self, port: int, kind: str, subs: list[str], query: str | None = None):
        super().__init__(daemon=True)
        self.port, self.kind, self.subs, self.query = port, kind, subs, query
        self.events: list[tuple[str, float]] = []
        self.worker: int | None = None
        self.ready = threading.Event()
        self.error: str | None = None
        self.conn: http.client.HTTPConnection | None = None

    def open(self) -> http.client.HTTPResponse:
        for _attempt in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            if self.kind == "stream":
                conn.request("GET", "/mcp/stream?query=" + self.query, headers={"Accept": "text/event-stream"})
            else:
                body = {"jsonrpc": "2.0", "id": f"L{id(self)}", "method": "subscriptions/listen",
                        "params": {"_meta": META, "notifications": {"resourcesListChanged": self.kind == "units",
                                                                    "resourceSubscriptions": self.subs}}}
                conn.request("POST", "/mcp", body=json.dumps(body), headers={
                    "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"})
            rv = conn.getresponse()
            if rv.status == 200:
                self.conn = conn
                return rv
            rv.read()
            conn.close()
            if rv.status not in (429, 503):
                raise RuntimeError(f"listen refused: HTTP {rv.status}")
            time.sleep(0.05)                    # that worker is full: the next connection may land on the other
        raise RuntimeError("no worker accepted the stream")

    def run(self):
        try:
            rv = self.open()
            data = []
            first = True
            while True:
                line = rv.readline()
                if not line:
                    return
                line = line.rstrip(b"\r\n")
                if line.startswith(b"data:"):
                    data.append(line[5:].strip())
                elif line == b"":
                    if not data:
                        if first and self.kind == "stream":
                            first = False
                            self.ready.set()
                        continue
                    now = time.monotonic()
                    msg = json.loads(b"\n".join(data))
                    data = []
                    if self.kind == "stream":
                        self.events.append((msg["cid"], now))
                    elif msg.get("method") == "notifications/subscriptions/acknowledged":
                        self.ready.set()
                    elif msg.get("method") == "notifications/resources/updated":
                        self.events.append((msg["params"]["uri"], now))
                    elif msg.get("method") == "notifications/resources/list_changed":
                        self.events.append(("list", now))
        except Exception as e:  # noqa: BLE001 - reported in the results
            self.error = f"{type(e).__name__}: {e}"
            self.ready.set()

    def close(self):
        if self.conn is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()


def tally(listeners, pushed):
    """What each listener heard, per kind of listener and same/cross worker: latencies from the ack (ms),
    from the push's start, and how many of the expected events arrived."""
    by_kind: dict[str, list[float]] = {"unit_uri": [], "search_uri": [], "stream": []}
    cross: dict[str, list[float]] = {"same_worker": [], "cross_worker": []}
    from_sent: list[float] = []
    expected = received = 0
    for lst in listeners:
        seen: dict[str, float] = {}
        for key, t in lst.events:
            seen.setdefault(key, t)
        if lst.kind == "units":
            for uri in lst.subs:
                cid = uri.rsplit("/", 1)[1]
                if cid not in pushed:
                    continue
                expected += 1
                if uri in seen:
                    received += 1
                    sent, acked, worker, _ = pushed[cid]
                    ms = (seen[uri] - acked) * 1000
                    by_kind["unit_uri"].append(ms)
                    from_sent.append((seen[uri] - sent) * 1000)
                    if worker is not None and lst.worker is not None:
                        cross["same_worker" if worker == lst.worker else "cross_worker"].append(ms)
        elif lst.kind == "search":
            word = lst.subs[0].rsplit("/", 1)[1]
            # the first update after each push of a unit with this word (updates coalesce)
            times = sorted(t for key, t in lst.events if key == lst.subs[0])
            for sent, acked, _worker, w in pushed.values():
                if w != word:
                    continue
                expected += 1
                after = [t for t in times if t >= sent]
                if after:
                    received += 1
                    by_kind["search_uri"].append((after[0] - acked) * 1000)
        else:
            for cid, (_sent, acked, _worker, w) in pushed.items():
                if w != lst.query:
                    continue
                expected += 1
                if cid in seen:
                    received += 1
                    by_kind["stream"].append((seen[cid] - acked) * 1000)
    return by_kind, cross, from_sent, expected, received


def wait_ready(port: int) -> None:
    deadline = time.time() + 60
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.2)


# --- the run ---------------------------------------------------------------------------------------
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listeners", type=int, default=100)
    ap.add_argument("--pushes", type=int, default=300)
    ap.add_argument("--rate", type=float, default=20.0, help="pushes per second")
    ap.add_argument("--subs", type=int, default=10, help="unit-URI listeners subscribed to each pushed unit")
    ap.add_argument("--poll-ms", type=int, default=100, help="CONTEXT_LISTEN_POLL_MS")
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--name", default="listen")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--pg", action="store_true", help="store on PostgreSQL (a primary and a standby started here)")
    args = ap.parse_args(argv)
    rnd = random.Random(args.seed)
    src = service_src(args.service_src)
    data_dir = TMP / f"listen-{os.getpid()}"
    shutil.rmtree(data_dir, ignore_errors=True)
    port = free_port()
    cap = max(args.listeners, 8)
    env = dict(os.environ, CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(data_dir), PYTHONPATH=str(src),
               CONTEXT_WORKERS="2", CONTEXT_THREADS=str(cap + 8), CONTEXT_MAX_STREAMS=str(cap),
               CONTEXT_MAX_LISTENERS_PER_KEY=str(2 * cap), CONTEXT_MAX_LISTENERS_PER_TENANT=str(2 * cap),
               CONTEXT_STREAM_SHARE=str(cap),
               CONTEXT_LISTEN_POLL_MS=str(args.poll_ms), CONTEXT_RATE_LIMIT="off", CONTEXT_ACCESS_LOG="0")
    cluster = None
    if args.pg:
        from servers import pg_cluster
        cluster = pg_cluster(TMP / "listen-pg")
        env.update(CONTEXT_STORE=cluster.primary_url, CONTEXT_STORE_REPLICA=cluster.standby_url)
    TMP.mkdir(parents=True, exist_ok=True)
    log = open(TMP / f"{args.name}-server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "-c", "service/gunicorn_conf.py",
                             "service:create_app()"], cwd=src, env=env, stdout=log, stderr=log, start_new_session=True)
    listeners: list[Listener] = []
    try:
        wait_ready(port)
        workers = worker_pids(proc.pid)

        # Units to push, known in advance: listeners subscribe to their URIs before they exist.
        ts = int(time.time())
        units = []
        for i in range(args.pushes):
            word = WORDS[i % len(WORDS)]
            content = f"bench unit {i} about {word} and more words"
            units.append({"type": "tool_output", "source": "bench_listen_v1", "timestamp": ts, "ttl": 3600,
                          "content": content, "cid": cid_of(content, ts, "bench_listen_v1"), "word": word})
        n_search = max(1, args.listeners * 15 // 100)
        n_stream = max(1, args.listeners * 15 // 100)
        n_units = args.listeners - n_search - n_stream
        subs: list[list[str]] = [[] for _ in range(n_units)]
        for u in units:
            for j in rnd.sample(range(n_units), min(args.subs, n_units)):
                subs[j].append(f"context://units/{u['cid']}")
        for j in range(n_units):
            listeners.append(Listener(port, "units", subs[j][:100]))
        for j in range(n_search):
            listeners.append(Listener(port, "search", [f"context://search/{WORDS[j % len(WORDS)]}"]))
        for j in range(n_stream):
            listeners.append(Listener(port, "stream", [], query=WORDS[j % len(WORDS)]))
        t_open = time.monotonic()
        for lst in listeners:
            lst.start()
        for lst in listeners:
            lst.ready.wait(30)
        open_s = time.monotonic() - t_open
        errors = [lst.error for lst in listeners if lst.error]
        if errors:
            raise RuntimeError(f"{len(errors)} listeners failed: {errors[:3]}")
        for lst in listeners:
            lst.worker = worker_holding(lst.conn.sock, workers)

        # Pushers: keep-alive connections, half per worker where the kernel allows.
        conns = []
        for _ in range(8):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.connect()
            conns.append((c, worker_holding(c.sock, workers)))
        pushed: dict[str, tuple[float, float, int | None, str]] = {}    # cid -> (sent, acked, worker, word)
        interval = 1 / args.rate
        start = time.monotonic()
        for i, u in enumerate(units):
            target = start + i * interval
            time.sleep(max(0.0, target - time.monotonic()))
            c, worker = conns[i % len(conns)]
            body = {k: v for k, v in u.items() if k != "word"}
            sent = time.monotonic()
            c.request("POST", "/mcp/push", body=json.dumps(body), headers={"Content-Type": "application/json"})
            rv = c.getresponse()
            rv.read()
            acked = time.monotonic()
            if rv.status == 200:
                pushed[u["cid"]] = (sent, acked, worker, u["word"])
        time.sleep(3.0)                          # let the last events arrive

        by_kind, cross, from_sent, expected, received = tally(listeners, pushed)
        all_ms = [x for v in by_kind.values() for x in v]
        out = {
            "name": args.name, "service_rev": service_rev(src), "machine": machine(),
            "config": {"listeners": args.listeners, "mcp_unit_listeners": n_units, "mcp_search_listeners": n_search,
                       "stream_listeners": n_stream, "pushes": args.pushes, "rate_per_s": args.rate,
                       "subscribers_per_unit": args.subs, "workers": 2, "threads": cap + 8,
                       "listen_poll_ms": args.poll_ms, "store": "postgresql" if args.pg else "sqlite"},
            "listeners_per_worker": {str(w): sum(1 for lst in listeners if lst.worker == w) for w in workers},
            "open_all_s": round(open_s, 3),
            "delivered": {"expected": expected, "received": received},
            "latency_from_ack": {"all": summary(all_ms), **{k: summary(v) for k, v in by_kind.items()},
                                 **{k: summary(v) for k, v in cross.items()}},
            "unit_uri_latency_from_push_start": summary(from_sent),
        }
        write_json(args.name, out)
        lat = out["latency_from_ack"]
        print(f"{args.listeners} listeners ({out['listeners_per_worker']} per worker), {len(pushed)} pushes at "
              f"{args.rate}/s; delivered {received}/{expected}")
        for k in ("all", "unit_uri", "cross_worker", "same_worker", "search_uri", "stream"):
            s = lat[k]
            print(f"  {k:13s} n={s['n']:5d}  p50 {s['p50_ms']} ms  p99 {s['p99_ms']} ms  max {s['max_ms']} ms")
    finally:
        for lst in listeners:
            lst.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(data_dir, ignore_errors=True)
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
