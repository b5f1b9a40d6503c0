"""One tenant's files (docs/design.md §5): ``tenants/<name>/catalog.db``, ``primary/DAY.db`` and
``replica/index/`` (the read index, service/readindex/).

A Tenant opens its day shards on demand; the store's ``OpenShards`` (service/store/sqlite/connections.py)
decides which stay open across tenants: a day past the tenant's share is opened for its caller alone. Searcher, maintenance and janitor hold a Tenant,
never the whole store. (The catalog, ``events.db`` and ``tools.db`` sit beside; the read index's
folder is named by service/readindex/schema.py.)"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from functools import partial
from pathlib import Path

from ...config import Config
from ...formats import DAY_FILE_RE, TENANT_RE
from . import threads
from .rows import migrate_shard
from .connections import Db, OpenShards
from ...change_numbers import CATALOG, ChangeNumbers
from .queries import fetch_all, fetch_one

SHARD_SCHEMA_VERSION = 3          # sql/sqlite/shard_schema.sql's; older files are migrated (rows.migrate_shard)

# Catalogs this process has opened with a write (their schema script run): see Tenant.__init__.
_opened: set[str] = set()


class Tenant:
    """One tenant's directory: catalog.db, primary/ day files and replica/index/ (the read index)."""

    def __init__(self, root: Path, name: str, config: Config, open_shards: OpenShards | None = None):
        if not TENANT_RE.match(name):
            raise ValueError(f"invalid tenant name {name!r}")
        self.name = name
        self.config = config
        self.dir = Path(root) / "tenants" / name
        self.open_shards = open_shards or OpenShards(config)
        (self.dir / "primary").mkdir(parents=True, exist_ok=True)
        (self.dir / "replica").mkdir(parents=True, exist_ok=True)
        # the catalog is never unlinked: its reads skip the day shards' inode check
        # every commit on it tells every process at once (a search's caches of catalog reads hold until then)
        self.change_numbers = ChangeNumbers.of(root)
        # The first open in a process runs the schema script and the upgrade (a write). A tenant the store
        # closed and opens again (issue 49) opens lazily, one read connection and no write transaction, once a
        # read says its catalog needs no upgrade (a file replaced meanwhile, as a restore does, may).
        path = self.dir / "catalog.db"
        again = str(path) in _opened and path.exists()
        self.catalog = Db(path, "catalog_schema.sql", config, may_be_unlinked=False, lazy=again,
                          after_write=partial(self.change_numbers.bump, CATALOG, name))
        if not (again and self._current()):
            self.catalog.write(threads.migrate, config.thread_gap_s)
            _opened.add(str(path))
        self._shards: dict[str, Db] = {}
        self._lock = threading.Lock()

    def _current(self) -> bool:
        try:
            return self.catalog.read(threads.upgraded, self.config.thread_gap_s)
        except sqlite3.OperationalError:          # (no meta table yet: a file made but never written)
            return False

    def catalog_version(self) -> int:
        """A number that changes whenever any process commits to the catalog (its CATALOG change number,
        service/change_numbers.py): a cache of catalog reads holds while it is the same. Read from memory."""
        return self.change_numbers.read(CATALOG, self.name)

    def primary_path(self, day: str) -> Path:
        return self.dir / "primary" / f"{day}.db"

    def shard(self, day: str, create: bool = True) -> Db | None:
        """The primary Db of one day: kept open while the store's ``OpenShards`` allows, else opened for
        this caller alone (closed when it drops it). ``create``: a push's day, made when missing."""
        db = self._shards.get(day)
        if db is not None:
            self.open_shards.used(self, day)
            return db
        path = self.primary_path(day)
        if not create and not path.exists():
            return None
        with self._lock:
            db = self._shards.get(day)
            if db is not None:
                return db
            try:
                db = self._open(day, create)
            except FileNotFoundError:
                return None                 # unlinked by the janitor meanwhile: no live units
        # (outside the lock: admitting may close other days, of this tenant or another, under their locks)
        if not self.open_shards.admit(self, day, push=create):
            return db
        with self._lock:
            kept = self._shards.get(day)
            if kept is not None:
                return kept                 # another request kept this day meanwhile: ours is transient
            if self.open_shards.keeps(self, day):   # (not evicted again since admitted)
                self._shards[day] = db
        return db

    def _open(self, day: str, create: bool) -> Db:
        """A Db of an existing day's file is opened lazily (its first read opens one connection; the writer
        waits for a write), so a day opened for one search costs one connection."""
        path = self.primary_path(day)
        lazy = not create or path.exists()
        db = Db(path, "shard_schema.sql", self.config, cache_size_kib=self.config.shard_cache_kib,
                pool_size=self.config.shard_readers, lazy=lazy)
        if not lazy or _older(db):
            # (the writer runs the schema script first)
            db.write(migrate_shard, lambda: self.catalog.read(fetch_all, "catalog_threads_of_day", {"day": day}))
        return db

    def has_day(self, day: str) -> bool:
        """Whether this day's shard exists (open in this process, or on disk)."""
        return day in self._shards or self.primary_path(day).exists()

    def forget_shard(self, day: str) -> None:
        with self._lock:
            db = self._shards.pop(day, None)
        if db is not None:
            self.open_shards.forgot(self, day)
            db.close()

    def primary_days(self) -> list[str]:
        """Every day with a shard file, live or not."""
        days = []
        for name in os.listdir(self.dir / "primary"):
            m = DAY_FILE_RE.match(name)
            if m:
                days.append(m.group(1))
        return sorted(days)

    def live_days(self, first: str = "0000-00-00", last: str = "9999-99-99") -> list[str]:
        """The days in [first, last] that can hold live units (the catalog's days table)."""
        return [r[0] for r in self.catalog.read(
            fetch_all, "days_live", {"now": int(time.time()), "first": first, "last": last})]

    def max_seq(self) -> int:
        """The newest seq this tenant acked (0 before its first push)."""
        return self.catalog.read(fetch_one, "catalog_max_seq")[0]

    def count_live(self) -> int:
        """Live units in the catalog."""
        return self.catalog.read(fetch_one, "catalog_count_live", {"now": int(time.time())})[0]

    def files(self) -> int:
        """Connections this tenant keeps open in this process (its catalog's and its kept days')."""
        return self.catalog.connections + sum(db.connections for db in list(self._shards.values()))

    def close(self) -> None:
        """Close every file this process keeps open for the tenant. A caller still holding it may go on: each
        catalog read then opens a connection of its own, and a day is opened again (service/store/sqlite/store.py
        closes a tenant least recently used or idle, issue 49)."""
        with self._lock:
            shards = list(self._shards.items())
            self._shards.clear()
        for day, db in shards:
            self.open_shards.forgot(self, day)
            db.close()
        self.catalog.close()


def _older(db: Db) -> bool:
    """Whether a shard's file predates the current schema (or lacks it): it is migrated on opening."""
    try:
        row = db.read(fetch_one, "schema_version")
    except sqlite3.OperationalError:
        return True                         # no meta table: an empty file
    return row is None or int(row[0]) < SHARD_SCHEMA_VERSION
