"""What one process keeps open for its tenants, and for how long (docs/design.md §11, "What a tenant holds").

A node's cost must follow its work, not the number of tenants it has seen (issue 49): each thing a process
keeps open for one tenant (its SQLite files, its read index's reader, the read index's writer in the
maintenance leader, its maintenance lock) is held in a :class:`Kept`: at most so many, the least recently
used closed first, and any left unused for ``CONTEXT_TENANT_IDLE_S`` closed by the process's background
thread. A tenant closed is opened again by its next request, which then costs about a millisecond more.

How many follows from the process's open-files limit (``RLIMIT_NOFILE``; its soft limit is raised to the hard
one at start), unless ``CONTEXT_OPEN_FILES`` says: the descriptors the tenants' files may hold in one process
(:class:`Budget`). The descriptors really open are counted (:data:`FILES`), so a tenant whose files hold more
than the usual few makes another close sooner.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from .boot import raise_open_files_limit

# Descriptors a process keeps for what is not a tenant's: its listening and client sockets, logs, pipes,
# the metrics files, streams.db, signals, and room for a request's files opened for it alone (a strong
# search's day files past the tenant's share).
RESERVE_SHARE = 4            # a quarter of the limit, at least RESERVE_MIN
RESERVE_MIN = 64
TENANT_FILES = 5             # a tenant's catalog as usually open: writer and one reader (file and WAL each), its -shm
SHARD_FILES = 7              # a day file kept open: writer and two readers (CONTEXT_SHARD_READERS), its -shm
SHARDS_SHARE = 0.4           # of the files budget, at most this much for day files
MAX_TENANTS = 1000           # tenants one process keeps open however large its limit (memory)
WRITERS = 4                  # read-index writers one process keeps open (tantivy: 6 threads each, fixed)


def open_files_limit() -> int:
    """This process's open-files limit (soft), after raising it to the hard limit where allowed."""
    try:
        import resource
    except ImportError:          # not a POSIX system: no limit to read
        return 65536
    raise_open_files_limit()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 65536 if soft == resource.RLIM_INFINITY else int(soft)


def usable_files(limit: int) -> int:
    """What the tenants' files may hold under ``limit``: the limit less its reserve."""
    return max(RESERVE_MIN, limit - max(RESERVE_MIN, limit // RESERVE_SHARE))


@dataclass(frozen=True)
class Budget:
    """What one process of this node keeps open for its tenants."""
    limit: int              # RLIMIT_NOFILE (soft, after raising it)
    files: int              # descriptors the tenants' SQLite files and maintenance locks may hold
    shards: int             # day files kept open (CONTEXT_MAX_OPEN_SHARDS, or fewer to fit ``files``)
    tenants: int            # tenants whose files stay open
    read_indexes: int       # tenants' read indexes kept loaded (one tantivy thread each)
    writers: int            # read-index writers kept open by the maintenance leader (seven threads each)
    idle_s: float           # a tenant unused this long is closed

    @classmethod
    def of(cls, config, limit: int | None = None) -> "Budget":
        limit = open_files_limit() if limit is None else limit
        usable = usable_files(limit)
        files = min(config.open_files, usable) if config.open_files > 0 else usable
        shards = max(1, min(config.max_open_shards, int(files * SHARDS_SHARE) // SHARD_FILES))
        tenants = max(1, min(MAX_TENANTS, (files - shards * SHARD_FILES) // TENANT_FILES))
        return cls(limit, files, shards, tenants, max(1, config.open_read_indexes), WRITERS, config.tenant_idle_s)

    def warnings(self, config) -> list[str]:
        """What the operator should know at start: a budget below what the configuration asks for."""
        out = []
        usable = usable_files(self.limit)
        if config.open_files > usable:
            out.append(f"CONTEXT_OPEN_FILES={config.open_files} is more than the open-files limit ({self.limit}) "
                       f"leaves for tenants' files ({usable}): each process keeps {self.files}. Raise the limit "
                       "(ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=) or lower CONTEXT_OPEN_FILES.")
        if self.shards < config.max_open_shards:
            out.append(f"the open-files limit ({self.limit}) holds {self.shards} of CONTEXT_MAX_OPEN_SHARDS="
                       f"{config.max_open_shards} day files and the files of {self.tenants} tenants open per "
                       "process; more are closed when least recently used and opened again when asked for (about "
                       "a millisecond each). For more tenants at full speed raise it, e.g. ulimit -n 65536 "
                       "(systemd LimitNOFILE=65536, docker --ulimit nofile=65536).")
        return out


class Count:
    """A process-wide count (the descriptors the tenants' files hold), safe across threads."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


FILES = Count()           # descriptors this process's SQLite connections and maintenance locks hold


class Kept:
    """At most ``cap`` things by key (a tenant's files, its read index, its writer), the least recently used
    closed first (``close(key, value)``, outside the lock); ``sweep`` closes those unused for ``idle_s``.
    ``busy(value)``, when given, says a value may not be closed now (it stays, even past the cap)."""

    def __init__(self, cap: int, idle_s: float, close, busy=None):
        self.cap = max(1, cap)
        self.idle_s = idle_s
        self._close = close
        self._busy = busy
        self._items: OrderedDict = OrderedDict()       # key -> [value, last use (monotonic)]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def keys(self) -> list:
        return list(self._items)

    def values(self) -> list:
        with self._lock:
            return [item[0] for item in self._items.values()]

    def get(self, key):
        """The value kept for ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            item[1] = time.monotonic()
            self._items.move_to_end(key)
            return item[0]

    def peek(self, key):
        """The value kept for ``key`` without counting a use, or None."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def add(self, key, value):
        """Keep ``value`` for ``key``, or return the one another thread kept meanwhile; past the cap the least
        recently used others are closed."""
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                return item[0]
            self._items[key] = [value, time.monotonic()]
            out = self._take(lambda: len(self._items) > self.cap, keep=key)
        self._closing(out)
        return value

    def pop(self, key):
        """Stop keeping ``key`` (not closed: the caller's); its value or None."""
        with self._lock:
            item = self._items.pop(key, None)
        return None if item is None else item[0]

    def trim(self, over, keep=None) -> int:
        """Close the least recently used, one at a time, while ``over()`` (never ``keep``); returns how many."""
        n = 0
        while over():
            with self._lock:
                out = self._take(lambda: True, keep, most=1)
            if not out:
                break
            self._closing(out)
            n += 1
        return n

    def sweep(self, idle_s: float | None = None) -> int:
        """Close what has not been used for ``idle_s`` (the kept's own by default); returns how many."""
        limit = time.monotonic() - (self.idle_s if idle_s is None else idle_s)
        with self._lock:
            out = []
            for key, (value, used) in list(self._items.items()):
                if used > limit:
                    break                   # (in order of use: the rest are newer)
                if self._busy is None or not self._busy(value):
                    del self._items[key]
                    out.append((key, value))
        self._closing(out)
        return len(out)

    def close_all(self) -> None:
        with self._lock:
            out = list((k, item[0]) for k, item in self._items.items())
            self._items.clear()
        self._closing(out)

    def _take(self, over, keep, most: int | None = None) -> list:
        """(under the lock) the least recently used out while ``over()`` (at most ``most``), skipping ``keep``
        and busy ones."""
        out = []
        for key in list(self._items):
            if not over() or (most is not None and len(out) >= most):
                break
            if key == keep:
                continue
            value = self._items[key][0]
            if self._busy is not None and self._busy(value):
                continue
            del self._items[key]
            out.append((key, value))
        return out

    def _closing(self, out: list) -> None:
        for key, value in out:
            self._close(key, value)
