"""Slow or stalled clients hold no gunicorn worker thread, in either direction (issues 7 and 25).

Every attack runs for real: raw sockets against a real gunicorn with one worker of 4 threads (so a
dozen slow sockets would hold them all without service/guard/), and again through the compose
file's proxy (tools/nginx/nginx.conf, Debian's nginx) in front of it. Meanwhile /healthz and another
tenant's pushes keep answering within a few seconds, and the slow sockets are answered (408, 401) or
dropped. Each attack uses at most 24 sockets for at most ~20 s.
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest
import requests

from conftest import LiveServer, make_unit
from nginx_support import NGINX, NO_NGINX, Nginx

KEY = "acme-slow-client-0123456789"          # the slow clients have a valid key (a tenant's own client)
OTHER = "beta-other-tenant-0123456789"       # another tenant, who must not notice
KEYS = {KEY: ("acme", ("push", "search")), OTHER: ("beta", ("push", "search"))}
GRACE_S, DEADLINE_S = 2, 6
ANSWERS_WITHIN_S = 3.0                       # "keeps answering": each probe (healthz + a push) under this
HOST = b"Host: 127.0.0.1\r\n"


def auth(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One worker, 4 threads, tight bounds; tenant acme holds ~1.6 MB of units to list and export."""
    srv = LiveServer(tmp_path_factory.mktemp("slow-clients") / "data", workers=1, keys=KEYS, env={
        "CONTEXT_THREADS": "4", "CONTEXT_SLOW_CLIENT_GRACE_S": str(GRACE_S),
        "CONTEXT_REQUEST_DEADLINE_S": str(DEADLINE_S), "CONTEXT_LISTEN_HEARTBEAT_S": "1"})
    try:
        srv.start()
        units = [make_unit(f"unit {i} " + "lorem ipsum " * 700, ttl=86_400) for i in range(200)]
        rv = requests.post(srv.url + "/mcp/push", json=units, headers=auth(KEY), timeout=60)  # 1.7 MB, spooled
        assert rv.status_code == 200 and all(r["status"] == "ok" for r in rv.json()["results"]), rv.text[:300]
        yield srv
    finally:
        srv.stop()


class Raw:
    """One raw client socket and what it received (``ended``: when it met end-of-file or a reset)."""

    def __init__(self, port: int, rcvbuf: int | None = None):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.data = b""
        self.ended: float | None = None

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass          # the server closed it: what it answered is in ``data`` once read

    def read(self, size: int = 65536, wait: float = 0.05) -> int:
        """Read once (waiting up to ``wait``); how much arrived."""
        if self.ended:
            return 0
        self.sock.settimeout(wait)
        try:
            got = self.sock.recv(size)
        except socket.timeout:
            return 0
        except OSError:
            got = b""
        if got:
            self.data += got
        else:
            self.ended = time.monotonic()
        return len(got)

    def read_until(self, done, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while not done(self) and not self.ended and time.monotonic() < deadline:
            self.read(wait=0.1)
        return self.data

    def close(self) -> None:
        self.sock.close()


def head(method: str, path: str, key: str | None, *fields: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *fields]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@contextlib.contextmanager
def every(interval: float, step):
    """Run ``step`` every ``interval`` seconds on a thread of its own (the slow clients' pace)."""
    stop = threading.Event()

    def loop():
        while not stop.wait(interval):
            step()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def keeps_answering(url: str, seconds: float) -> float:
    """/healthz and a push of another tenant, twice a second for ``seconds``: every one 200; the slowest."""
    slowest, n = 0.0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        assert requests.get(url + "/healthz", timeout=10).status_code == 200
        rv = requests.post(url + "/mcp/push", json=make_unit(f"beta probe {n} {time.time()}"), headers=auth(OTHER),
                           timeout=10)
        assert rv.status_code == 200, rv.text[:200]
        slowest, n = max(slowest, time.monotonic() - started), n + 1
        time.sleep(0.5)
    return slowest


def all_ended(clients: list[Raw], timeout: float, drain: bool = False) -> bool:
    """Whether every client met end-of-file or a reset within ``timeout`` (``drain``: reading what they hold)."""
    deadline = time.monotonic() + timeout
    while not all(c.ended for c in clients) and time.monotonic() < deadline:
        for c in clients if drain else ():
            while c.read(wait=0.01):
                pass
        time.sleep(0.05)
    return all(c.ended for c in clients)


@contextlib.contextmanager
def _closing(clients: list[Raw]):
    try:
        yield clients
    finally:
        for c in clients:
            c.close()


# --- straight to gunicorn -------------------------------------------------------------------------------
def test_stalled_headers_and_bodies_are_dropped(live_server_factory):
    server = live_server_factory(workers=1, env={"CONTEXT_READ_TIMEOUT_S": "2", "CONTEXT_THREADS": "2"})
    stalled = []
    for _ in range(2):   # as many as the worker has threads: without a deadline it would be stuck
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /mcp/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"type\":")
        stalled.append(s)
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /mcp/push HTTP/1.1\r\nHost: x\r\n")
        stalled.append(s)
    start = time.monotonic()
    for s in stalled:
        s.settimeout(20)
        with contextlib.suppress(OSError):
            while s.recv(4096):
                pass   # a 408/400 answer, then the close
    assert time.monotonic() - start < 20
    # The worker is free again: a normal request is answered.
    assert requests.get(server.url + "/healthz", timeout=20).status_code == 200
    for s in stalled:
        s.close()


def test_slow_readers_are_dropped_and_hold_no_thread(server):
    """16 clients read GET /mcp/export or /mcp/units?limit=200 (~1.6 MB) 4 KiB every 2 s: their responses are
    written by the worker's poller, not a thread, and each is reset once it falls behind 16 KiB/s by more
    than the grace (2 s here)."""
    full = len(requests.get(server.url + "/mcp/units?limit=200", headers=auth(KEY), timeout=30).content)
    assert full > 1_000_000
    with _closing([Raw(server.port, rcvbuf=4096) for _ in range(16)]) as readers:
        for i, r in enumerate(readers):
            r.send(head("GET", "/mcp/export" if i % 2 else "/mcp/units?limit=200", KEY))
        with every(2.0, lambda: [r.read(4096) for r in readers]):
            assert keeps_answering(server.url, 6) < ANSWERS_WITHIN_S
            assert all_ended(readers, 12), [len(r.data) for r in readers if not r.ended]
        assert all(r.data.startswith(b"HTTP/1.1 200") and len(r.data) < full // 10 for r in readers), \
            [len(r.data) for r in readers]
    assert "Traceback" not in server.log()


def test_slow_senders_of_any_body_hold_no_thread_and_get_408(server):
    """Chunked bodies, bodies after "100 Continue" and bodies over 256 KiB, trickled with a valid key, are
    buffered without a thread (over 256 KiB in a temporary file) until the request deadline: 408."""
    port = server.port
    chunked = [Raw(port) for _ in range(6)]
    expect = [Raw(port) for _ in range(4)]
    large = [Raw(port) for _ in range(4)]
    with _closing(chunked + expect + large):
        for c in chunked:
            c.send(head("POST", "/mcp/push", KEY, "Transfer-Encoding: chunked"))
        for c in expect:
            c.send(head("POST", "/mcp/push", KEY, "Content-Length: 2000", "Expect: 100-continue"))
        for c in large:
            c.send(head("POST", "/mcp/push", KEY, f"Content-Length: {4 * 1024 * 1024}"))
        for c in expect:     # the guard answers the expectation itself: the body then arrives without a thread
            assert c.read_until(lambda c: b"\r\n\r\n" in c.data, 3).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")

        def trickle():
            for c in chunked:
                c.send(b"1\r\n \r\n")
            for c in expect:
                c.send(b" " * 10)
            for c in large:
                c.send(b" " * 65536)      # 128 KiB/s: over 256 KiB before the deadline, so spooled to a file
        with every(0.5, trickle):
            assert keeps_answering(server.url, 5) < ANSWERS_WITHIN_S
            for c in chunked + expect + large:
                c.read_until(lambda c: b"408 Request Timeout" in c.data, DEADLINE_S + 5)
        for c in chunked + large:
            assert c.data.startswith(b"HTTP/1.1 408"), c.data[:80]
        for c in expect:
            assert c.data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 408"), c.data[:80]
        assert json.loads(c.data.split(b"\r\n\r\n")[-1])["code"] == "request_timeout"
    assert "Traceback" not in server.log()


DOORS = {  # path -> what its 401 body holds (each door's own error shape)
    "/mcp/push": lambda body: body["code"] in ("missing_api_key", "invalid_api_key"),
    "/mcp": lambda body: body["jsonrpc"] == "2.0" and body["error"]["code"] == -32010,
    "/retrieval": lambda body: "error_code" in body,
}


@pytest.mark.parametrize("path", list(DOORS))
def test_a_body_without_a_valid_key_gets_401_before_it_is_sent(server, path):
    """Authentication before the body (each door's 401): a slow sender without a key, or with a wrong one, is
    answered at once without "100 Continue", and the connection closes; its body is never waited for."""
    port = server.port
    framings = ["Transfer-Encoding: chunked", "Content-Length: 5000\r\nExpect: 100-continue",
                f"Content-Length: {512 * 1024}"]   # over the 256 KiB kept in memory, under every limit
    clients = [(Raw(port), key, framing) for key in (None, "wrong-key-0123456789abcdef") for framing in framings]
    clients += [(Raw(port), None, framings[0]) for _ in range(6)]             # 12 sockets
    with _closing([c for c, _, _ in clients]):
        started = time.monotonic()
        for c, key, framing in clients:
            c.send(head("POST", path, key, framing))
        for c, _key, framing in clients:
            c.read_until(lambda c: False, 5)                    # until the server closes it
            assert c.ended and c.ended - started < 3, (framing, c.data[:100])
            assert c.data.startswith(b"HTTP/1.1 401"), (framing, c.data[:100])
            assert b"100 Continue" not in c.data and b"Connection: close" in c.data
            assert DOORS[path](json.loads(c.data.split(b"\r\n\r\n", 1)[1]))
    assert keeps_answering(server.url, 1) < ANSWERS_WITHIN_S


def test_a_stream_is_no_slow_client(server):
    """A live stream (GET /mcp/stream) writes for longer than the grace and idles between events: its own
    write timeout bounds it (service/hub.py), not the guard's pace."""
    with requests.get(server.url + "/mcp/stream", headers=auth(KEY), stream=True, timeout=10) as rv:
        assert rv.status_code == 200
        started, lines = time.monotonic(), []
        for line in rv.iter_lines():
            lines.append(line)
            if time.monotonic() - started > GRACE_S * 2:
                break
        assert lines.count(b":") >= GRACE_S, lines        # heartbeats (1 s here) kept coming


# --- the guard's pieces, on a socket pair ---------------------------------------------------------------
def test_a_thread_reading_a_trickled_body_waits_only_its_grace():
    from gunicorn.http.errors import NoMoreData

    from service.guard.responses import Bounds, DeadlineSocket
    a, b = socket.socketpair()
    sock = DeadlineSocket(a, Bounds.from_config(read_timeout_s=10, grace_s=1, min_receive_rate=16384))
    sock.begin(None, None)
    with every(0.2, lambda: b.send(b"x")):
        started = time.monotonic()
        with pytest.raises(NoMoreData):
            while True:
                sock.recv(65536)
        assert 0.9 < time.monotonic() - started < 3
    a.close()
    b.close()


def test_a_thread_writing_a_large_response_to_a_stalled_reader_is_freed(monkeypatch):
    from service.guard import responses
    monkeypatch.setattr(responses, "RESPONSE_SPOOL_BYTES", 256 * 1024)
    a, b = socket.socketpair()
    sock = responses.DeadlineSocket(a, responses.Bounds.from_config(grace_s=1))
    sock.begin(None, None)
    started = time.monotonic()
    with pytest.raises(responses.Dropped):
        for _ in range(64):
            sock.sendall(b"x" * 65536)     # kept up to the cap, then this thread writes, paced: dropped
    assert sock.dropped and time.monotonic() - started < 3
    b.close()
    a.close()


def test_a_client_that_keeps_up_is_never_dropped():
    from service.guard.responses import Bounds, DeadlineSocket, Flush
    a, b = socket.socketpair()
    sock = DeadlineSocket(a, Bounds.from_config(grace_s=0.5, min_send_rate=1_000_000))
    sock.begin(None, None)
    got = []
    reader = threading.Thread(target=lambda: got.extend(iter(lambda: b.recv(1 << 20), b"")), daemon=True)
    reader.start()
    for _ in range(160):
        sock.sendall(b"x" * 65536)       # 10 MiB
    if sock.out is not None:               # what a slower moment kept, written as the poller would
        flush = Flush(sock, False)
        while not flush.write(a):
            assert flush.overdue() is None
            time.sleep(0.001)
    a.shutdown(socket.SHUT_WR)
    reader.join(timeout=30)
    assert sum(map(len, got)) == 160 * 65536 and not sock.dropped
    a.close()
    b.close()


# --- through the compose file's proxy -------------------------------------------------------------------
@pytest.fixture(scope="module")
def proxy(server, tmp_path_factory):
    """tools/nginx/nginx.conf in front of the server, with its timeouts shortened to 3 s for the test."""
    if NGINX is None:
        pytest.skip(NO_NGINX)
    nginx = Nginx(tmp_path_factory.mktemp("nginx"), [server.port], settings={
        "send_timeout": "3s", "client_body_timeout": "3s", "client_header_timeout": "3s"})
    try:
        yield nginx.start()
    finally:
        nginx.stop()


def test_through_the_proxy_slow_clients_wait_on_nginx_not_on_gunicorn(server, proxy):
    """nginx takes each response from gunicorn at once and each request whole, so slow readers and senders
    (with a key or without) cost gunicorn nothing; nginx drops those that stall (its 3 s timeouts here)."""
    port = proxy.port
    slow_readers = [Raw(port, rcvbuf=4096) for _ in range(6)]
    stalled_readers = [Raw(port, rcvbuf=4096) for _ in range(4)]
    trickling = [Raw(port) for _ in range(4)]
    stalled_senders = [Raw(port) for _ in range(4)]
    slowloris = [Raw(port) for _ in range(4)]
    everyone = slow_readers + stalled_readers + trickling + stalled_senders + slowloris     # 22 sockets
    with _closing(everyone):
        for i, r in enumerate(slow_readers + stalled_readers):
            r.send(head("GET", "/mcp/export" if i % 2 else "/mcp/units?limit=200", KEY))
        for i, c in enumerate(trickling + stalled_senders):
            c.send(head("POST", "/mcp/push", KEY if i % 2 else None, "Transfer-Encoding: chunked") + b"1\r\n \r\n")
        for c in slowloris:
            c.send(b"POST /mcp/push HTTP/1.1\r\n" + HOST)

        def step():
            for r in slow_readers:
                r.read(4096)
            for c in trickling:
                c.send(b"1\r\n \r\n")
        with every(1.0, step):
            assert keeps_answering(proxy.url, 6) < ANSWERS_WITHIN_S
            assert all_ended(stalled_senders + slowloris, 4, drain=True)       # 408 or closed by nginx
            assert all_ended(stalled_readers, 4, drain=True)                   # reset by nginx: reads nothing
        assert not any(r.ended for r in slow_readers)         # nginx serves them at their pace, holding no thread
    assert "Traceback" not in server.log() and "dropped" not in server.log()
