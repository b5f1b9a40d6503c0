"""One tenant's files (docs/design.md §5): ``tenants/<name>/catalog.db``, ``primary/DAY.db`` and
``replica/index/`` (the read index, service/readindex/).

A Tenant opens its day shards on demand; the store decides how many stay open across tenants (it
passes ``opened``, called on every use of a shard). Searcher, maintenance and janitor hold a Tenant,
never the whole store. (The catalog, ``events.db`` and ``tools.db`` sit beside; the read index's
folder is named by service/readindex/schema.py.)"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ...config import Config
from ...formats import DAY_FILE_RE, TENANT_RE
from .rows import migrate_shard
from .shards import Db, fetch_all, fetch_one


class Tenant:
    """One tenant's directory: catalog.db, primary/ day files and replica/index/ (the read index)."""

    def __init__(self, root: Path, name: str, config: Config,
                 opened: Callable[["Tenant", str], None] = lambda t, day: None):
        if not TENANT_RE.match(name):
            raise ValueError(f"invalid tenant name {name!r}")
        self.name = name
        self.config = config
        self.dir = Path(root) / "tenants" / name
        self._opened = opened
        (self.dir / "primary").mkdir(parents=True, exist_ok=True)
        (self.dir / "replica").mkdir(parents=True, exist_ok=True)
        # the catalog is never unlinked: its reads skip the day shards' inode check
        self.catalog = Db(self.dir / "catalog.db", "catalog_schema.sql", config, may_be_unlinked=False)
        self._shards: dict[str, Db] = {}
        self._lock = threading.Lock()

    def primary_path(self, day: str) -> Path:
        return self.dir / "primary" / f"{day}.db"

    def shard(self, day: str, create: bool = True) -> Db | None:
        """The primary Db of one day (opened once per process, closed when least recently used)."""
        db = self._shards.get(day)
        if db is not None:
            self._opened(self, day)
            return db
        if not create and not self.primary_path(day).exists():
            return None
        with self._lock:
            db = self._shards.get(day)
            if db is None:
                db = Db(self.primary_path(day), "shard_schema.sql", self.config,
                        cache_size_kib=self.config.shard_cache_kib, pool_size=self.config.shard_readers)
                db.write(migrate_shard)
                self._shards[day] = db
        self._opened(self, day)
        return db

    def has_day(self, day: str) -> bool:
        """Whether this day's shard exists (open in this process, or on disk)."""
        return day in self._shards or self.primary_path(day).exists()

    def forget_shard(self, day: str) -> None:
        with self._lock:
            db = self._shards.pop(day, None)
        if db is not None:
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

    def close(self) -> None:
        with self._lock:
            for db in self._shards.values():
                db.close()
            self._shards.clear()
        self.catalog.close()
