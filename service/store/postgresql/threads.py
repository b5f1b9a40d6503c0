"""Threads on PostgreSQL (docs/design.md §3 "Threads", §5.2): what thread assignment reads from the catalog in a
push's transaction (``CatalogThreads``, the ``push.ThreadLookup`` of service/store/push.py, whose rules are the
SQLite store's), and the upgrade of a database made before threads (``migrate``).

A push reads, in the round trip that reads its batch's catalog rows, the highest place taken in every thread
its units can join without a look at time (their own CIDs, the threads their metadata.session names, and the
threads of the stored units and parents it names): a batch of a thousand new units costs one statement, not
one per unit. Only a thread found by time (CONTEXT_THREAD_GAP_S) is looked up on its own.
"""
from __future__ import annotations

import logging

from ...unitkeys import session_thread
from ..push import StoredInOrder
from .queries import sql
from .rows import SCHEMA_LOCK

log = logging.getLogger(__name__)

MIGRATE_PAGE = 10_000          # catalog rows a thread migration reads and writes per statement


class CatalogThreads:
    """The catalog's answers to thread assignment for one tenant, in the push's transaction; ``last``: the
    highest place of the threads read ahead (``read_ahead``), None where a thread has no unit."""

    def __init__(self, conn, tenant: str, last: dict[str, int | None]):
        self.conn = conn
        self.tenant = tenant
        self.last = last

    def last_pos(self, thread: str) -> int | None:
        if thread not in self.last:
            self.last[thread] = self.conn.execute(sql("catalog_thread_last"), {
                "tenant": self.tenant, "thread": thread}).fetchone()["last"]
        return self.last[thread]

    def previous(self, source: str, lo: int, hi: int) -> str | None:
        row = self.conn.execute(sql("catalog_source_previous"), {
            "tenant": self.tenant, "source": source, "lo": lo, "hi": hi}).fetchone()
        return row["thread"] if row else None


def candidate_threads(units) -> list[str]:
    """The threads a batch's new units may start or join by their own fields (their CIDs and what their
    metadata.session names); the stored rows' threads are added by the statement (catalog_threads_last)."""
    out = {u.cid for u in units}
    out.update(t for t in (session_thread(u.metadata_json()) for u in units) if t)
    return sorted(out)


def read_ahead(rows) -> dict[str, int | None]:
    """catalog_threads_last's rows as ``CatalogThreads.last``: every thread asked for, None where it has no unit."""
    return {r["thread"]: r["last"] for r in rows}


def ensure_gap_index(conn) -> None:
    """The catalog's index by source and time, which finding a source's previous unit reads
    (CONTEXT_THREAD_GAP_S > 0): made once, under the schema lock, by the first node that starts with it."""
    if conn.execute(sql("catalog_gap_index_present")).fetchone()["ok"]:
        return
    conn.execute(sql("advisory_lock"), {"key": SCHEMA_LOCK})
    conn.execute(sql("catalog_index_source_ts"))


def migrate(conn, gap: int = 0) -> int:
    """Give every unit of a database made before threads its thread and place, tenant by tenant in seq order,
    by the push's rules (``Threads``: a child joins its parent's thread, a parent no longer stored or
    acknowledged after its child leaves it a thread of its own; with ``gap``, time adjacency), then the units
    rows as the catalog has them. In the upgrade's transaction, under the schema lock. Returns the units."""
    total = 0
    for tenant in [r["tenant"] for r in conn.execute(sql("catalog_tenants")).fetchall()]:
        threads = StoredInOrder(gap)
        after = 0
        while True:
            rows = conn.execute(sql("catalog_for_threads"), {
                "tenant": tenant, "after": after, "limit": MIGRATE_PAGE}).fetchall()
            if not rows:
                break
            seqs, names, places = [], [], []
            for r in rows:
                thread, tpos = threads.assign(r)
                seqs.append(r["seq"])
                names.append(thread)
                places.append(tpos)
            conn.execute(sql("catalog_set_threads"), {"tenant": tenant, "seqs": seqs, "threads": names,
                                                      "tposs": places})
            total += len(rows)
            after = rows[-1]["seq"]
    if total:
        conn.execute(sql("units_threads_from_catalog"))
        log.info("threads: %d units of a database made before threads given their threads", total)
    return total
