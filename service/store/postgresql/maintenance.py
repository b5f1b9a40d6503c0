"""Background maintenance on PostgreSQL: one per process on every node, with no leader for the indexer
(indexer.py) and the janitor (janitor.py); this node's read index of each tenant it leads (readsync.py).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait

from ...instruments import UNITS_INDEXED, UNITS_PURGED
from ...formats import TENANT_RE
from ..loop import MaintenanceApi
from .indexer import index_pending
from .janitor import Janitor
from .live import prune_changes
from .queries import sql
from .readsync import INDEX_CHANGES_KEEP_MS, ReadSync

log = logging.getLogger(__name__)

# Indexer transactions one process keeps in flight while its queue is long: while one's statements run on
# the server (its process waits on the socket, the GIL released), the next claims and tokenizes its batch
# (SKIP LOCKED: other rows). The two then write in turn: the second waits at the statistics rows the
# first holds until it commits, and both lock them in one order.
INDEXERS = 2


class Maintenance(MaintenanceApi):
    """The background indexer and janitor of one process (every node runs one; no leader), and this node's
    read indexes of the tenants it leads (one process of the node per tenant, as on SQLite).

    A background pass syncs a tenant's read index only when it may lack something (issue 49): the tenant's
    version (tenant_version: every change, index and purge commit) moved since its last pass left nothing, or,
    at a janitor run, a document of it may have expired. An idle tenant costs a row of one query per pass."""

    def __init__(self, store):
        super().__init__(store)
        self.janitor = Janitor(store)
        self.indexers = ThreadPoolExecutor(INDEXERS, thread_name_prefix="pg-indexer")
        self._quiet: dict[str, int] = {}          # tenant -> version when its last pass left nothing
        self._first_exp: dict[str, int] = {}      # tenant -> no document of its read index expires before this

    def stopped(self) -> None:
        self.indexers.shutdown(wait=True)
        self.step_down()

    def step_down(self) -> None:
        super().step_down()
        self._quiet.clear()

    def read_sync(self, tenant: str) -> ReadSync | None:
        """This node's writer of the tenant's read index (None when searches do not use one)."""
        if not self.config.replicas:
            return None
        ni = self.read_syncs.get(tenant)
        if ni is None:
            ni = ReadSync(self.store, tenant)
            ni.first_exp = self._first_exp.get(tenant, 0)
            ni = self.read_syncs.add(tenant, ni)
        return ni

    def sync_read_indexes(self, purge: bool = False, skip_quiet: bool = False) -> int:
        """Bring this node's read index of each tenant it leads up to date with PostgreSQL (when due).
        ``skip_quiet`` (the maintenance worker's passes): not the tenants that cannot lack anything."""
        sent = 0
        if not self.config.replicas:
            return sent
        now = int(time.time())
        for row in self.store.db.read(lambda c: c.execute(sql("tenant_versions")).fetchall()):
            tenant, version = row["tenant"], row["version"]
            if self._stop.is_set():
                break
            if skip_quiet and self._quiet.get(tenant) == version and not (purge and self._first_exp.get(tenant, 0) <= now):
                continue
            if not TENANT_RE.match(tenant) or not self.leads(tenant):
                continue
            try:
                sent += self._sync_one(tenant, version, purge)
            finally:
                self.let_go(tenant)
        return sent

    def _sync_one(self, tenant: str, version: int, purge: bool) -> int:
        self._quiet.pop(tenant, None)
        ni = self.read_sync(tenant)
        if not (ni.due() or purge or ni.building):
            return 0
        try:
            sent = ni.sync(purge=purge)
        except Exception:  # noqa: BLE001 - the next pass starts again from the last state written
            log.exception("read index of tenant %s: pass failed", tenant)
            return 0
        self._first_exp[tenant] = ni.first_exp
        if ni.caught_up and not ni.building:
            self._quiet[tenant] = version
        return sent

    def _drain(self) -> int:
        """Index queued units batch after batch until a batch comes up short (the queue is empty)."""
        total = 0
        while not self._stop.is_set():
            n = self._index_batch()
            total += n
            if n < self.config.pg_index_batch:
                break
        return total

    def _index_batch(self) -> int:
        return index_pending(self.store, self.tokenizer, self.config.pg_index_batch, pool=self.pool,
                             on_lags=self._record_lags)

    def background_pass(self) -> int:
        return self.run_once(skip_quiet=True)

    def run_once(self, force_janitor: bool = False, skip_quiet: bool = False) -> int:
        """Index every queued unit (any tenant); the janitor when due; this node's read indexes. Returns
        units indexed. ``skip_quiet`` (the maintenance worker's passes): the janitor purges only the tenants that
        may hold an expired unit, and the read indexes that cannot lack anything are not synced."""
        total = self._index_batch()       # a short queue, the usual case, is one batch in this worker, not the pool
        if total == self.config.pg_index_batch and not self._stop.is_set():
            drains = [self.indexers.submit(self._drain) for _ in range(INDEXERS)]
            wait(drains)
            total += sum(f.result() for f in drains)     # (a failed one raises once both are done)
        UNITS_INDEXED.inc(total)
        if self.janitor_due(force_janitor):
            now = int(time.time())
            tenants = (self.store.tenant_names() if not skip_quiet else
                       [r["tenant"] for r in self.store.db.read(lambda c: c.execute(
                           sql("tenants_expiring"), {"now": now}).fetchall())])
            for tenant in tenants:
                UNITS_PURGED.inc(self.janitor.run(tenant, now)["purged"])
            self.store.db.write(lambda c: c.execute(sql("pending_orphans")))
            self.store.db.write(prune_changes, int(time.time() * 1000), INDEX_CHANGES_KEEP_MS)
            self.janitor.drop_dead_partitions()
            self._last_janitor = time.time()
            self.sync_read_indexes(purge=True, skip_quiet=skip_quiet)
        else:
            self.sync_read_indexes(skip_quiet=skip_quiet)
        return total
