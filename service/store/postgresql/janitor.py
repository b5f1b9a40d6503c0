"""The janitor on PostgreSQL (docs/design.md §5.2, §14): per tenant under a transaction-level advisory lock (one
node at a time), it deletes expired units with their statistics, then drops the day partitions no unit lives in
any more.
"""
from __future__ import annotations

import logging
import zlib

from psycopg import sql as pgsql

from ...instruments import DAYS_UNLINKED
from .queries import lock_wait, sql, template
from .rows import JANITOR_LOCKS, PARTITION_LOCK, partition_day, unstat

log = logging.getLogger(__name__)

PURGE_BATCH = 5000
LOCK_WAIT_MS = 2000         # a dead partition's look waits for its locks at most this
# While DROP waits for units' ACCESS EXCLUSIVE lock, every search that comes after waits behind it: so it waits
# briefly (a partition it cannot drop now is dropped on a later pass).
DROP_LOCK_WAIT_MS = 100


def _partition_dead(conn, part, day: str) -> bool:
    busy = conn.execute(template("partition_has_rows", part=part)).fetchone()["b"]
    return not (busy or conn.execute(sql("day_live_anywhere"), {"day": day}).fetchone()["b"])


def _drop_if_dead(conn, name: str) -> bool:
    # Every push holds the partition lock shared from its look at its partitions to its commit: with it
    # held exclusively no push is between the two. Taken only if free, since pushes would queue behind
    # a janitor waiting for it; a busy partition is dropped on a later pass.
    if not conn.execute(sql("advisory_try_lock"), {"key": PARTITION_LOCK}).fetchone()["ok"]:
        return False
    lock_wait(conn, LOCK_WAIT_MS)
    part, day = pgsql.Identifier(name), partition_day(name)
    if not _partition_dead(conn, part, day):
        return False
    # The locks DROP takes, in a push's order (the parent table, then the partition), so that it never
    # deadlocks with a search. No second look under them: with the partition lock held no push writes.
    lock_wait(conn, DROP_LOCK_WAIT_MS)
    conn.execute(template("partition_lock", part=part))
    conn.execute(template("partition_drop", part=part))
    return True


class Janitor:
    """One store's janitor: ``run`` purges a tenant (as SQLite's ``Janitor.run`` does one tenant's files), then
    ``drop_dead_partitions`` drops the day partitions no tenant holds a unit in any more (shared by every tenant
    here, where SQLite unlinks each tenant's day files in its ``run``)."""

    def __init__(self, store):
        self.store = store

    def run(self, tenant: str, now: int) -> dict:
        """Delete a tenant's expired units (and their statistics, queue and catalog rows); one node at a time.
        Returns what it did, as the SQLite janitor's ``run`` does (``purged``: units deleted)."""
        def tx(conn):
            key = JANITOR_LOCKS + zlib.crc32(tenant.encode())
            if not conn.execute(sql("advisory_try_lock"), {"key": key}).fetchone()["ok"]:
                return 0
            total = 0
            while True:
                rows = conn.execute(sql("units_purge_batch"), {"tenant": tenant, "now": now, "limit": PURGE_BATCH}).fetchall()
                if rows:
                    cids = [r["cid"] for r in rows]
                    conn.execute(sql("pending_delete_many"), {"tenant": tenant, "cids": cids})
                    unstat(conn, tenant, conn.execute(sql("unit_terms_purge"), {"tenant": tenant, "cids": cids}).fetchall())
                total += len(rows)
                if len(rows) < PURGE_BATCH:
                    break
            if total:
                conn.execute(sql("index_mark"), {"tenant": tenant})
            conn.execute(sql("catalog_purge"), {"tenant": tenant, "now": now})
            for r in conn.execute(sql("days_forget_dead"), {"tenant": tenant, "now": now}).fetchall():
                conn.execute(sql("stats_forget_day"), {"tenant": tenant, "day": r["day"]})
            return total
        return {"purged": self.store.db.write(tx)}

    def drop_dead_partitions(self) -> list[str]:
        """Drop day partitions that hold no unit and that no tenant counts as live (the TTL drop)."""
        dropped = []
        for r in self.store.db.read(lambda c: c.execute(sql("partitions")).fetchall()):
            try:
                if self.store.db.write(_drop_if_dead, r["name"]):
                    dropped.append(partition_day(r["name"]))
                    log.info("dropped expired day partition %s", r["name"])
            except Exception as e:  # noqa: BLE001  (a busy partition is dropped on a later pass)
                log.info("day partition %s not dropped now: %s", r["name"], e)
        DAYS_UNLINKED.inc(len(dropped))
        return dropped
