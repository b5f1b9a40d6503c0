"""Slow clients cannot hold gunicorn's worker threads (docs/design.md §9).

gthread hands a connection to a worker thread as soon as it is readable, and the thread then
reads the request's headers and body with blocking ``recv`` calls. A client that sends one
header line every few seconds (slowloris) therefore held a thread for as long as it liked; 24
of them starved /healthz. Installed from service/gunicorn_conf.py (in the master, before fork):

- Headers, and a body of up to ``PREBUFFER_BYTES``, are read without a thread: each time the
  socket is readable a thread takes what has arrived (non-blocking), keeps it in the request
  parser's buffer, and gives the connection back to the poller until the request is complete.
- Every request has a total deadline for its headers and body (``request_deadline_s``,
  from its first byte): past it the client gets a JSON 408 and the connection is closed.
  Larger bodies read on a thread still stop at the deadline and at ``read_timeout_s`` of silence.
- A dropped slow client is a debug line, not a traceback; gunicorn's own 400/414/431 answers
  are JSON in the REST error shape instead of HTML.
"""
from __future__ import annotations

import io
import json
import re
import socket
import time

PREBUFFER_BYTES = 256 * 1024
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*(\d{1,12})[ \t]*\r\n", re.I)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding[ \t]*:[^\r\n]*chunked", re.I)
_EXPECT = re.compile(rb"\r\nexpect[ \t]*:", re.I)     # the client waits for "100 Continue" before its body
_CODES = {400: "bad_request", 403: "forbidden", 408: "request_timeout", 414: "uri_too_long",
          417: "expectation_failed", 431: "headers_too_large", 500: "internal_error", 501: "not_implemented"}


def json_error(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message[:200] or reason, "code": _CODES.get(status, "bad_request")}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    return head + body


class DeadlineSocket:
    """The connection's socket, with reads bounded by the request's deadline and by silence."""

    def __init__(self, sock: socket.socket, idle_s: float):
        self._sock = sock
        self._idle = idle_s
        self.armed = False                     # only while a worker thread handles a request
        self.deadline: float | None = None

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def _arm(self) -> None:
        from gunicorn.http.errors import NoMoreData
        if not self.armed:
            return                              # e.g. gunicorn's own lingering close: its timeouts apply
        timeout = self._idle if self._idle > 0 else None
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise NoMoreData(b"")           # an OSError: the app answers 408, gunicorn closes quietly
            timeout = left if timeout is None else min(timeout, left)
        self._sock.settimeout(timeout)

    def recv(self, size: int, *flags):
        from gunicorn.http.errors import NoMoreData
        self._arm()
        try:
            return self._sock.recv(size, *flags)
        except socket.timeout:
            raise NoMoreData(b"") from None

    def recv_into(self, buffer, *args):
        from gunicorn.http.errors import NoMoreData
        self._arm()
        try:
            return self._sock.recv_into(buffer, *args)
        except socket.timeout:
            raise NoMoreData(b"") from None


def request_complete(data: bytes) -> bool:
    """True when ``data`` holds a whole request head and any small fixed-length body after it."""
    if len(data) >= PREBUFFER_BYTES:
        return True                             # big: the parser reads the rest on a thread, under the deadline
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    head = data[:end + 2]
    if _CHUNKED.search(head) or _EXPECT.search(head):
        return True
    m = _CONTENT_LENGTH.search(head)
    if not m:
        return True
    need = end + 4 + int(m.group(1))
    return need > PREBUFFER_BYTES or len(data) >= need


def buffer_request(conn, request_deadline_s: float) -> str:
    """Read what the client has sent so far into the parser's buffer without blocking: 'ready' (hand
    it to the parser), 'wait' (back to the poller) or 'expired' (past the request deadline)."""
    now = time.monotonic()
    if conn.request_started is None:
        conn.request_started = now
    conn.init()
    if conn.is_http2 or not hasattr(conn.parser, "unreader"):
        return "ready"
    unreader = conn.parser.unreader
    pieces = [unreader.buf.getvalue()]
    size = len(pieces[0])
    raw = conn.sock._sock
    eof = False
    raw.setblocking(False)
    try:
        while size < PREBUFFER_BYTES:
            data = raw.recv(65536)
            if not data:
                eof = True
                break
            pieces.append(data)
            size += len(data)
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        eof = True                          # reset: let the parser meet it and close quietly
    data = b"".join(pieces)
    unreader.buf = io.BytesIO()
    unreader.buf.write(data)
    if eof or request_complete(data):
        return "ready"
    if request_deadline_s > 0 and now - conn.request_started > request_deadline_s:
        return "expired"
    return "wait"


def refuse_expired(conn) -> None:
    """Answer 408 to a request that did not arrive in time, and close the connection both ways."""
    raw = conn.sock._sock
    try:
        raw.setblocking(False)
        raw.send(json_error(408, "Request Timeout", "The request did not arrive within the deadline."))
        # Shut both ways: gunicorn's lingering close would otherwise keep reading what this
        # client still trickles, on the worker's main thread.
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def install(read_timeout_s: float, request_deadline_s: float) -> None:
    from gunicorn import util
    from gunicorn.workers import gthread

    if getattr(gthread.ThreadWorker.handle, "_guarded", False):
        return
    if not hasattr(gthread, "_DEFER") or not hasattr(gthread.TConn, "init"):
        raise RuntimeError("service/gunicorn_guard.py needs gunicorn >= 27 (gthread connection deferral)")
    original_init = gthread.TConn.__init__
    original_handle = gthread.ThreadWorker.handle

    def conn_init(self, cfg, sock, client, server):
        original_init(self, cfg, DeadlineSocket(sock, read_timeout_s), client, server)
        self.request_started = None

    def handle(self, conn):
        if not isinstance(conn.sock, DeadlineSocket):
            return original_handle(self, conn)
        try:
            state = buffer_request(conn, request_deadline_s)
        except Exception as e:  # noqa: BLE001 - whatever the socket did, the parser reports it
            self.log.debug("buffering a request failed: %s", e)
            state = "ready"
        if state == "wait":
            return gthread._DEFER
        if state == "expired":
            self.log.debug("closing %s: request headers and body not received within %ss",
                           conn.client, request_deadline_s)
            refuse_expired(conn)
            return False
        if request_deadline_s > 0:
            conn.sock.deadline = conn.request_started + request_deadline_s
        conn.sock.armed = True
        try:
            return original_handle(self, conn)
        finally:
            conn.sock.armed = False
            conn.sock.deadline = None
            conn.request_started = None        # a kept-alive connection's next request starts afresh

    def write_error(sock, status_int, reason, mesg):
        util.write_nonblock(sock, json_error(status_int, reason, f"{reason}: {mesg}" if mesg else reason))

    handle._guarded = True
    gthread.TConn.__init__ = conn_init
    gthread.ThreadWorker.handle = handle
    util.write_error = write_error
