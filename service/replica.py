"""Read replicas (DESIGN.md section 5): one copy per day shard, made with SQLite's online backup API.

The leader copies a dirty primary into ``replica/DAY.db.tmp-PID``, switches it to rollback
journal mode and renames it over ``replica/DAY.db``. Readers open replicas immutable and
read-only, and reopen when the file's inode changes, so a refresh never blocks a search and
a search never sees a half-copied file.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

from . import impacts as impact_lists
from .shards import Db, sql

log = logging.getLogger(__name__)


def meta_of(conn: sqlite3.Connection) -> dict:
    return {r[0]: r[1] for r in conn.execute(sql("meta_get"))}


class ReplicaManager:
    def __init__(self, store):
        self.store = store
        self.config = store.config
        self._copied: dict[tuple[str, str], int] = {}     # (tenant, day) -> index_version copied
        self._impacts: dict[tuple[str, str], bool] = {}   # (tenant, day) -> the copy has current impact lists
        self._last: dict[tuple[str, str], float] = {}     # (tenant, day) -> last refresh time
        self._changed: dict[tuple[str, str], float] = {}  # (tenant, day) -> when its primary was last seen changing
        self.refreshes = 0
        self.refresh_seconds = 0.0

    def refresh_due(self, t) -> int:
        """Refresh every live shard whose replica is missing or behind, at most once per debounce."""
        n = 0
        now = time.time()
        for day in self.store.live_days(t):
            key = (t.name, day)
            if now - self._last.get(key, 0) < self.config.replica_debounce_ms / 1000:
                continue
            db = t.shard(day, create=False)
            if db is None:
                continue
            meta = db.read(meta_of)
            version = meta.get("index_version", 0)
            replica = t.replica_path(day)
            if key not in self._copied and replica.exists():
                try:
                    self._copied[key], info = replica_version(replica)
                    self._impacts[key] = impact_lists.current(info, self.config)
                except sqlite3.DatabaseError:
                    log.warning("replica %s is damaged; rebuilding it", replica)
            if key in self._copied and self._copied[key] != version:
                self._changed[key] = now
            # Up to date when the copy has this version and, for a quiet past day, its impact lists
            # (a day becomes past at midnight UTC, quiet a while after its last change; older
            # replicas predate impact lists).
            copied = self._copied.get(key) == version and replica.exists()
            if copied and (self._impacts.get(key) or not db.read(
                    impact_lists.wanted, self.config, day, meta=meta, changed_at=self._changed.get(key, 0.0))):
                continue
            self.refresh(t, day, db)
            n += 1
        return n

    def refresh(self, t, day: str, db: Db | None = None) -> int:
        """Copy one primary to its replica; return the index_version copied."""
        db = db or t.shard(day)
        replica = t.replica_path(day)
        tmp = replica.with_name(f"{replica.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        start = time.perf_counter()
        try:
            dst = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                db.read(lambda c: c.backup(dst))
                dst.execute("PRAGMA journal_mode=DELETE")
                meta = meta_of(dst)
                version = meta.get("index_version", 0)
                impacts = impact_lists.wanted(dst, self.config, day, meta, self._changed.get((t.name, day), 0.0))
                if impacts:
                    impact_lists.build(dst, self.config)
            finally:
                dst.close()
            os.replace(tmp, replica)
        finally:
            if tmp.exists():
                tmp.unlink()
        db.write(lambda c: c.execute(sql("meta_clean"), {"version": version}))
        self._copied[(t.name, day)] = version
        self._impacts[(t.name, day)] = impacts
        self._last[(t.name, day)] = time.time()
        self.refreshes += 1
        self.refresh_seconds += time.perf_counter() - start
        return version


def replica_version(path) -> tuple[int, dict | None]:
    """(index_version copied, impact-list parameters or None) of a replica file."""
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return meta_of(conn).get("index_version", 0), impact_lists.info(conn)
    finally:
        conn.close()


class ReplicaReaders:
    """Per-process read handles on replica files, reopened when a refresh replaces the file."""

    def __init__(self, config):
        self.config = config
        self._dbs: dict[str, tuple[int, Db]] = {}
        self._lock = threading.Lock()

    def get(self, path) -> Db | None:
        key = str(path)
        try:
            ino = os.stat(path).st_ino
        except FileNotFoundError:
            return None
        cur = self._dbs.get(key)
        if cur is not None and cur[0] == ino:
            return cur[1]
        with self._lock:
            cur = self._dbs.get(key)
            if cur is not None and cur[0] == ino:
                return cur[1]
            db = Db(path, None, self.config, readonly=True, cache_size_kib=self.config.shard_cache_kib,
                    pool_size=self.config.shard_readers)
            self._dbs[key] = (ino, db)
        if cur is not None:
            cur[1].close()
        return db

    def inode(self, path) -> int | None:
        cur = self._dbs.get(str(path))
        return cur[0] if cur is not None else None

    def broken(self, path) -> None:
        """A replica failed to read: drop it so the leader rebuilds it; readers use the primary meanwhile."""
        key = str(path)
        with self._lock:
            cur = self._dbs.pop(key, None)
        if cur is not None:
            cur[1].close()
        try:
            os.unlink(path)
            log.warning("removed damaged replica %s; it will be rebuilt", path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            for _, db in self._dbs.values():
                db.close()
            self._dbs.clear()
