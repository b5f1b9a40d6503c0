"""Threads on SQLite (docs/design.md §3 "Threads", §5.1): what thread assignment reads from a tenant's catalog in a
push's transaction (``CatalogThreads``, the ``push.ThreadLookup`` of service/store/push.py, whose rules both stores
follow), and the upgrade of a catalog written before threads (``migrate``). The day files take their units' threads
from the catalog when they are upgraded (rows.migrate_shard).
"""
from __future__ import annotations

import sqlite3

from ..push import StoredInOrder
from .queries import sql
from .rows import run_script


class CatalogThreads:
    """The catalog's answers to thread assignment (``push.ThreadLookup``), in the push's transaction."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def last_pos(self, thread: str) -> int | None:
        return self.conn.execute(sql("catalog_thread_last"), {"thread": thread}).fetchone()[0]

    def previous(self, source: str, lo: int, hi: int) -> str | None:
        row = self.conn.execute(sql("catalog_source_previous"), {"source": source, "lo": lo, "hi": hi}).fetchone()
        return row[0] if row else None


def upgraded(conn: sqlite3.Connection, gap: int = 0) -> bool:
    """Whether a catalog needs nothing of ``migrate`` (read only): schema 2 and its thread indexes."""
    version = conn.execute(sql("schema_version")).fetchone()
    have = {r[0] for r in conn.execute(sql("index_names"))}
    return (version is not None and int(version[0]) >= 2 and "catalog_thread" in have
            and (gap <= 0 or "catalog_source_ts" in have))


def migrate(conn: sqlite3.Connection, gap: int = 0) -> None:
    """Bring a catalog written before threads to schema 2 (inside the write lock): the columns, then each unit
    its thread and place by the push's rules, in acknowledgement order; then the thread indexes (every open; by
    source and time only where CONTEXT_THREAD_GAP_S asks for them)."""
    if conn.execute(sql("schema_version")).fetchone()[0] < 2:
        run_script(conn, "catalog_migrate_v2.sql")
        threads = StoredInOrder(gap)
        updates = []
        for r in conn.execute(sql("catalog_for_threads")).fetchall():
            thread, tpos = threads.assign(r)
            updates.append({"seq": r["seq"], "thread": thread, "tpos": tpos})
        conn.executemany(sql("catalog_set_thread"), updates)
    conn.execute(sql("catalog_index_thread"))
    if gap > 0:
        conn.execute(sql("catalog_index_source_ts"))
