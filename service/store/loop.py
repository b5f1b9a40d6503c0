"""A process's maintenance worker, on either store: woken by pushes or every ``index_poll_ms``,
at most one pass per ``index_debounce_ms``; idle while a maintainer process (service/maintainer.py) does
the work; and the index lag of what it indexed. Each backend's maintenance says what a pass does."""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..budget import FILES, Kept
from ..instruments import INDEX_LAG_SECONDS

log = logging.getLogger(__name__)

SWEEP_S = 1.0            # how often the maintenance worker closes what idle tenants hold


class TenantLock:
    """Non-blocking leadership of one tenant's maintenance among the processes of this node (fcntl: the kernel
    lets go when the process dies, and another takes over within one poll)."""

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
        FILES.add(1)
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            FILES.add(-1)


class MaintenanceApi:
    """A process's maintenance worker: woken by pushes (``notify``) or every
    ``index_poll_ms``, it calls ``run_once``; the tenants it leads on this node (``leads``) and their read
    indexes' writers (``read_syncs``); and the index lag of what it indexed. Both storage backends'
    ``Maintenance`` build on it (tests/test_code_shape.py: what both implement is declared here)."""

    janitor: object     # the backend's Janitor (its janitor.py): ``run`` cleans one tenant, and returns what it did

    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.tokenizer = store.tokenizer
        self.pool = ThreadPoolExecutor(max(1, self.config.index_threads), thread_name_prefix="indexer")
        self.lags: collections.deque = collections.deque(maxlen=10_000)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_janitor = 0.0
        self._worker: threading.Thread | None = None
        # In a gunicorn worker: the maintainer process (service/maintainer.py) that, while it runs,
        # does this work instead; None in the maintainer itself and wherever no maintainer is started.
        self.presence = None
        self._deferring = False       # as of this worker's last look (every index_poll_ms)
        # The tenants this process leads right now: a tenant's lock is held during its pass, and after it while
        # this process keeps its read index's writer open (``let_go``), so never more than a few (issue 49).
        self._locks: dict[str, TenantLock] = {}
        # tenant -> the writer of its read index on this node (the backend's ReadSync): a few kept open, the least
        # recently used and the idle closed (each holds tantivy's indexing workers); one still building is kept
        budget = store.budget
        self.read_syncs = Kept(budget.writers, budget.idle_s, self._close_writer, busy=lambda sync: sync.building)
        self._last_sweep = 0.0
        store.listeners.append(self.notify)

    def start(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="maintenance", daemon=True)
            self._worker.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None
        self.pool.shutdown(wait=True)
        self.stopped()
        if self.presence is not None:
            self.presence.close()

    def stopped(self) -> None:
        """What a subclass releases once the worker has stopped."""

    def notify(self, tenant: str | None, days) -> None:
        """A push wrote pending rows of ``tenant`` into ``days``: index them soon."""
        if self._deferring:
            self.presence.wake(tenant, days)   # this worker has nothing to do: waking it would cost the push
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
                self.sweep()
                if self.deferred():
                    self.step_down()
                    continue
                self.background_pass()
            except Exception:  # keep the loop alive; the next pass retries (the queue is durable)
                log.exception("maintenance pass failed")
                time.sleep(1)

    def sweep(self) -> None:
        """At most once a second: close what this process keeps open for tenants idle for CONTEXT_TENANT_IDLE_S
        (their files, read indexes, writers; service/budget.py), so an idle node holds next to nothing."""
        if time.monotonic() - self._last_sweep < SWEEP_S:
            return
        self._last_sweep = time.monotonic()
        self.read_syncs.sweep()
        self.store.sweep()

    def run_once(self, force_janitor: bool = False) -> int:
        raise NotImplementedError

    def background_pass(self) -> int:
        """What the worker runs when woken or every poll interval."""
        return self.run_once()

    def leads(self, tenant: str) -> bool:
        """Whether this process leads the tenant's maintenance on this node (``tenants/<tenant>/maintenance.lock``
        in the data folder: one process per node and tenant). Taken for a pass; ``let_go`` after it."""
        lock = self._locks.get(tenant)
        if lock is None:
            folder = self.store.root / "tenants" / tenant
            folder.mkdir(parents=True, exist_ok=True)
            lock = TenantLock(folder / "maintenance.lock")
            if not lock.try_acquire():
                return False
            self._locks[tenant] = lock
        return True

    def let_go(self, tenant: str) -> None:
        """After a tenant's pass: its lock goes unless this process keeps the writer of its read index open
        (another process may lead it next; a new leader replaces what it sends, as after a crash)."""
        if tenant not in self.read_syncs:
            lock = self._locks.pop(tenant, None)
            if lock is not None:
                lock.release()

    def _close_writer(self, tenant: str, sync) -> None:
        """A read index's writer no longer kept (idle, or least recently used): close it, then let go of the
        tenant (tantivy's own writer lock is released once the writer is closed)."""
        sync.close()
        lock = self._locks.pop(tenant, None)
        if lock is not None:
            lock.release()

    def read_sync(self, tenant: str):
        """This leader's writer of the tenant's read index (None when searches do not use one)."""
        raise NotImplementedError

    def step_down(self) -> None:
        """Let go of what this process leads, so a maintainer process can take it over."""
        self.read_syncs.close_all()
        for lock in self._locks.values():
            lock.release()
        self._locks.clear()

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
