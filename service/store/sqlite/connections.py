"""SQLite files, connections and the per-file writer (docs/design.md §5).

One :class:`Db` owns one database file. Reads run ``fn(conn)`` on a pooled connection;
writes run ``fn(conn)`` inside ``BEGIN IMMEDIATE`` on the single writer connection of
this process. SQL text lives in ``sql/`` and is loaded once by name (queries.py).
"""
from __future__ import annotations

import errno
import logging
import os
import queue
import random
import sqlite3
import threading
import time
from pathlib import Path

from ...budget import FILES
from ...errors import StorageUnavailable
from .queries import schema

log = logging.getLogger(__name__)


def check_fts5() -> str | None:
    """None when FTS5 (and fts5vocab) work in this SQLite; otherwise a clear message."""
    try:
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, row)")
        conn.close()
    except sqlite3.OperationalError as e:
        return (f"SQLite {sqlite3.sqlite_version} lacks FTS5 ({e}). Install a Python whose sqlite3 "
                "is compiled with SQLITE_ENABLE_FTS5 (Debian's and python.org's builds are).")
    return None


# PRAGMA synchronous's values as SQLite reads them back.
SYNCHRONOUS_LEVELS = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}


def connect(path: Path | str, *, busy_timeout_ms: int = 10_000, synchronous: str = "FULL",
            cache_size_kib: int = 8192, readonly: bool = False) -> sqlite3.Connection:
    """Open one connection with the pragmas every shard uses.

    Several gunicorn workers share a shard safely because SQLite does the arbitration:
    WAL mode lets readers in any process run alongside one writer; every write starts
    with BEGIN IMMEDIATE, so a second writer (another request of the worker, or another
    process's indexer) waits on busy_timeout for the file lock instead of failing a
    lock upgrade mid-transaction; and nothing is cached in Python that another process
    could change underneath us except the file itself, which writers re-check (inode)
    after taking the lock, since the janitor may unlink a fully expired day.

    ``synchronous`` (``CONTEXT_SYNCHRONOUS``): with FULL, in WAL mode, each COMMIT syncs the WAL
    (fdatasync) before it returns, so a transaction committed is on disk; NORMAL syncs only at
    checkpoints. The level is read back, so a connection never runs with another than asked.
    """
    if readonly:
        # Replica files are replaced by rename and never written in place.
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                               timeout=busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode=WAL")
        level = SYNCHRONOUS_LEVELS.get(synchronous.upper())
        if level is None:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}, not {synchronous!r}")
        conn.execute(f"PRAGMA synchronous={level}")
        if conn.execute("PRAGMA synchronous").fetchone()[0] != level:
            conn.close()
            raise RuntimeError(f"SQLite did not take PRAGMA synchronous={synchronous} on {path}")
    conn.execute(f"PRAGMA cache_size=-{int(cache_size_kib)}")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.row_factory = sqlite3.Row
    return conn


def _folders_above(path: Path, data_dir: Path) -> list[Path]:
    """The folders whose entries make a new file at ``path`` reachable: each folder above the file's
    own, up to the parent of ``data_dir`` (just the one above when ``path`` is elsewhere)."""
    path, data_dir = path.resolve(), data_dir.resolve()
    if data_dir not in path.parents:
        return [path.parent.parent]
    out, d = [], path.parent.parent
    while True:
        out.append(d)
        if d == data_dir.parent:
            return out
        d = d.parent


def _fsync_dir(d: Path) -> None:
    """Sync a folder's entries; a file system that cannot sync folders is let be, as SQLite does."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def _commit(conn: sqlite3.Connection, fn, *args, **kwargs):
    """``fn(conn, ...)`` inside the transaction just begun: commit, or roll back and re-raise."""
    try:
        result = fn(conn, *args, **kwargs)
        conn.execute("COMMIT")
        return result
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise


class Db:
    """One SQLite file: a small pool of read connections and one writer connection."""

    def __init__(self, path: Path, schema_file: str | None, config, *, readonly: bool = False,
                 pool_size: int = 4, cache_size_kib: int | None = None, may_be_unlinked: bool = True,
                 lazy: bool = False, after_write=None):
        self.path = Path(path)
        self.after_write = after_write           # called after each write transaction ends (a commit, or not)
        self.may_be_unlinked = may_be_unlinked   # day shards: the janitor may unlink and a push re-create
        self.schema_file = schema_file
        self.config = config
        self.readonly = readonly
        self.cache_size_kib = cache_size_kib or config.cache_size_kib
        self._pool: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue(maxsize=pool_size)
        self._writer: sqlite3.Connection | None = None
        self._write_lock = threading.RLock()
        self._ino: int | None = None
        self._closed = False
        self._generation = 0
        self._gen_lock = threading.Lock()
        self._conns = 0                          # connections open now (FILES counts their descriptors)
        self._count_lock = threading.Lock()
        if lazy and not readonly:
            # an existing file opened for reading: the writer (and the schema script) wait for a first write
            self._ino = os.stat(self.path).st_ino
        elif not readonly:
            self._open_writer()

    # --- connections --------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = connect(self.path, busy_timeout_ms=self.config.busy_timeout_ms,
                       synchronous=self.config.synchronous, cache_size_kib=self.cache_size_kib,
                       readonly=self.readonly)
        self._counted(1)
        return conn

    def _close(self, conn: sqlite3.Connection) -> None:
        conn.close()
        self._counted(-1)

    def _counted(self, n: int) -> None:
        """``n`` connections more (or fewer): each holds the file and its WAL, and the process's connections
        to one file share its -shm (service/budget.py's FILES, what a tenant's files cost the process)."""
        with self._count_lock:
            before = self._conns
            self._conns += n
            FILES.add(2 * n + (self._conns > 0) - (before > 0))

    def __del__(self):
        # A Db dropped without close (a day opened for one caller alone): its connections close with it.
        n = getattr(self, "_conns", 0)
        if n > 0:
            FILES.add(-(2 * n + 1))

    @property
    def connections(self) -> int:
        """Connections to this file open in this process now (pooled, lent out, the writer)."""
        return self._conns

    def _open_writer(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new_file = not self.path.exists()
        # Two processes may create the same new file at once (a push in one worker, the maintenance
        # leader in another): switching it to WAL or running the schema can then meet the other's
        # lock without SQLite's busy handler, so retry within the busy timeout.
        deadline = time.monotonic() + self.config.busy_timeout_ms / 1000
        while True:
            conn = None
            try:
                conn = self._connect()
                if self.schema_file:
                    conn.executescript(schema(self.schema_file))
                break
            except sqlite3.OperationalError as e:
                if conn is not None:
                    self._close(conn)
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005 + random.random() * 0.01)
        conn.execute("PRAGMA busy_timeout=0")   # write() polls for the lock itself (_begin_immediate)
        if new_file and self.config.synchronous != "NORMAL":
            # SQLite syncs the folder that holds a new file's WAL, not that folder's own entry in its
            # parent: sync the folders above (a few fsyncs per new tenant or day), or a power cut could
            # lose a new tenant's folder with every push acknowledged in it.
            for d in _folders_above(self.path, self.config.data_path):
                _fsync_dir(d)
        self._writer = conn
        ino = os.stat(self.path).st_ino
        if self._ino is not None and ino != self._ino:
            with self._gen_lock:                # (lazy) a new file since the readers opened: they start over
                self._generation += 1
                self._drain()
        self._ino = ino

    def read(self, fn, *args, **kwargs):
        """Run ``fn(conn, ...)`` on a pooled read connection."""
        if self.may_be_unlinked and self._ino is not None and self._recreated():
            # The janitor unlinked this day and a push re-created it; open connections would keep
            # reading the deleted file (SQLite reads an unlinked inode happily), so start over.
            with self._write_lock:
                if self._recreated():
                    self._reset()
                    self._ino = os.stat(self.path).st_ino
        gen = self._generation
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            conn = self._connect()
        ok = False
        try:
            result = fn(conn, *args, **kwargs)
            ok = True
            return result
        finally:
            if ok and conn.in_transaction:
                conn.rollback()
            if ok and gen == self._generation and not self._closed:
                try:
                    self._pool.put_nowait(conn)
                    conn = None
                except queue.Full:
                    pass
            if conn is not None:
                self._close(conn)

    def write(self, fn, *args, **kwargs):
        """Run ``fn(conn, ...)`` in one BEGIN IMMEDIATE transaction on this file; commit or roll back."""
        if self.readonly:
            raise RuntimeError("read-only database")
        with self._write_lock:
            try:
                for _attempt in (0, 1):
                    if self._writer is None:
                        self._open_writer()
                    conn = self._writer
                    self._begin_immediate(conn)
                    if not self._same_file():
                        # The janitor unlinked this day after we opened it: reopen a fresh file.
                        conn.rollback()
                        self._reset()
                        continue
                    return self._commit(conn, fn, *args, **kwargs)
                raise StorageUnavailable("Shard file keeps changing underneath the writer; retry.")
            finally:
                self._close_writer_if_closed()

    def try_write(self, fn, *args, **kwargs):
        """``write`` only if the file's write lock is free right now; None (nothing done) otherwise.
        For work that may be skipped (a search sharing what it computed), never worth a wait."""
        if self.readonly or not self._write_lock.acquire(blocking=False):
            return None
        try:
            if self._writer is None:
                self._open_writer()
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                if "locked" in str(e) or "busy" in str(e):
                    return None
                raise
            if not self._same_file():
                conn.rollback()
                return None
            return self._commit(conn, fn, *args, **kwargs)
        finally:
            self._close_writer_if_closed()
            self._write_lock.release()

    def _close_writer_if_closed(self) -> None:
        """(holding the write lock) A Db closed while a caller still held it (its tenant was closed, issue 49)
        still writes, on a writer of that write alone: nothing would close one kept."""
        if self._closed and self._writer is not None:
            self._close(self._writer)
            self._writer = None

    def _commit(self, conn: sqlite3.Connection, fn, *args, **kwargs):
        try:
            return _commit(conn, fn, *args, **kwargs)
        finally:
            if self.after_write is not None:
                self.after_write()      # (after the commit is visible; after a rollback too, which costs a re-read)

    def vacuum(self) -> bool:
        """VACUUM the file (outside any transaction, on the writer), then truncate the WAL it grew.
        False when another process holds the write lock past the busy timeout: try again later."""
        with self._write_lock:
            if self._writer is None:
                self._open_writer()
            conn = self._writer
            if not self._same_file():
                return False
            conn.execute(f"PRAGMA busy_timeout={int(self.config.busy_timeout_ms)}")
            try:
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                return False
            finally:
                conn.execute("PRAGMA busy_timeout=0")
                self._close_writer_if_closed()
            return True

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the file's write lock, polling every ~1 ms while another process holds it.

        SQLite's own busy handler sleeps 1, 2, 5, 10, ... 100 ms between tries, so a push that
        meets another worker's millisecond-long transaction could wait tens of milliseconds.
        The writer connection therefore has busy_timeout 0 and waits here instead.
        """
        deadline = time.monotonic() + self.config.busy_timeout_ms / 1000
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.0005 + random.random() * 0.001)

    def _path_inode(self) -> int | None:
        try:
            return os.stat(self.path).st_ino
        except FileNotFoundError:
            return None

    def _recreated(self) -> bool:
        """A different file now has our path (a missing one is not: its rows had all expired)."""
        ino = self._path_inode()
        return ino is not None and ino != self._ino

    def _same_file(self) -> bool:
        return self._path_inode() == self._ino

    def _reset(self) -> None:
        with self._gen_lock:
            self._generation += 1
            if self._writer is not None:
                self._close(self._writer)
                self._writer = None
            self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._close(self._pool.get_nowait())
            except queue.Empty:
                break

    def close(self) -> None:
        """Close every connection this process keeps to the file. A caller still holding the Db may go on
        using it: each read or write then opens a connection for itself and closes it after."""
        with self._write_lock:
            self._closed = True
            self._drain()
            if self._writer is not None:
                self._close(self._writer)
                self._writer = None


class TenantDbs:
    """One small SQLite file per tenant beside its day files (``events.db``, ``tools.db``), opened by this
    process on first use and kept open while the store keeps the tenant open (``drop``: the store's
    ``closers``)."""

    def __init__(self, store, filename: str, schema_file: str, *, cache_size_kib: int):
        self.store = store
        self.filename = filename
        self.schema_file = schema_file
        self.cache_size_kib = cache_size_kib
        self._dbs: dict[str, Db] = {}
        self._lock = threading.Lock()
        store.closers.append(self.drop)

    def __call__(self, tenant: str) -> Db:
        db = self._dbs.get(tenant)
        if db is None:
            # (the store's tenant first, outside the lock: opening it may close another, and with it its file here)
            path = Path(self.store.tenant(tenant).dir) / self.filename
            with self._lock:
                db = self._dbs.get(tenant)
                if db is None:
                    db = self._dbs[tenant] = Db(path, self.schema_file, self.store.config, pool_size=2,
                                                cache_size_kib=self.cache_size_kib, may_be_unlinked=False)
        return db

    def drop(self, tenant: str) -> None:
        """Close the tenant's file here (the store closed the tenant; its next use opens it again)."""
        with self._lock:
            db = self._dbs.pop(tenant, None)
        if db is not None:
            db.close()

    def close(self) -> None:
        with self._lock:
            for db in self._dbs.values():
                db.close()
            self._dbs.clear()


class OpenShards:
    """Which primary day files this process keeps open (each holds up to ``shard_readers`` + 1
    descriptors): at most ``max_open_shards`` over every tenant, of which one tenant keeps at most its
    share (``shard_share``; half by default), so one tenant's strong search over hundreds of days can
    neither evict the others' files nor churn the cache. A day past the tenant's share is opened for
    the caller alone (``admit`` says no; tenant.py) and closed when its last user drops it; a push's day,
    or a day replacing one of the tenant's idle for IDLE_S, takes the place of the tenant's least
    recently used. Past the total, the tenant holding the most gives up its least recently used."""

    IDLE_S = 30.0

    def __init__(self, config, cap: int | None = None):
        """``cap``: what the process's budget allows (service/budget.py), else ``max_open_shards``."""
        self.cap = max(1, config.max_open_shards if cap is None else cap)
        self.share = max(1, config.shard_share) if config.shard_share >= 0 else max(1, self.cap // 2)
        self.share = min(self.share, self.cap)
        self._lru: dict[tuple[str, str], tuple[object, float]] = {}    # (tenant, day) -> (Tenant, last use)
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def keeps(self, t, day: str) -> bool:
        item = self._lru.get((t.name, day))
        return item is not None and item[0] is t

    def used(self, t, day: str) -> None:
        """A use of a kept day (most recently used now)."""
        key = (t.name, day)
        with self._lock:
            if key in self._lru:
                self._lru[key] = (self._lru.pop(key)[0], time.monotonic())

    def admit(self, t, day: str, *, push: bool = False) -> bool:
        """Whether tenant ``t`` keeps ``day`` open (False: the caller's Db is transient)."""
        key, now, evict = (t.name, day), time.monotonic(), []
        with self._lock:
            item = self._lru.get(key)
            if item is not None:
                if item[0] is t:
                    return True
                # kept by an earlier Tenant of the same name, closed since (issue 49): its copy goes
                evict.append(self._drop(key))
            if self._held.get(t.name, 0) >= self.share:
                mine = next((k for k in self._lru if k[0] == t.name), None)
                if mine is None or not (push or now - self._lru[mine][1] >= self.IDLE_S):
                    return False
                evict.append(self._drop(mine))
            self._lru[key] = (t, now)
            self._held[t.name] = self._held.get(t.name, 0) + 1
            while len(self._lru) > self.cap:
                most = max(self._held, key=self._held.__getitem__)
                evict.append(self._drop(next(k for k in self._lru if k[0] == most)))
        for owner, old_day in evict:
            owner.forget_shard(old_day)
        return True

    def forgot(self, t, day: str) -> None:
        """The tenant closed a day itself (the janitor dropped it): its place is free."""
        with self._lock:
            if self.keeps(t, day):
                self._drop((t.name, day))

    def _drop(self, key: tuple[str, str]):
        owner, _ = self._lru.pop(key)
        self._held[key[0]] -= 1
        if not self._held[key[0]]:
            del self._held[key[0]]
        return owner, key[1]
