"""Helpers for the live-context tests (issue 16; imported by tests/test_listen.py and test_stream.py).

Raw HTTP where a test must see every byte of a stream, and which gunicorn worker holds a connection
(Linux /proc), so a test can push through the worker that does *not* hold the listener.
"""
from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time

from mcp_support import MODERN, meta
from workers import worker_holding, worker_pids

SUB_KEY = "io.modelcontextprotocol/subscriptionId"


def workers_of(server) -> list[int]:
    return worker_pids(server.proc.pid)


class Sse:
    """One open HTTP response read as SSE on a thread: ``next()`` returns events in order
    ({"event", "data" (parsed JSON when it is), "id"} or {"comment": text})."""

    def __init__(self, conn: http.client.HTTPConnection, rv: http.client.HTTPResponse):
        self.conn, self.rv = conn, rv
        self.status = rv.status
        self.headers = rv.headers
        self.items: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        if rv.status == 200 and rv.headers.get("Content-Type", "").startswith("text/event-stream"):
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = json.loads(rv.read() or b"null")

    def _read(self):
        event, data, event_id = "message", [], None
        try:
            while True:
                line = self.rv.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if data:
                        text = "\n".join(data)
                        try:
                            parsed = json.loads(text)
                        except ValueError:
                            parsed = text
                        self.items.put({"event": event, "data": parsed, "id": event_id})
                    event, data, event_id = "message", [], None
                elif line.startswith(":"):
                    self.items.put({"comment": line[1:]})
                else:
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        event = value
                    elif field == "data":
                        data.append(value)
                    elif field == "id":
                        event_id = value
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            pass                             # closed by close(), or the server went away
        finally:
            self.closed.set()
            self.items.put(None)

    def next(self, timeout: float = 10.0, *, comments: bool = False):
        """The next event (comments skipped unless asked for); None once the stream ended."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no SSE event in time")
            item = self.items.get(timeout=left)
            if item is None:
                self.items.put(None)
                return None
            if "comment" in item and not comments:
                continue
            return item

    def until(self, pred, timeout: float = 15.0):
        """Events up to and including the first one that satisfies ``pred``."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            item = self.next(max(0.01, deadline - time.monotonic()))
            if item is None:
                raise AssertionError(f"stream ended before the expected event; saw {seen}")
            seen.append(item)
            if pred(item):
                return seen

    def quiet(self, seconds: float) -> list:
        """Every event that arrives within ``seconds`` (heartbeats skipped)."""
        got = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                item = self.next(max(0.01, deadline - time.monotonic()))
            except (TimeoutError, queue.Empty):
                break
            if item is None:
                break
            got.append(item)
        return got

    @property
    def sock(self) -> socket.socket:
        return self.conn.sock

    def close(self):
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self.conn.close()


def listen(server, notifications: dict, *, key: str | None = None, id="L1", timeout: float = 30) -> Sse:
    """POST subscriptions/listen the way a 2026-07-28 client does; the response read as SSE."""
    body = {"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
            "params": {"_meta": meta(), "notifications": notifications}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("POST", "/mcp", body=json.dumps(body), headers=headers)
    return Sse(conn, conn.getresponse())


def stream(server, params: str = "", *, key: str | None = None, last_event_id=None, timeout: float = 30) -> Sse:
    """GET /mcp/stream?<params> read as SSE."""
    headers = {"Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("GET", "/mcp/stream" + (f"?{params}" if params else ""), headers=headers)
    return Sse(conn, conn.getresponse())


def push_via(server, unit: dict, *, worker: int | None = None, avoid: int | None = None, key: str | None = None,
             within: float = 30.0) -> tuple[dict, int | None]:
    """Push one unit over a fresh connection held by ``worker`` (or by any worker but ``avoid``):
    connections are retried until the kernel hands one to such a worker. Returns (ack, worker).

    Which worker accepts is up to the scheduler: on a loaded machine one worker can win a hundred times in a
    row (CI saw it), so tries go on for ``within`` seconds, with a growing pause between them that lets the
    other worker come back to its accept."""
    workers = workers_of(server)
    deadline, pause = time.monotonic() + within, 0.0
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.connect()
        held = worker_holding(conn.sock, workers)
        if (worker is not None and held != worker) or (avoid is not None and held == avoid):
            conn.close()
            time.sleep(pause)
            pause = min(0.2, pause + 0.005)
            continue
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request("POST", "/mcp/push", body=json.dumps(unit), headers=headers)
        rv = conn.getresponse()
        body = json.loads(rv.read())
        conn.close()
        assert rv.status == 200, body
        return body, held
    raise AssertionError("no connection landed on the wanted worker")


def updated(uri: str):
    """Predicate: a notifications/resources/updated event for ``uri``."""
    return lambda e: isinstance(e.get("data"), dict) and e["data"].get("method") == "notifications/resources/updated" \
        and e["data"]["params"]["uri"] == uri


def method_of(e) -> str | None:
    return e["data"].get("method") if isinstance(e.get("data"), dict) else None
