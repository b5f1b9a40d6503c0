"""Background maintenance (docs/design.md §5): indexing, read-index sync and the janitor.

In each process one background thread does the maintenance of the tenants it leads: the
process that holds a tenant's ``maintenance.lock`` (fcntl, released by the kernel when the
process dies) indexes (service/store/sqlite/indexer.py), keeps the read index in step (service/store/sqlite/readsync.py)
and runs the janitor (service/store/sqlite/janitor.py) for that tenant; the others take over within one poll
interval when it dies.
"""
from __future__ import annotations

import logging
import threading
import time

from ...instruments import UNITS_INDEXED
from ..loop import MaintenanceApi
from . import readsync
from .indexer import index_pending
from .janitor import Janitor
from .queries import fetch_one

log = logging.getLogger(__name__)

# Read-your-writes (service/store/sqlite/search.py): how long a push may sit between its catalog reservation and
# its shard write (normally milliseconds; longer only when it waits for the shard's lock) and still
# be read from the primaries by a default search. One that waited longer is found at the next pass.
IN_FLIGHT_MS = 2000
FULL_SCAN_S = 1.0


class Maintenance(MaintenanceApi):
    """Background indexer, read-index sync and janitor for every tenant this process leads."""

    def __init__(self, store):
        super().__init__(store)
        self._recovered: set[str] = set()
        # Days pushes wrote since this tenant's last pass: a pass reads only those, and every live
        # day once per FULL_SCAN_S (what a lost wake-up or another program's write left behind).
        self._dirty: dict[str, set[str]] = {}
        self._dirty_lock = threading.Lock()
        self._last_full = 0.0
        self.janitor = Janitor()

    def stopped(self) -> None:
        self.step_down()

    def step_down(self) -> None:
        if not self._locks and not self.read_syncs:
            return
        super().step_down()
        self._recovered.clear()        # leading again later starts with a full pass over every file

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
            writer = self.read_sync(name)
            if janitor_due:
                for day in self.janitor.run(t)["unlinked_days"]:
                    if writer is not None:
                        writer.drop_day(day)
            if writer is not None and (writer.due() or janitor_due):
                self.sync_read_index(writer)
        if janitor_due:
            self._last_janitor = time.time()
        return total

    def read_sync(self, tenant: str) -> readsync.ReadSync | None:
        """This leader's writer of the tenant's read index (None when searches do not use one)."""
        if not self.config.replicas:
            return None
        w = self.read_syncs.get(tenant)
        if w is None:
            w = self.read_syncs[tenant] = readsync.ReadSync(self.store.tenant(tenant), self.config, self.store.readers)
        return w

    def sync_read_index(self, writer) -> int:
        """One read-index pass, then what it still lacks (a push may have landed meanwhile)."""
        t = writer.t
        start_ms = int(time.time() * 1000)
        seq = t.max_seq()
        sent = writer.sync()
        backlog, oldest, low = readsync.backlog(t, seq)
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
