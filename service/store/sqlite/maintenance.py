"""Background maintenance (docs/design.md §5): indexing, read-index sync and the janitor.

In each process one maintenance worker (service/store/loop.py) does the maintenance of the tenants it leads: the
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
from ...change_numbers import CATALOG

log = logging.getLogger(__name__)

# Read-your-writes (service/store/sqlite/search.py): how long a push may sit between its catalog reservation and
# its shard write (normally milliseconds; longer only when it waits for the shard's lock) and still
# be read from the primaries by a default search. One that waited longer is found at the next pass.
IN_FLIGHT_MS = 2000
FULL_SCAN_S = 1.0


class Maintenance(MaintenanceApi):
    """Background indexer, read-index sync and janitor for every tenant this process leads.

    A background pass visits a tenant only when something may be left to do (issue 49): the days a push told
    about, a tenant whose last pass left work (``_unsettled``, when that work is due: a push still in flight
    is looked at again once it has landed), or, in the scan of every tenant once per FULL_SCAN_S, one whose
    catalog has committed since its last pass (its CATALOG change number, service/change_numbers.py: every push,
    delete, forget and expiry commits there first). An idle tenant costs a look at one number a second; the
    janitor visits it again when its first unit may expire."""

    def __init__(self, store):
        super().__init__(store)
        self._recovered: set[str] = set()
        # Days pushes wrote since this tenant's last pass: a pass reads only those, and every live
        # day once per FULL_SCAN_S (what a lost wake-up or another program's write left behind).
        self._dirty: dict[str, set[str]] = {}
        self._dirty_lock = threading.Lock()
        self._last_full = 0.0
        self.janitor = Janitor()
        self._seen: dict[str, int] = {}           # tenant -> CATALOG number when its last pass began
        self._unsettled: dict[str, float] = {}    # tenant whose last pass left work -> when it is due (monotonic)
        self._swept: dict[str, tuple[int, int | None]] = {}   # tenant -> (CATALOG number, next expiry): janitor idle

    def stopped(self) -> None:
        self.step_down()

    def step_down(self) -> None:
        if not self._locks and not len(self.read_syncs):
            return
        super().step_down()
        self._recovered.clear()        # leading again later starts with a full pass over every file
        self._seen.clear()
        self._unsettled.clear()
        self._swept.clear()

    def mark(self, tenant: str | None, days) -> None:
        if tenant is not None and days:
            with self._dirty_lock:
                self._dirty.setdefault(tenant, set()).update(days)

    def background_pass(self) -> int:
        full = time.monotonic() - self._last_full >= FULL_SCAN_S
        return self.run_once(full=full, skip_quiet=True)

    def run_once(self, force_janitor: bool = False, full: bool = True, skip_quiet: bool = False) -> int:
        """One pass over the tenants this process leads; returns rows indexed. ``full``: every live day
        (what a direct call wants); else the days pushes told about since the last pass, of the tenants told
        about or left unsettled. ``skip_quiet`` (the maintenance worker's passes): not the tenants nothing can
        have changed for since their last pass found nothing left."""
        total = 0
        janitor_due = self.janitor_due(force_janitor)
        if full:
            self._last_full = time.monotonic()
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
        now = time.monotonic()
        names = (self.store.tenant_names() if full or janitor_due else
                 sorted(set(dirty) | {n for n, due in self._unsettled.items() if due <= now}))
        for name in names:
            if self._stop.is_set():
                break
            number = self.store.change_numbers.read(CATALOG, name)     # (before anything of the tenant is read)
            janitor = janitor_due and (force_janitor or not skip_quiet or self._janitor_wants(name, number))
            if skip_quiet and name not in dirty and not janitor and not self._wanted(name, number, now):
                continue
            if not self.leads(name):
                continue
            try:
                total += self._tenant_pass(name, number, full, dirty.get(name, set()), janitor)
            finally:
                self.let_go(name)
        if janitor_due:
            self._last_janitor = time.time()
        return total

    def _wanted(self, name: str, number: int, now: float) -> bool:
        """Whether a tenant may have work: not seen since start, its catalog changed since its last pass, or
        that pass left work due by now."""
        due = self._unsettled.get(name)
        return (name not in self._recovered or self._seen.get(name) != number
                or (due is not None and due <= now))

    def _janitor_wants(self, name: str, number: int) -> bool:
        """Whether the janitor may have something to do: the catalog changed since its last idle run, or a
        unit may have expired since."""
        swept = self._swept.get(name)
        return swept is None or swept[0] != number or (swept[1] is not None and swept[1] <= time.time())

    def _tenant_pass(self, name: str, number: int, full: bool, days: set[str], janitor: bool) -> int:
        """Index, janitor and read-index sync of one tenant; then whether it has settled (nothing left) or
        when what is left is due."""
        self._seen[name] = number
        self._unsettled[name] = 0.0               # (a pass that fails leaves it due at the next)
        t = self.store.tenant(name)
        recovering = name not in self._recovered
        n = self.index_tenant(t, full, days)
        writer = self.read_sync(name)
        if janitor:
            result = self.janitor.run(t)
            for day in result["unlinked_days"]:
                if writer is not None:
                    writer.drop_day(day)
            if self.janitor.idle:
                self._swept[name] = (number, self.janitor.next_expiry(t))
            else:
                self._swept.pop(name, None)
        if writer is None:
            wait = None if n == 0 and (full or recovering) else 0.0
        elif writer.due() or janitor:
            wait = self.sync_read_index(writer)
        else:
            wait = writer.wait()
        if wait is None:
            del self._unsettled[name]
        else:
            self._unsettled[name] = time.monotonic() + wait
        return n

    def read_sync(self, tenant: str) -> readsync.ReadSync | None:
        """This leader's writer of the tenant's read index (None when searches do not use one)."""
        if not self.config.replicas:
            return None
        w = self.read_syncs.get(tenant)
        if w is None:
            w = self.read_syncs.add(tenant, readsync.ReadSync(self.store, tenant))
        return w

    def sync_read_index(self, writer) -> float | None:
        """One read-index pass, then what it still lacks (a push may have landed meanwhile). None when it lacks
        nothing and no push is in flight (the tenant has settled), else the seconds until a pass is due."""
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
        low = min(low, settled[0] + 1 if settled else 0)
        state = {"seq": seq, "backlog": backlog, "oldest_ms": oldest, "low": low}
        if sent or state != writer.state:
            writer.write_state(**state)
        if sent or backlog or writer.building:
            return 0.0
        return None if low > seq else IN_FLIGHT_MS / 1000     # (in flight: landed, or found, by then)

    def index_tenant(self, t, full: bool = True, days: set[str] | None = None) -> int:
        """Drain the pending rows of a tenant's shards: the ``days`` pushes wrote since the last pass, or
        (``full``) every live day, or every file once after start (crash recovery)."""
        if t.name not in self._recovered:
            todo = t.primary_days()
            self._recovered.add(t.name)
        elif full:
            todo = t.live_days()
        else:
            todo = sorted(days or ())
        total = 0
        for day in todo:
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
