"""The service's log lines on stderr (docs/design.md §9): one handler, and the access line's cheap path.

Under load a worker's access lines were a large share of ``GET /healthz``'s cost (bench/README.md, "The
request path"): logging builds a record per line, and its handler held a lock across a write system call,
which releases the GIL, so a worker's threads queued behind one another for each line. Here every line
is one ``os.write`` of the whole line (no lock), and access lines, when logging sends them nowhere but
here, are formatted directly and written in batches, like nginx's buffered access log: at most
``FLUSH_S`` later, before any other line of this handler, and at exit.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FLUSH_S = 0.05             # an access line waits at most this long for the lines after it
MAX_PENDING = 256          # ... or until this many wait (then the line that reaches it writes them all)


class LineHandler(logging.StreamHandler):
    """A stream handler that writes each line with one ``os.write`` and holds no lock: a pipe takes up to
    PIPE_BUF (4 KiB) bytes whole, and the kernel serializes writes to a file. A stream without a file
    descriptor (a test's StringIO) is written as StreamHandler writes it."""

    def __init__(self, stream):
        super().__init__(stream)
        self.setFormatter(logging.Formatter(FORMAT))
        self.own_formatter = self.formatter
        self.pending: collections.deque[bytes] = collections.deque()   # append and popleft need no lock
        self.flusher_pid = 0
        self.second = (0, "")                                          # asctime's text of the current second
        atexit.register(self.flush_pending)

    def createLock(self) -> None:
        self.lock = None

    def fd(self) -> int | None:
        try:
            return self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return None

    def emit(self, record: logging.LogRecord) -> None:
        fd = self.fd()
        if fd is None:
            return super().emit(record)
        try:
            self.flush_pending()                   # lines keep their order
            self.write(fd, (self.format(record) + self.terminator).encode(self.encoding(), "backslashreplace"))
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as StreamHandler: a failed log line never fails the caller
            self.handleError(record)

    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    @staticmethod
    def write(fd: int, data: bytes) -> None:
        while data:
            data = data[os.write(fd, data):]

    def asctime(self, now: float) -> str:
        """Formatter's default asctime (local time, to the millisecond), the second's text made once."""
        whole = int(now)
        if self.second[0] != whole:
            self.second = (whole, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole)))
        return f"{self.second[1]},{int((now - whole) * 1000):03d}"

    def defer(self, name: str, message: str) -> None:
        """An INFO line of logger ``name``, as this handler's formatter writes it, written within FLUSH_S."""
        line = f"{self.asctime(time.time())} INFO {name}: {message}{self.terminator}"
        if self.flusher_pid != os.getpid():
            self.start_flusher()
        self.pending.append(line.encode(self.encoding(), "backslashreplace"))
        if len(self.pending) >= MAX_PENDING:
            self.flush_pending()

    def start_flusher(self) -> None:
        # One per process (a forked child starts its own; what its parent had pending is the parent's).
        self.pending.clear()
        self.flusher_pid = os.getpid()
        threading.Thread(target=self._flusher, name="cms-log-flush", daemon=True).start()

    def _flusher(self) -> None:
        # It looks every FLUSH_S rather than being woken: waking a thread from a request's thread got that
        # thread, holding the GIL, taken off the CPU for the woken one (a worker's stall, not a line's cost).
        while True:
            time.sleep(FLUSH_S)
            if self.pending:
                self.flush_pending()

    def flush_pending(self) -> None:
        lines = []
        try:
            while True:
                lines.append(self.pending.popleft())
        except IndexError:
            pass
        fd = self.fd() if lines else None
        if fd is not None:
            try:
                self.write(fd, b"".join(lines))
            except OSError:
                pass                                # as a failed emit: the caller goes on


def direct_handler(logger: logging.Logger) -> LineHandler | None:
    """The LineHandler that ``logger``'s INFO records go to with its own format, when it is the only place
    they go and nothing filters them (as ``setup_logging`` leaves logging); else None (logging decides)."""
    if not logger.isEnabledFor(logging.INFO):
        return None
    found, node = None, logger
    while node is not None:
        if node.filters:
            return None
        for h in node.handlers:
            if found is not None or type(h) is not LineHandler or h.filters or h.level > logging.INFO \
                    or h.formatter is not h.own_formatter:
                return None
            found = h
        if not node.propagate:
            break
        node = node.parent
    return found


def setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        import sys
        root.addHandler(LineHandler(sys.stderr))
        root.setLevel(logging.INFO)
