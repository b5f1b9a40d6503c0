"""The store API (docs/design.md §2): push, get, lineage, delete, recent, search.

Only the store knows about files, SQL and worker pools. HTTP views and adapters (MCP, Dify,
Continue) call these methods with a tenant name that auth already checked.

Push protocol, per group of concurrent requests (service/store/sqlite/groupcommit.py; one request when it
arrives alone): (1) one catalog transaction reserves each new CID with its per-tenant ``seq`` (or
finds a duplicate / collision); (2) one transaction per day shard stores the rows as pending;
(3) only then each request's ack. A crash between (1) and (2) leaves a catalog row without a shard
row: it was never acked, reads treat it as absent, and a later push of the same CID repairs it. A
crash between (2) and (3) leaves units stored but unacknowledged: a re-push says "duplicate".
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import tempfile
import threading
import time

from ...budget import FILES, Budget, Kept
from ...config import Config
from ...errors import ApiError, NotFound
from ...formats import TENANT_RE, is_cid
from ...readindex.reader import Readers
from ...tokenize import tokenizer_for
from ...units import now_ms, unit_dict
from ..base import StoreApi
from ..push import PushPlan, check_day_cap, collision
from . import manage, readsync
from .connections import OpenShards
from .groupcommit import Group, Job
from .queries import fetch_all, fetch_one, sql
from .search import Searcher
from .tenant import Tenant
from .threads import CatalogThreads

log = logging.getLogger(__name__)

# A catalog reservation older than this without its shard row is a crashed, never-acked push.
STALE_RESERVATION_MS = 30_000


class Store(StoreApi):
    """The SQLite backend: per tenant a catalog and day files under ``data_dir`` (docs/design.md §5)."""

    manage = manage         # list, stats, export and forget (service/store/sqlite/manage.py)

    def __init__(self, config: Config):
        super().__init__(config)
        self.root = config.data_path
        (self.root / "tenants").mkdir(parents=True, exist_ok=True)
        # What this process keeps open for its tenants, and for how long (service/budget.py, issue 49): the
        # least recently used tenant's files are closed past the budget, an idle one's by ``sweep``.
        self.budget = Budget.of(config)
        self._tenants = Kept(self.budget.tenants, self.budget.idle_s, self._close_tenant)
        self._lock = threading.RLock()            # (re-entered: opening a tenant may close another)
        self._groups: dict[str, Group] = {}        # tenant -> its pushes' group commit
        self._names: tuple | None = None          # (folder's mtime, names) of the last listing old enough to keep
        self.closers: list = []     # callables(tenant) told when this process closes a tenant's files
        self.listeners: list = []   # callables(tenant, days) told about new pending rows
        # callables(tenant, changes) told about stored and deleted units, each {"status", "cid"} (
        # the change log of service/store/sqlite/live.py); called after the change is durable, must not raise
        self.observers: list = []
        # the primary day files kept open, with each tenant's share (365 days in one push reached ~2,250
        # descriptors per worker before there was a cap), as many as the budget holds
        self.open_shards = OpenShards(config, self.budget.shards)
        self.tokenizer = tokenizer_for(config)       # the one tokenizer: indexing and queries
        # this process's readers of the tenants' read indexes (a tantivy file watcher each while loaded)
        self.readers = Readers(self.root, self.budget.read_indexes, self.budget.idle_s)
        self.change_numbers = self.readers.change_numbers          # the change numbers of this data folder (service/change_numbers.py)
        self.searcher = Searcher(config, self.tokenizer, self.readers)
        self.closers.append(self.searcher.forget)

    # --- tenants ------------------------------------------------------------------------------
    def tenant(self, name: str) -> Tenant:
        """The tenant's files, opened in this process if they are not (and another's closed if over budget)."""
        t = self._tenants.get(name)
        if t is None:
            with self._lock:
                t = self._tenants.get(name)
                if t is None:
                    t = self._tenants.add(name, Tenant(self.root, name, self.config, self.open_shards))
            self._tenants.trim(lambda: FILES.value > self.budget.files, keep=name)
        return t

    def _close_tenant(self, name: str, t: Tenant) -> None:
        """Close what this process keeps open for a tenant; its next request opens it again."""
        with self._lock:
            g = self._groups.get(name)
            if g is not None and g.idle():
                del self._groups[name]
        t.close()
        for closer in self.closers:
            closer(name)

    def sweep(self) -> None:
        """Close the tenants unused for ``CONTEXT_TENANT_IDLE_S``, and read indexes; then the least recently
        used while this process's files are over the budget (what the maintenance worker calls)."""
        self._tenants.sweep()
        self._tenants.trim(lambda: FILES.value > self.budget.files)
        self.readers.sweep()

    def open_tenants(self) -> list[str]:
        """The tenants whose files this process keeps open, least recently used first."""
        return self._tenants.keys()

    def tenant_names(self) -> list[str]:
        """Every tenant with a folder. The listing is kept while the folder's mtime stays the same and was
        more than a second old when listed (two tenants made within one clock tick leave it the same)."""
        base = self.root / "tenants"
        mtime = os.stat(base).st_mtime_ns
        known = self._names
        if known is not None and known[0] == mtime:
            return list(known[1])
        with os.scandir(base) as entries:
            names = sorted(e.name for e in entries if TENANT_RE.match(e.name) and e.is_dir())
        if time.time_ns() - mtime > 1_000_000_000:
            self._names = (mtime, names)
        return list(names)

    def close(self) -> None:
        self.searcher.close()
        self._tenants.close_all()
        self.readers.close()

    # --- push ---------------------------------------------------------------------------------
    def push_many(self, tenant: str, raws: list) -> list[dict | ApiError]:
        """Validate and store units; per item a result dict or the ApiError that rejected it."""
        now = time.time()
        results, valid = self.validate(raws, now)
        if valid:
            t = self.tenant(tenant)
            self._check_days(t, {u.day for _, u in valid})
            self._group(t).submit(Job(valid, results, now))
        return results  # type: ignore[return-value]

    def _group(self, t: Tenant) -> Group:
        g = self._groups.get(t.name)
        if g is None:
            name = t.name
            # (the tenant looked up at each write: the one this push met may be closed by then)
            with self._lock:
                g = self._groups.setdefault(name, Group(lambda jobs: self._write_group(self.tenant(name), jobs),
                                                        self.config.group_commit_units))
        return g

    def _write_group(self, t: Tenant, jobs: list[Job]) -> None:
        """The units of these requests in one catalog transaction, then one per day file; each
        request's results in its own slots."""
        valid, results, owners = [], [], []
        for job in jobs:
            for i, u in job.valid:
                valid.append((len(results), u))
                results.append(None)
                owners.append((job, i))
        planned = t.catalog.write(self._reserve, t, valid, max(job.now for job in jobs), results)
        self._store_rows(t, planned, results)
        for (job, i), result in zip(owners, results):
            job.results[i] = result

    def _check_days(self, t: Tenant, days: set[str]) -> None:
        """Each day is a file (and its replica and WAL): one request may not create hundreds of them.
        Refused before anything is stored."""
        self.check_days_per_request(days)
        check_day_cap(self.config.max_days_per_tenant, len([d for d in days if not t.has_day(d)]),
                      lambda: len(t.primary_days()))

    def _reserve(self, conn: sqlite3.Connection, t: Tenant, valid, now: float, results) -> list:
        """Catalog transaction: assign seqs, detect duplicates and collisions, check parents."""
        planned = []          # (index, unit, seq, status)
        ms = now_ms()
        # The catalog rows of every CID and parent of the batch, in one query (service/store/push.py).
        wanted = {u.cid for _, u in valid} | {u.parent_cid for _, u in valid if u.parent_cid}
        plan = PushPlan({r["cid"]: dict(r) for r in conn.execute(sql("catalog_get_many"),
                                                                 {"cids": json.dumps(sorted(wanted))})},
                        now, stale=lambda row: self._stale_reservation(t, row, ms), threads=CatalogThreads(conn),
                        gap=self.config.thread_gap_s)
        for i, u in valid:
            try:
                row, replace = plan.check(u)
                if replace:
                    conn.execute(sql("catalog_delete"), {"cid": u.cid})
                thread, tpos = plan.thread(u, row)
                params = {"cid": u.cid, "day": u.day, "timestamp": u.timestamp, "source": u.source,
                          "digest": u.digest, "expires_at": u.expires_at, "parent_cid": u.parent_cid,
                          "reserved_ms": ms, "thread": thread, "tpos": tpos}
                if row is None:
                    seq = conn.execute(sql("catalog_insert"), params).lastrowid
                    status = "ok"
                else:
                    conn.execute(sql("catalog_update_mutable"), params)
                    seq, status = row["seq"], "duplicate"
                    params["reserved_ms"] = row["reserved_ms"]
                plan.planned(u, params | {"seq": seq})
                planned.append((i, u, seq, status, thread, tpos))
            except ApiError as e:
                results[i] = e
        # One days row update per day of the batch, not per unit.
        for day, (lo, hi) in plan.expiry.items():
            conn.execute(sql("days_upsert"), {"day": day, "min_expires_at": lo, "max_expires_at": hi})
        return planned

    def _stale_reservation(self, t: Tenant, row, ms: int) -> bool:
        """A catalog row whose shard row never arrived (crashed push) and is old enough not to be in flight."""
        if ms - row["reserved_ms"] < STALE_RESERVATION_MS:
            return False
        shard = t.shard(row["day"], create=False)
        if shard is None:
            return True
        return shard.read(fetch_one, "unit_exists", {"cid": row["cid"]}) is None

    def _store_rows(self, t: Tenant, planned: list, results: list) -> None:
        by_day: dict[str, list] = {}
        for item in planned:
            by_day.setdefault(item[1].day, []).append(item)
        ms = now_ms()
        for day, items in by_day.items():
            t.shard(day).write(self._insert_rows, items, ms, results)
        for listener in self.listeners:
            listener(t.name, list(by_day))
        if self.observers:
            stored = [r for r in results if isinstance(r, dict)]
            for observer in self.observers:
                observer(t.name, stored)

    @staticmethod
    def _insert_rows(conn: sqlite3.Connection, items: list, ms: int, results: list) -> None:
        touched = False
        for i, u, seq, status, thread, tpos in items:
            if status == "duplicate" and conn.execute(sql("unit_exists"), {"cid": u.cid}).fetchone() is None:
                status = "ok"   # reserved by an earlier push that failed before its shard write: first store
            cur = conn.execute(sql("unit_upsert"), {**u.columns(seq=seq, thread=thread, tpos=tpos), "pushed_ms": ms})
            if cur.rowcount == 0:
                results[i] = collision(u.cid)      # the shard holds a different unit under this CID: kept
                continue
            touched = touched or status == "duplicate"
            results[i] = {"status": status, "cid": u.cid, "seq": seq, "indexed": False}
        if touched:
            conn.execute(sql("meta_touch"), {"now_ms": ms})

    # --- reads --------------------------------------------------------------------------------
    def _locate(self, tenant: str, cid: str) -> tuple[Tenant, sqlite3.Row] | None:
        if not is_cid(cid):
            return None
        t = self.tenant(tenant)
        row = t.catalog.read(lambda c: c.execute(sql("catalog_get"), {"cid": cid}).fetchone())
        if row is None or row["expires_at"] <= time.time():
            return None
        return t, row

    def get(self, tenant: str, cid: str) -> dict | None:
        """One live unit, or None (unknown, expired or never acked)."""
        found = self._locate(tenant, cid)
        if found is None:
            return None
        t, row = found
        shard = t.shard(row["day"], create=False)
        if shard is None:
            return None
        urow = shard.read(lambda c: c.execute(sql("unit_get"), {"cid": cid, "now": int(time.time())}).fetchone())
        return unit_dict(urow) if urow is not None else None

    def thread_window(self, tenant: str, cids: list[str], n: int) -> dict[str, list[tuple[int, dict]]]:
        t = self.tenant(tenant)
        now = int(time.time())
        places = t.catalog.read(lambda c: {cid: c.execute(sql("catalog_window"), {"cid": cid, "n": n, "now": now})
                                           .fetchall() for cid in cids})
        units = manage.units_of_rows(t, [r for rows in places.values() for r in rows], now)
        return {cid: [(r["offset"], units[r["cid"]]) for r in rows if r["cid"] in units] for cid, rows in places.items()}

    def children(self, tenant: str, cid: str, limit: int) -> list[str]:
        rows = self.tenant(tenant).catalog.read(lambda c: c.execute(
            sql("catalog_children"), {"cid": cid, "now": int(time.time()), "limit": limit}).fetchall())
        return [r["cid"] for r in rows]

    def recent(self, tenant: str, limit: int = 50, before_seq: int | None = None) -> list[dict]:
        """Live units, newest (highest seq) first, strictly below ``before_seq``."""
        t = self.tenant(tenant)
        out: list[dict] = []
        before = before_seq if before_seq is not None else 2**62
        while len(out) < limit:
            rows = t.catalog.read(fetch_all, "catalog_recent",
                                  {"now": int(time.time()), "before": before, "limit": limit - len(out)})
            if not rows:
                break
            for r in rows:
                u = self.get(tenant, r["cid"])
                if u is not None:
                    out.append(u)
            before = rows[-1]["seq"]
        return out

    def delete(self, tenant: str, cid: str) -> dict:
        """Remove a unit everywhere: shard row, FTS row, catalog (the read index on its next pass)."""
        found = self._locate(tenant, cid)
        if found is None:
            raise NotFound(f"No live unit with CID {cid!r}.", field="cid")
        t, row = found
        if not self.remove(tenant, {row["day"]: [cid]}):     # also leaves default searches at once
            raise NotFound(f"No live unit with CID {cid!r}.", field="cid")
        return {"status": "deleted", "cid": cid}

    # --- operations -----------------------------------------------------------------------------
    def freshness(self, tenant: str) -> dict:
        """What a default search of this tenant cannot see yet, counted now in every shard (readiness,
        metrics, stats): ``index_pending`` units, the oldest of them waiting ``replica_lag_ms``, and whether
        default searches read the ``read_index`` (else the primaries)."""
        t = self.tenant(tenant)
        view = self.searcher.view(t)
        pending, lag_ms = self.searcher.freshness(t, t.live_days(), view, exact=True)
        return {"index_pending": pending, "replica_lag_ms": lag_ms, "read_index": view is not None}

    def read_index_lag(self, tenant: str) -> dict | None:
        if not self.config.replicas:
            return None
        units, oldest, _ = readsync.backlog(self.tenant(tenant))
        return {"units": units, "lag_ms": max(0, now_ms() - oldest) if oldest else 0}

    def read_index_state(self, tenant: str) -> dict | None:
        """The read index's state (low-water mark, seq of its last pass, backlog) when default searches of
        this tenant read it; None when they read the primaries (live context, service/hub.py)."""
        t = self.tenant(tenant)
        if self.searcher.view(t) is None:
            return None
        return self.readers.state(t.name) or {}

    def max_seq(self, tenant: str) -> int:
        """The tenant's newest acked seq (forget binds its confirmation to it, service/api/manage.py)."""
        return self.tenant(tenant).max_seq()

    def live_counts(self, tenant: str) -> dict:
        """Live units of the tenant, with its freshness (/metrics; /mcp/stats is ``stats``)."""
        return {"units_live": self.tenant(tenant).count_live(), **self.freshness(tenant)}

    def check_writable(self) -> str | None:
        """None when the data directory takes real bytes (readiness); otherwise the problem."""
        try:
            # Write real bytes: on a full disk creating an empty file still succeeds.
            fd, path = tempfile.mkstemp(dir=self.root, prefix=".ready-")
            try:
                os.write(fd, b"\0" * 65536)
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(path)
            return None
        except OSError as e:
            return f"data directory not writable: {e.strerror}"

    # --- search -------------------------------------------------------------------------------
    def _search(self, tenant: str, params) -> dict:
        return self.searcher.search(self.tenant(tenant), params)
