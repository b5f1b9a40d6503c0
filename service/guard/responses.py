"""The responses (service/guard/): the socket a gunicorn worker thread sees while it handles a request, its
reads and writes bounded so that a slow client cannot hold the thread, the rest of a response the worker's poller
writes for a slow reader (``Flush``), and the guard's settings (``Bounds``).

- Reads come first from the temporary file of a large body the guard buffered, then from the socket,
  under the request's deadline, ``read_timeout_s`` of silence and a ``Pace``.
- A response is sent as fast as the client takes it; a client slower than the server (its socket
  buffer stays full for ``SPOOL_AFTER_S``) gets the rest kept, up to ``RESPONSE_SPOOL_BYTES``, and the
  worker's poller writes it out (``Flush``) while the thread moves on. A larger response's thread
  writes the rest itself, paced. Either way every response has a write deadline and a ``Pace``.
- A live stream (service/hub.py) sets its own socket timeout: that bounds its writes instead.
"""
from __future__ import annotations

import errno
import io
import math
import select
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, replace

from ..config import Config

PREBUFFER_BYTES = 256 * 1024     # of a request or response, kept in memory; the rest goes to an unlinked temporary file
RESPONSE_SPOOL_BYTES = 8 * 1024 * 1024   # a response kept for a slow client; a larger one's thread writes it, paced
SPOOL_AFTER_S = 0.05             # a client that has not made room in a response's socket buffer by then is slow


_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


def no_wait(raw: socket.socket) -> int:
    """Flags for a ``send`` or ``recv`` on ``raw`` that must not wait. MSG_DONTWAIT where the system has it and
    the socket has no timeout (blocking or non-blocking: with a timeout Python would poll for up to that long
    first), so the socket's mode is left as it is: each ``setblocking`` is a system call that lets go of the
    interpreter, which under load hands it to another thread (three more per request than gunicorn alone).
    Otherwise the socket is made non-blocking."""
    if _DONTWAIT and not raw.gettimeout():
        return _DONTWAIT
    raw.setblocking(False)
    return 0


@dataclass(frozen=True)
class Bounds:
    """The guard's settings (service/config.py's read_timeout_s, request_deadline_s, slow_client_grace_s,
    min_receive_rate, min_send_rate, write_deadline_s); 0 turns one off."""
    read_timeout_s: float
    request_deadline_s: float
    grace_s: float
    min_receive_rate: int
    min_send_rate: int
    write_deadline_s: float
    max_body_bytes: int             # the body cap where the app's own limits are unknown
    kept_bytes: int = 0             # what a worker keeps for its slow readers, in all and per key (0: no cap)
    kept_key_bytes: int = 0

    @classmethod
    def from_config(cls, config=None, **overrides) -> "Bounds":
        """``config``'s bounds (without one, the settings' defaults), with ``overrides``."""
        if config is None:
            config = Config()
        return replace(cls(config.read_timeout_s, config.request_deadline_s, config.slow_client_grace_s,
                           config.min_receive_rate, config.min_send_rate, config.write_deadline_s,
                           config.max_body_bytes, config.slow_reader_bytes, config.slow_reader_key_bytes),
                       **overrides)


class KeptBytes:
    """What one worker keeps for its slow readers (the rest of responses its poller writes), in all and per API
    key (issue 50, M3: 64 sockets of one key reading 7.5 MB pages at 17 KB/s held 468 MB of temporary files, and
    gunicorn lets a worker hold 1,000 connections). A response that would pass a cap is not kept: its thread
    writes it at the reader's pace, as one over 8 MiB, within the key's share of the worker's threads."""

    def __init__(self):
        self.total = 0
        self.by_key: dict = {}
        self._lock = threading.Lock()

    def take(self, bounds: Bounds, key, n: int) -> bool:
        with self._lock:
            mine = self.by_key.get(key, 0)
            if (bounds.kept_bytes and self.total + n > bounds.kept_bytes) or \
                    (bounds.kept_key_bytes and key is not None and mine + n > bounds.kept_key_bytes):
                return False
            self.total += n
            self.by_key[key] = mine + n
            return True

    def give(self, key, n: int) -> None:
        with self._lock:
            self.total -= n
            left = self.by_key.get(key, 0) - n
            if left > 0:
                self.by_key[key] = left
            else:
                self.by_key.pop(key, None)


KEPT = KeptBytes()          # (per process: each worker's own, counted from its fork)


class Kept:
    """The kept rest of one response: in memory up to PREBUFFER_BYTES, then an unlinked temporary file; its
    bytes count in KEPT until it is closed."""

    def __init__(self, bounds: Bounds, key):
        self.bounds, self.key, self.size = bounds, key, 0
        self.file = tempfile.SpooledTemporaryFile(max_size=PREBUFFER_BYTES, prefix="context-mode-response-")

    def keep(self, view) -> bool:
        """Keep ``view`` if the caps allow it (else keep nothing of it)."""
        if not KEPT.take(self.bounds, self.key, len(view)):
            return False
        self.file.write(view)
        self.size += len(view)
        return True

    def read(self, n: int = -1) -> bytes:
        return self.file.read(n)

    def seek(self, offset: int) -> None:
        self.file.seek(offset)

    def close(self) -> None:
        if self.size:
            KEPT.give(self.key, self.size)
            self.size = 0
        self.file.close()


class Pace:
    """How long a thread may still wait on one client. It starts at ``grace_s``; a wait of ``w`` seconds
    that moved ``n`` bytes costs ``max(0, w - n / min_rate)``: nothing while the client keeps up with
    ``min_rate`` bytes a second, the whole wait when it stalls. (Not an average from the start: bytes
    the kernel took without any wait, such as a first socket buffer's worth, earn no credit.)"""

    def __init__(self, grace_s: float, min_rate: int):
        self.rate = min_rate
        self.left = grace_s if grace_s > 0 and min_rate > 0 else math.inf

    def charge(self, waited: float, moved: int) -> None:
        if self.left != math.inf:
            self.left -= max(0.0, waited - moved / self.rate)


class Dropped(BrokenPipeError):
    """A client too slow for the bounds; gunicorn ends the request quietly (EPIPE)."""

    def __init__(self, why: str):
        super().__init__(errno.EPIPE, why)


class DeadlineSocket:
    """The connection's socket while a worker thread handles a request: reads come first from the
    temporary file of a large body, then from the socket, bounded by the request's deadline, by
    silence and by a ``Pace``; writes are bounded by a ``Pace`` and the response's deadline."""

    def __init__(self, sock: socket.socket, bounds: Bounds):
        self._sock = sock
        self._bounds = bounds
        self.armed = False                     # only while a worker thread handles a request
        self.deadline: float | None = None     # the request's (arrival) deadline
        self.spool = None                      # the rest of a large body, read before the socket
        self.close_after = False               # the body was left unread: the response closes the connection
        self.stream_timeout: float | None = None   # set by a long-lived response (service/hub.py)
        self.dropped: str | None = None
        self._reads = self._writes = None
        self._write_deadline: float | None = None
        self.out = None                        # the response kept for a client slower than the server
        self.out_size = 0
        self.refusal = None                    # the answer the admission gave instead of serving (the app raises it)
        self.owner = None                      # the API key of the request served (what is kept for it counts there)

    def __getattr__(self, name):
        return getattr(self._sock, name)

    # --- per request --------------------------------------------------------------------------------
    def begin(self, deadline: float | None, spool) -> None:
        b = self._bounds
        self.armed, self.deadline, self.spool = True, deadline, spool
        self._reads, self._writes = Pace(b.grace_s, b.min_receive_rate), Pace(b.grace_s, b.min_send_rate)
        self._write_deadline = None
        self.stream_timeout = self.dropped = None
        self.out, self.out_size = None, 0

    def end(self, unreader) -> None:
        self.armed = False
        self.refusal = None
        if self.out is not None:
            self.out.close()                       # (a response not handed to the poller: the request failed)
            self.out, self.out_size = None, 0
        self.deadline = None
        self.close_after = False
        self.stream_timeout = None
        if self.spool is not None:
            rest = self.spool.read()               # pipelined bytes after a large body: the next request's
            if rest and unreader is not None:
                unreader.buf.seek(0, io.SEEK_END)
                unreader.buf.write(rest)
            self.spool.close()
            self.spool = None

    def settimeout(self, value):
        if self.armed:
            self.stream_timeout = value            # the app bounds this response's writes itself (a stream)
        return self._sock.settimeout(value)

    # --- reads --------------------------------------------------------------------------------------
    def _read_timeout(self) -> float | None:
        from gunicorn.http.errors import NoMoreData
        if not self.armed:
            return self._sock.gettimeout()         # e.g. gunicorn's own drain: its timeouts apply
        limits = [self._bounds.read_timeout_s] if self._bounds.read_timeout_s > 0 else []
        if self.deadline is not None:
            limits.append(self.deadline - time.monotonic())
        limits.append(self._reads.left)
        timeout = min(limits)
        if timeout <= 0:
            raise NoMoreData(b"")                  # an OSError: the app answers 408, gunicorn closes quietly
        return None if timeout == math.inf else timeout

    def _read(self, method, arg, *args):
        from gunicorn.http.errors import NoMoreData
        timeout = self._read_timeout()
        if not self.armed:
            return method(arg, *args)
        self._sock.settimeout(timeout)
        started = time.monotonic()
        try:
            got = method(arg, *args)
        except socket.timeout:
            self._reads.charge(time.monotonic() - started, 0)
            raise NoMoreData(b"") from None
        self._reads.charge(time.monotonic() - started, got if isinstance(got, int) else len(got))
        return got

    def recv(self, size: int, *flags):
        if self.spool is not None and not flags:
            data = self.spool.read(size)
            if data:
                return data
        return self._read(self._sock.recv, size, *flags)

    def recv_into(self, buffer, *args):
        if self.spool is not None and not args:
            n = self.spool.readinto(buffer)
            if n:
                return n
        return self._read(self._sock.recv_into, buffer, *args)

    # --- writes -------------------------------------------------------------------------------------
    def drop(self, why: str) -> None:
        """Reset the connection (nothing lingers in kernel buffers for a client that does not read) and
        end the request: the worker thread is free at once."""
        self.dropped = why
        reset(self._sock)
        raise Dropped(why)

    def _start_writing(self) -> None:
        if self._write_deadline is None:
            b = self._bounds
            self._write_deadline = time.monotonic() + b.write_deadline_s if b.write_deadline_s > 0 else math.inf

    def sendall(self, data, *flags):
        if not self.armed or flags:
            return self._sock.sendall(data, *flags)
        if self.stream_timeout is not None:
            self._sock.settimeout(self.stream_timeout)
            try:
                return self._sock.sendall(data)
            except socket.timeout:
                self.drop(f"a stream's client read nothing for {self.stream_timeout:g} s")
        self._start_writing()
        view = memoryview(data).cast("B")
        if self.out is not None:
            if self.out_size + len(view) <= RESPONSE_SPOOL_BYTES and self.out.keep(view):
                self.out_size += len(view)           # the poller writes it out once the response is whole
                return None
            kept = self.take_out()                   # too large to keep: this thread writes it all, paced
            while piece := kept.read(262144):
                self._send_paced(memoryview(piece))
            kept.close()
        elif self.out_size == 0:                      # nothing spooled in this response: send what the socket takes
            flags = no_wait(self._sock)
            waited = 0.0
            while view:
                try:
                    view = view[self._sock.send(view, flags):]
                except (BlockingIOError, InterruptedError):
                    if waited >= SPOOL_AFTER_S:
                        break
                    started = time.monotonic()
                    select.select([], [self._sock], [], SPOOL_AFTER_S / 5)
                    waited += time.monotonic() - started
            if not view:
                return None
            kept = Kept(self._bounds, self.owner)     # the client is slower than the server: keep the rest
            if kept.keep(view):
                self.out, self.out_size = kept, len(view)
                return None
            kept.close()                               # past what the worker keeps: this thread writes it, paced
            self.out_size = -1
        self._send_paced(view)
        return None

    def take_out(self):
        """The kept part of the response (a file, from its start), to write now; later writes of this
        response go straight to the socket."""
        kept = self.out
        kept.seek(0)
        self.out, self.out_size = None, -1            # -1: this response was kept once already
        return kept

    def _send_paced(self, view: memoryview) -> None:
        b = self._bounds
        while view:
            timeout = min(self._writes.left, self._write_deadline - time.monotonic())
            if timeout <= 0:
                self.drop("the client reads its response too slowly" if self._writes.left <= 0 else
                          f"the response was not written within {b.write_deadline_s:g} s")
            self._sock.settimeout(None if timeout == math.inf else timeout)
            started = time.monotonic()
            try:
                sent = self._sock.send(view)
            except socket.timeout:
                sent = 0
            self._writes.charge(time.monotonic() - started, sent)
            view = view[sent:]

    def sendfile(self, file, offset: int = 0, count: int | None = None) -> int:
        """Through ``sendall``, so a file's response is paced like any other (os.sendfile would block)."""
        file.seek(offset)
        total = 0
        while count is None or total < count:
            piece = file.read(65536 if count is None else min(65536, count - total))
            if not piece:
                break
            self.sendall(piece)
            total += len(piece)
        return total


def reset(raw: socket.socket) -> None:
    """Make the coming close a reset (no kernel buffers kept for a client that does not read) and shut the
    connection both ways (gunicorn's own lingering close then returns at once)."""
    try:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Flush:
    """The rest of a response for a client slower than the server, written by the worker's poller (no
    thread) as the client reads it: under the response's ``Pace`` and write deadline, then the connection
    goes on as gunicorn decided (kept alive or closed)."""

    def __init__(self, sock: DeadlineSocket, keepalive: bool):
        self.keepalive = keepalive
        self.kept = sock.take_out()
        self.piece = memoryview(b"")
        self.pace = sock._writes
        self.deadline = sock._write_deadline
        self.checked = time.monotonic()
        self.moved = 0

    def write(self, raw: socket.socket) -> bool:
        """Send what the socket takes now (non-blocking); True once everything is sent."""
        while True:
            if not self.piece:
                self.piece = memoryview(self.kept.read(262144))
                if not self.piece:
                    self.close()
                    return True
            try:
                sent = raw.send(self.piece)
            except (BlockingIOError, InterruptedError):
                return False
            self.piece = self.piece[sent:]
            self.moved += sent

    def close(self) -> None:
        self.kept.close()

    def overdue(self) -> str | None:
        """Why the client must be dropped now (it reads too slowly, or the deadline passed), else None."""
        now = time.monotonic()
        self.pace.charge(now - self.checked, self.moved)
        self.checked, self.moved = now, 0
        if self.pace.left <= 0:
            return "the client reads its response too slowly"
        if now > self.deadline:
            return "the response was not written within its deadline"
        return None
