"""A request as it arrives, before a gunicorn worker thread reads it (service/guard/).

Each time the connection is readable, ``buffer_request`` takes what has arrived without blocking: the
head, then the body whatever its framing (Content-Length, chunked, or after the "100 Continue" sent
here), up to the route's body limit; ``PREBUFFER_BYTES`` in memory, the rest in a temporary file. It
looks at the head only to know where the body ends and whether the caller may send one: a request
whose Authorization names no configured key is handed over without its body (the app answers 401
without reading it). gunicorn's parser still parses and checks everything.
"""
from __future__ import annotations

import io
import re
import tempfile
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from flask import Flask

from ..doors import body_limit
from .responses import PREBUFFER_BYTES, Bounds, no_wait
from ..state import app_state

_CHUNK_LINE_MAX = 8192            # gunicorn's own bound on a chunk-size line (limit_request_field_size)
_TRAILER_MAX = 8190 * 32          # ... and on a trailer section
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_EXPECT_LINE = re.compile(rb"\r\nexpect[ \t]*:[^\r\n]*", re.I)


@dataclass
class Head:
    size: int                     # bytes, up to and with the blank line
    method: str
    path: str
    length: int | None            # Content-Length
    chunked: bool
    expect: bool                  # Expect: 100-continue
    authorization: str | None
    plain: bool                   # framing this guard follows; False: gunicorn's parser answers (400, 417, 501)

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.length)


def parse_head(data: bytes, size: int) -> Head:
    """The fields of a request head (``data[:size]``, ending with the blank line) that decide how its body
    is read. Anything unusual is not ``plain``: the request then goes to gunicorn's parser as it is."""
    lines = bytes(data[:size - 4]).split(b"\r\n")
    parts = lines[0].split(b" ")
    target = parts[1].decode("latin-1") if len(parts) == 3 else ""
    version = parts[2] if len(parts) == 3 else b""
    fields: dict[str, list[str]] = {}
    plain = len(parts) == 3 and version in (b"HTTP/1.1", b"HTTP/1.0")
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip(b" \t"):
            plain = False
            continue
        fields.setdefault(name.decode("latin-1").lower(), []).append(value.strip(b" \t").decode("latin-1"))
    lengths = fields.get("content-length", [])
    codings = fields.get("transfer-encoding", [])
    expects = fields.get("expect", [])
    length = None
    if len(lengths) > 1 or (lengths and not lengths[0].isdigit()) or (lengths and codings):
        plain = False
    elif lengths:
        length = int(lengths[0])
    chunked = bool(codings)
    if codings and (len(codings) > 1 or codings[0].lower() != "chunked" or version != b"HTTP/1.1"):
        plain = False
    if expects and (len(expects) > 1 or expects[0].lower() != "100-continue"):
        plain = False
    auth = fields.get("authorization")
    try:
        path = target if target.startswith("/") else urlsplit(target).path
    except ValueError:
        path = ""
    return Head(size, parts[0].decode("latin-1"), path.split("?", 1)[0], length, chunked,
                bool(expects) and version == b"HTTP/1.1",
                ",".join(auth) if auth else None, plain)     # repeated fields joined as gunicorn joins them


class ChunkScanner:
    """Where a chunked body ends (RFC 9112 §7.1), fed as it arrives. Only looks: gunicorn's parser
    still decodes it (and answers a malformed one with 400); ``bad`` just ends the buffering."""

    def __init__(self):
        self.state = "size"
        self.line = b""
        self.left = 0                 # data bytes of the current chunk still to come
        self.received = 0             # data bytes seen (the decoded body so far)
        self.trailer = 0
        self.done = self.bad = False

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n and not (self.done or self.bad):
            if self.state == "data":
                take = min(self.left, n - i)
                self.left -= take
                self.received += take
                i += take
                if not self.left:
                    self.state = "crlf"
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                self.bad = len(self.line) > _CHUNK_LINE_MAX
                return
            line, self.line, i = self.line + data[i:j + 1], b"", j + 1
            if self.state == "crlf":
                self.bad = line != b"\r\n"
                self.state = "size"
            elif self.state == "size":
                digits = line.rstrip(b"\r\n").split(b";", 1)[0].strip(b" \t")
                if len(line) > _CHUNK_LINE_MAX or not _HEX.fullmatch(digits):
                    self.bad = True
                elif int(digits, 16) == 0:
                    self.state = "trailer"
                else:
                    self.left = int(digits, 16)
                    self.state = "data"
            else:
                self.trailer += len(line)
                self.done = line == b"\r\n"
                self.bad = self.trailer > _TRAILER_MAX


class Arrival:
    """One request while it arrives, kept on its connection between readable events."""

    def __init__(self, data: bytes):
        self.started = time.monotonic()
        self.mem = bytearray(data)            # the head, the body's start, maybe a pipelined request after it
        self.scanned = 0                      # where the head's end may still be
        self.head: Head | None = None
        self.cap = 0
        self.body_seen = 0                    # raw body bytes read (memory and spool)
        self.scanner: ChunkScanner | None = None
        self.spool = None
        self.close_after = False

    def body_done(self) -> bool:
        if self.scanner is not None:
            return self.scanner.done or self.scanner.bad or self.scanner.received > self.cap
        return self.body_seen >= (self.head.length or 0)

    def want(self) -> int:
        """How much to ask the socket for: never past the end of a Content-Length body."""
        if self.head is None or self.scanner is not None:
            return 65536
        return max(1, min(65536, (self.head.length or 0) - self.body_seen))

    def take_body(self, data: bytes) -> None:
        self.body_seen += len(data)
        if self.scanner is not None:
            self.scanner.feed(data)

    def store(self, data: bytes) -> None:
        if self.spool is None and len(self.mem) + len(data) <= PREBUFFER_BYTES:
            self.mem += data
            return
        if self.spool is None:
            self.spool = tempfile.TemporaryFile(prefix="context-mode-body-")   # unlinked, 0600
        self.spool.write(data)


class Door:
    """What the guard needs of the worker's app: its keys, its body limits (service.doors) and who may take a
    thread now (service.shares.admission.Admission, None outside the service's app)."""

    def __init__(self, app, bounds: Bounds):
        state = app_state(app, optional=True) if isinstance(app, Flask) else None
        self.keys = state.keys if state is not None else None
        self.admission = state.admission if state is not None else None
        self.config = (getattr(app, "config", None) or {}).get("CONTEXT")
        self.bounds = bounds

    def limit(self, path: str) -> int:
        if self.config is None:
            return self.bounds.max_body_bytes
        return body_limit(self.config, path)

    def authenticated(self, header: str | None) -> bool:
        """Whether the app would take this Authorization header (always, without keys or without an app)."""
        return self.keys is None or self.keys.accepts(header)


def _plan(arrival: Arrival, door: Door) -> str:
    """Once the head is in: 'ready' (hand it over as it is), 'refuse' (hand it over without its body,
    close after the answer) or 'body' (buffer the body too)."""
    head = arrival.head
    if not head.plain or not head.has_body:
        return "ready"
    if not door.authenticated(head.authorization):
        return "refuse"                                   # the app answers 401 before it reads a byte of it
    arrival.cap = door.limit(head.path)
    if head.length is not None and head.length > arrival.cap:
        return "refuse"                                   # 413 from Content-Length alone
    if head.chunked:
        arrival.scanner = ChunkScanner()
    return "body"


def _strip_expect(arrival: Arrival) -> None:
    """Drop the Expect field, so gunicorn does not send "100 Continue" on its own."""
    head = arrival.head
    old = bytes(arrival.mem[:head.size])
    new = _EXPECT_LINE.sub(b"", old)
    arrival.mem[:head.size] = new
    head.size = len(new)


def buffer_request(conn, bounds: Bounds, door: Door) -> str:
    """Read what the client has sent so far without blocking: 'ready' (hand it to the parser: the
    whole request, or what the parser should see of it), 'wait' (back to the poller) or 'expired'."""
    conn.init()
    if conn.is_http2 or not hasattr(conn.parser, "unreader"):
        return "ready"
    arrival = getattr(conn, "arrival", None)
    if arrival is None:
        arrival = conn.arrival = Arrival(conn.parser.unreader.take_buffered())
    raw = conn.sock._sock
    flags = no_wait(raw)
    state = None
    fresh = b""
    while state is None:
        if arrival.head is None:
            end = arrival.mem.find(b"\r\n\r\n", arrival.scanned)
            arrival.scanned = max(0, len(arrival.mem) - 3)      # a client sending a byte at a time costs no rescans
            if end >= 0:
                arrival.head = parse_head(arrival.mem, end + 4)
                plan = _plan(arrival, door)
                if plan != "body":
                    if plan == "refuse":
                        arrival.close_after = True
                        if arrival.head.expect:
                            _strip_expect(arrival)
                    state = "ready"
                    break
                if arrival.head.expect:
                    _strip_expect(arrival)
                    try:
                        raw.send(b"HTTP/1.1 100 Continue\r\n\r\n", flags)   # a few bytes on a fresh socket
                    except OSError:
                        state = "ready"
                        break
                arrival.take_body(bytes(arrival.mem[arrival.head.size:]))
                continue
            if len(arrival.mem) >= PREBUFFER_BYTES:
                state = "ready"                    # headers too large: the parser says so (431)
                break
        elif arrival.body_done():
            state = "ready"
            if arrival.scanner is not None and arrival.scanner.received > arrival.cap:
                arrival.close_after = True         # over the limit: the app reads one byte more, answers 413
            break
        try:
            fresh = raw.recv(arrival.want(), flags)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            state = "ready"                        # reset: let the parser meet it and close quietly
            break
        if not fresh:
            state = "ready"
            break
        if arrival.head is None:
            arrival.mem += fresh
        else:
            arrival.store(fresh)
            arrival.take_body(fresh)
    if state is None:
        deadline = bounds.request_deadline_s
        return "expired" if deadline > 0 and time.monotonic() - arrival.started > deadline else "wait"
    hand_over(conn)
    return state


def hand_over(conn) -> None:
    """What arrived goes where the parser reads it: memory into its buffer, a spooled rest from the start."""
    arrival = getattr(conn, "arrival", None)
    if arrival is None or conn.parser is None or not hasattr(conn.parser, "unreader"):
        return
    conn.parser.unreader.buf = io.BytesIO()
    conn.parser.unreader.buf.write(arrival.mem)
    if arrival.spool is not None:
        arrival.spool.seek(0)
