"""Background maintenance (DESIGN.md section 5): indexing, read-index sync and the janitor.

In each process one background thread does the maintenance of the tenants it leads: the
process that holds a tenant's ``maintenance.lock`` (fcntl, released by the kernel when the
process dies) indexes (service/indexer.py), keeps the read index in step (service/readindex.py)
and runs the janitor (service/janitor.py) for that tenant; the others take over within one poll
interval when it dies. (Moved here from service/indexer.py, issue 13.)
"""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from . import readindex
from .indexer import index_pending
from .instruments import INDEX_LAG_SECONDS, UNITS_INDEXED
from .janitor import Janitor
from .shards import fetch_one

log = logging.getLogger(__name__)

# Read-your-writes (service/search.py): how long a push may sit between its catalog reservation and
# its shard write (normally milliseconds; longer only when it waits for the shard's lock) and still
# be read from the primaries by a default search. One that waited longer is found at the next pass.
IN_FLIGHT_MS = 2000
FULL_SCAN_S = 1.0


class TenantLock:
    """Non-blocking, process-wide leadership of one tenant's maintenance."""

    def __init__(self, path):
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        if self.fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Loop:
    """A process's background maintenance thread: woken by pushes (``notify``) or every
    ``index_poll_ms``, it calls ``run_once``; and the index lag of what it indexed. Both storage
    backends' maintenance build on it (service/pg/maintenance.py: PostgreSQL's)."""

    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.tokenizer = store.tokenizer
        self.pool = ThreadPoolExecutor(max(1, self.config.index_threads), thread_name_prefix="indexer")
        self.lags: collections.deque = collections.deque(maxlen=10_000)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_janitor = 0.0
        self._thread: threading.Thread | None = None
        # In a gunicorn worker: the maintainer process (service/maintainer.py) that, while it runs,
        # does this work instead; None in the maintainer itself and wherever no maintainer is started.
        self.presence = None
        self._deferring = False       # as of this thread's last look (every index_poll_ms)
        store.listeners.append(self.notify)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="maintenance", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.pool.shutdown(wait=True)
        self.stopped()
        if self.presence is not None:
            self.presence.close()

    def stopped(self) -> None:
        """What a subclass releases once the thread has stopped."""

    def notify(self, tenant: str | None, days) -> None:
        """A push wrote pending rows of ``tenant`` into ``days``: index them soon."""
        if self._deferring:
            self.presence.wake(tenant, days)   # this thread has nothing to do: waking it would cost the push
        else:
            self.mark(tenant, days)
            self._wake.set()

    def mark(self, tenant: str | None, days) -> None:
        """Remember where new rows are (a backend whose queue is one table has no use for it)."""

    def deferred(self) -> bool:
        """True while a maintainer process does this work (this process then leads nothing)."""
        self._deferring = self.presence is not None and self.presence.alive()
        return self._deferring

    def _run(self) -> None:
        last_pass = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.config.index_poll_ms / 1000)
            # Passes at most every index_debounce_ms: under a steady stream of pushes each pass then
            # indexes many rows in one transaction instead of one or two (a commit is most of the cost).
            self._stop.wait(last_pass + self.config.index_debounce_ms / 1000 - time.monotonic())
            self._wake.clear()
            last_pass = time.monotonic()
            try:
                if self.deferred():
                    self.step_down()
                    continue
                self.background_pass()
            except Exception:  # keep the loop alive; the next pass retries (the queue is durable)
                log.exception("maintenance pass failed")
                time.sleep(1)

    def run_once(self, force_janitor: bool = False) -> int:
        raise NotImplementedError

    def background_pass(self) -> int:
        """What the thread runs when woken or every poll interval."""
        return self.run_once()

    def step_down(self) -> None:
        """Let go of what this process leads, so a maintainer process can take it over."""

    def lag_report(self) -> dict:
        """Index lag percentiles of whoever indexes for this process: the maintainer while one runs."""
        status = self.presence.status() if self.presence is not None else None
        if status is not None and isinstance(status.get("index_lag_ms"), dict):
            return status["index_lag_ms"]
        return self.lag_percentiles()

    def janitor_due(self, force: bool) -> bool:
        return force or time.time() - self._last_janitor >= self.config.janitor_interval_s

    def _record_lags(self, lags_ms: list[float]) -> None:
        self.lags.extend(lags_ms)
        for lag in lags_ms:
            INDEX_LAG_SECONDS.observe(lag / 1000)

    def lag_percentiles(self) -> dict:
        lags = sorted(self.lags)
        if not lags:
            return {"p50_ms": None, "p99_ms": None}
        return {"p50_ms": round(lags[len(lags) // 2], 1), "p99_ms": round(lags[min(len(lags) - 1, int(len(lags) * 0.99))], 1)}


class Maintenance(Loop):
    """Background indexer, read-index sync and janitor for every tenant this process leads."""

    def __init__(self, store):
        super().__init__(store)
        self._locks: dict[str, TenantLock] = {}
        self._recovered: set[str] = set()
        # Days pushes wrote since this tenant's last pass: a pass reads only those, and every live
        # day once per FULL_SCAN_S (what a lost wake-up or another program's write left behind).
        self._dirty: dict[str, set[str]] = {}
        self._dirty_lock = threading.Lock()
        self._last_full = 0.0
        self.janitor = Janitor()
        self.read_writers: dict[str, readindex.Writer] = {}

    def stopped(self) -> None:
        self.step_down()

    def step_down(self) -> None:
        if not self._locks and not self.read_writers:
            return
        for w in self.read_writers.values():
            w.close()
        self.read_writers.clear()
        for lock in self._locks.values():
            lock.release()
        self._locks.clear()
        self._recovered.clear()        # leading again later starts with a full pass over every file

    def leads(self, tenant: str) -> bool:
        lock = self._locks.get(tenant)
        if lock is None:
            lock = self._locks[tenant] = TenantLock(self.store.tenant(tenant).dir / "maintenance.lock")
        return lock.try_acquire()

    def mark(self, tenant: str | None, days) -> None:
        if tenant is not None and days:
            with self._dirty_lock:
                self._dirty.setdefault(tenant, set()).update(days)

    def background_pass(self) -> int:
        full = time.monotonic() - self._last_full >= FULL_SCAN_S
        return self.run_once(full=full)

    def run_once(self, force_janitor: bool = False, full: bool = True) -> int:
        """One pass over the tenants this process leads; returns rows indexed. ``full``: every live day
        (what a direct call wants); else the days pushes told about since the last pass."""
        total = 0
        janitor_due = self.janitor_due(force_janitor)
        if full:
            self._last_full = time.monotonic()
        for name in self.store.tenant_names():
            if self._stop.is_set() or not self.leads(name):
                continue
            t = self.store.tenant(name)
            total += self.index_tenant(t, full)
            writer = self.read_writer(t)
            if janitor_due:
                for day in self.janitor.run(t)["unlinked_days"]:
                    if writer is not None:
                        writer.drop_day(day)
            if writer is not None and (writer.due() or janitor_due):
                self.sync_read_index(writer)
        if janitor_due:
            self._last_janitor = time.time()
        return total

    def read_writer(self, t):
        """This leader's writer of the tenant's read index (None when searches do not use one)."""
        if not self.config.replicas or not readindex.bm25_supported(self.config):
            return None
        w = self.read_writers.get(t.name)
        if w is None:
            w = self.read_writers[t.name] = readindex.Writer(t, self.config, self.store.readers)
        return w

    def sync_read_index(self, writer) -> int:
        """One read-index pass, then what it still lacks (a push may have landed meanwhile)."""
        t = writer.t
        start_ms = int(time.time() * 1000)
        seq = t.max_seq()
        sent = writer.sync()
        backlog, oldest, low = readindex.backlog(t, seq)
        # A push reserves its seq in the catalog, then writes its shard: one reserved before this pass
        # may reach its shard only now, so the units reserved in the last IN_FLIGHT_MS stay at or
        # past the low-water mark.
        before_ms = start_ms - IN_FLIGHT_MS
        settled = t.catalog.read(fetch_one, "catalog_reserved_before", {"seq": seq, "before_ms": before_ms})
        writer.write_state(seq, backlog, oldest, min(low, settled[0] + 1 if settled else 0))
        return sent

    def index_tenant(self, t, full: bool = True) -> int:
        """Drain the pending rows of a tenant's shards: the days pushes wrote since the last pass, or
        (``full``) every live day, or every file once after start (crash recovery)."""
        with self._dirty_lock:
            dirty = self._dirty.pop(t.name, set())
        if t.name not in self._recovered:
            days = t.primary_days()
            self._recovered.add(t.name)
        elif full:
            days = t.live_days()
        else:
            days = sorted(dirty)
        total = 0
        for day in days:
            db = t.shard(day, create=False)
            if db is None:
                continue
            while not self._stop.is_set():
                n = index_pending(db, self.tokenizer, self.config.index_batch, self.pool, self._record_lags)
                total += n
                if n < self.config.index_batch:
                    break
        UNITS_INDEXED.inc(total)
        return total
