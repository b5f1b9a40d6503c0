"""Janitor (docs/design.md §5): purge expired units, unlink dead days, checkpoint WAL.

Purged rows leave tombstones for the read index (rows.remove_rows); the days unlinked are
returned so the leader drops their documents from it.
"""
from __future__ import annotations

import logging
import os
import time

from ...instruments import DAYS_COMPACTED, DAYS_UNLINKED, UNITS_PURGED
from .manage import compact, compact_due
from .rows import remove_rows
from .queries import sql

log = logging.getLogger(__name__)


def _purge_expired(conn, now: int) -> tuple[int, int | None]:
    """Delete expired rows (units, FTS, stats) of one shard; return (deleted, min live expiry)."""
    n = remove_rows(conn, conn.execute(sql("expired_fetch"), {"now": now}).fetchall())
    lo, _hi = conn.execute(sql("shard_expiry_bounds")).fetchone()
    return n, lo


class Janitor:
    def __init__(self):
        self.compacted = 0      # day files this janitor compacted (also context_days_compacted_total)
        self.idle = False       # whether its last run found nothing to do (and left nothing)

    def run(self, t) -> dict:
        now = int(time.time())
        purged = 0
        unlinked: list[str] = []
        days = t.catalog.read(lambda c: c.execute(sql("days_with_expired"), {"now": now}).fetchall())
        for row in days:
            day = row["day"]
            db = t.shard(day, create=False)
            if row["max_expires_at"] <= now:
                # Every unit of the day has expired: forget it in the catalog first, so a push for
                # this day arriving now re-creates the row; then unlink under the shard's write lock.
                t.catalog.write(self._forget_day, day, now)
                if db is not None and db.write(self._unlink_if_dead, t, day, now):
                    t.forget_shard(day)
                    unlinked.append(day)
                continue
            if db is None:
                continue
            n, lo = db.write(_purge_expired, now)
            purged += n
            t.catalog.write(self._purge_catalog, day, now, lo)
        self._remove_old_replicas(t)
        compacted, left = self._compact(t)
        self._checkpoint(t)
        UNITS_PURGED.inc(purged)
        DAYS_UNLINKED.inc(len(unlinked))
        DAYS_COMPACTED.inc(len(compacted))
        self.compacted += len(compacted)
        # nothing done and nothing left: nothing is due until a unit may expire or the catalog changes
        self.idle = not (purged or unlinked or compacted or left)
        return {"purged": purged, "unlinked": len(unlinked), "unlinked_days": unlinked}

    @staticmethod
    def next_expiry(t) -> int | None:
        """When the tenant's first live unit may expire (None: it holds none)."""
        return t.catalog.read(lambda c: c.execute(sql("days_next_expiry")).fetchone()[0])

    def _compact(self, t) -> tuple[list[str], bool]:
        """Day files a tenth of which was forgotten (DELETE, bulk forget): their space back. Also whether one
        that was due could not be compacted now (another process kept it busy)."""
        done, left = [], False
        for day in t.live_days():
            db = t.shard(day, create=False)
            if db is not None and compact_due(db):
                if compact(db):
                    log.info("compacted day %s of tenant %s after forgetting", day, t.name)
                    done.append(day)
                else:
                    left = True
        return done, left

    @staticmethod
    def _forget_day(conn, day: str, now: int) -> None:
        conn.execute(sql("catalog_purge_day"), {"day": day, "now": now})
        conn.execute(sql("days_delete_dead"), {"day": day, "now": now})

    @staticmethod
    def _purge_catalog(conn, day: str, now: int, lo: int | None) -> None:
        conn.execute(sql("catalog_purge_day"), {"day": day, "now": now})
        if lo is not None:
            conn.execute(sql("days_set_min"), {"day": day, "min_expires_at": lo})

    @staticmethod
    def _unlink_if_dead(conn, t, day: str, now: int) -> bool:
        lo, hi = conn.execute(sql("shard_expiry_bounds")).fetchone()
        if hi is not None and hi > now:
            return False  # a live unit arrived for this day meanwhile
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(f"{t.primary_path(day)}{suffix}")
            except FileNotFoundError:
                pass
        log.info("unlinked expired day %s of tenant %s", day, t.name)
        return True

    @staticmethod
    def _remove_old_replicas(t) -> None:
        """Per-day replica copies (and their impact lists) of versions before the read index."""
        for path in (t.dir / "replica").glob("*.db*"):
            try:
                path.unlink()
                log.info("removed old per-day replica %s", path.name)
            except FileNotFoundError:
                pass

    def _checkpoint(self, t) -> None:
        for db in [t.catalog] + [t.shard(d, create=False) for d in t.live_days()]:
            if db is not None:
                db.read(lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall())
