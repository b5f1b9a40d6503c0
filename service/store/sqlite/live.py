"""Live context, the data side: what changed, read from SQLite so every gunicorn worker sees it.

Two sources, both durable and shared by the workers, so an event reaches a listener whichever worker
took the push (there is no in-process queue to miss):

- **the feed**: new units in ``seq`` order, from the tenant catalog and the day shards. A unit enters
  the feed once it is indexed (its tokens decide which searches and streams it matches); the feed
  stops at the first unit still pending, so it never skips one (the hub indexes such a row itself,
  as a strong search does). ``seq`` is also the SSE event id of GET /mcp/stream.
- **the change log** (``tenants/<t>/events.db``): changes that get no new ``seq``: a unit re-pushed
  with new fields, a deleted unit, a tool registered, updated or deleted.

``service/hub.py`` polls both for the tenants its listeners watch and fans out.
"""
from __future__ import annotations

import json
import logging
import secrets
import threading
import time

from ...live import KEEP_EVENTS_MS, STALE_MS, FeedUnit, LimitReached
from ...uris import UNITS_PREFIX
from .indexer import index_pending
from .connections import Db, TenantDbs
from .queries import fetch_all, sql
from .store import STALE_RESERVATION_MS

log = logging.getLogger(__name__)

PRUNE_EVERY = 200                    # change-log writes between prunes


def read_feed(t, after: int, limit: int = 500, *, tokenizer=None, batch: int = 512) -> tuple[list[FeedUnit], int]:
    """Live indexed units with ``seq > after`` in seq order, and the seq the feed is resolved to: every unit
    up to it was delivered or is gone (deleted, expired, a reservation whose push never completed).

    With ``tokenizer``, a pending unit is indexed here (idempotent, as search's read-your-writes) and the
    read goes on; without, the feed stops before it.
    """
    rows = t.catalog.read(lambda c: c.execute(sql("feed_catalog"), {"after": after, "limit": limit}).fetchall())
    if not rows:
        return [], after
    units = _shard_rows(t, rows)
    if tokenizer is not None and any(_pending(units.get(r["cid"]), r) for r in rows):
        for day in {r["day"] for r in rows if _pending(units.get(r["cid"]), r)}:
            db = t.shard(day, create=False)
            if db is not None:
                index_pending(db, tokenizer, batch)
        units = _shard_rows(t, rows)
    now, now_ms = int(time.time()), int(time.time() * 1000)
    out: list[FeedUnit] = []
    resolved = after
    for r in rows:
        u = units.get(r["cid"])
        if u is None or u["seq"] != r["seq"]:
            if now_ms - r["reserved_ms"] < STALE_RESERVATION_MS:
                break                         # the push is between its catalog and shard writes
            resolved = r["seq"]               # a push that crashed before its ack: never a unit
            continue
        if u["indexed"] == 0:
            break
        resolved = r["seq"]
        if u["expires_at"] <= now:
            continue
        out.append(FeedUnit(u["seq"], u["cid"], u["type"], u["source"], u["timestamp"], u["expires_at"],
                            frozenset((u["tokens"] or "").split())))
    return out, resolved


def _pending(u, r) -> bool:
    return u is not None and u["seq"] == r["seq"] and u["indexed"] == 0


def _shard_rows(t, rows) -> dict:
    by_day: dict[str, list[str]] = {}
    for r in rows:
        by_day.setdefault(r["day"], []).append(r["cid"])
    found = {}
    for day, cids in by_day.items():
        db = t.shard(day, create=False)
        if db is None:
            continue
        for u in db.read(fetch_all, "feed_units", {"cids": json.dumps(cids)}):
            found[u["cid"]] = u
    return found


def unit_expiry(t, cid: str) -> int | None:
    """When a unit expires (catalog), or None when there is no such unit."""
    row = t.catalog.read(lambda c: c.execute(sql("feed_expiry"), {"cid": cid}).fetchone())
    return row[0] if row is not None else None


class ChangeLog:
    """Each tenant's ``events.db``: written where a change happens, read by every worker's hub."""

    def __init__(self, store):
        self.store = store
        self.db = TenantDbs(store, "events.db", "events_schema.sql", cache_size_kib=256)
        self._writes = 0

    def record(self, tenant: str, changes: list[tuple[str, str]]) -> None:
        """Append (uri, kind) rows in one transaction; now and then drop rows older than KEEP_EVENTS_MS."""
        if not changes:
            return
        now_ms = int(time.time() * 1000)
        self._writes += 1
        prune = self._writes % PRUNE_EVERY == 0

        def tx(conn):
            conn.executemany(sql("events_insert"), [{"uri": uri, "kind": kind, "at_ms": now_ms}
                                                    for uri, kind in changes])
            if prune:
                conn.execute(sql("events_prune"), {"before": now_ms - KEEP_EVENTS_MS})
        self.db(tenant).write(tx)

    def observe(self, tenant: str, changes: list[dict]) -> None:
        """Store observer: a re-pushed unit (its fields may have changed) and a deleted one. New units
        are in the feed already. A failure here is logged: the change itself is durable and acked."""
        rows = [(UNITS_PREFIX + c["cid"], "deleted" if c["status"] == "deleted" else "changed")
                for c in changes if c.get("status") in ("duplicate", "deleted")]
        try:
            self.record(tenant, rows)
        except Exception:  # noqa: BLE001 - listeners may miss this one change; the write is not undone
            log.exception("could not record %d change(s) for listeners of tenant %s", len(rows), tenant)

    def max_n(self, tenant: str) -> int:
        return self.db(tenant).read(lambda c: c.execute(sql("events_max")).fetchone()[0])

    def since(self, tenant: str, after: int, limit: int = 1000) -> list:
        return self.db(tenant).read(lambda c: c.execute(sql("events_since"), {"after": after, "limit": limit})
                                    .fetchall())

    def close(self) -> None:
        self.db.close()


class Slots:
    """Open streams of every worker, so the per-key and per-tenant limits hold across processes."""

    def __init__(self, config):
        self.config = config
        self.owner = secrets.token_hex(8)
        self.db = Db(config.data_path / "streams.db", "streams_schema.sql", config, pool_size=1,
                     cache_size_kib=256, may_be_unlinked=False)

    def take(self, tenant: str, key_id: str, kind: str) -> str:
        slot = secrets.token_hex(8)
        cfg = self.config

        def tx(conn):
            now = int(time.time() * 1000)
            conn.execute(sql("listeners_expire"), {"before": now - STALE_MS})
            n_tenant, n_key = conn.execute(sql("listeners_count"), {"tenant": tenant, "key_id": key_id}).fetchone()
            if n_key >= cfg.max_listeners_per_key:
                raise LimitReached("key", cfg.max_listeners_per_key)
            if n_tenant >= cfg.max_listeners_per_tenant:
                raise LimitReached("tenant", cfg.max_listeners_per_tenant)
            conn.execute(sql("listeners_insert"), {"id": slot, "tenant": tenant, "key_id": key_id,
                                                   "owner": self.owner, "kind": kind, "now": now})
        self.db.write(tx)
        return slot

    def release(self, slot: str) -> None:
        self.db.write(lambda c: c.execute(sql("listeners_delete"), {"id": slot}))

    def count(self, tenant: str) -> int:
        """The tenant's open streams over every worker (a dead worker's past STALE_MS not counted)."""
        after = int(time.time() * 1000) - STALE_MS
        return self.db.read(lambda c: c.execute(sql("listeners_open"), {"tenant": tenant, "after": after}).fetchone()[0])

    def touch(self) -> None:
        self.db.write(lambda c: c.execute(sql("listeners_touch"), {"now": int(time.time() * 1000),
                                                                   "owner": self.owner}))

    def close(self) -> None:
        self.db.close()


class Sources:
    """Where the hub reads changes on the SQLite backend: the feed and the change log in the tenant's files,
    the stream slots in ``<data>/streams.db``; polled every ``listen_poll_ms``. The PostgreSQL backend's
    counterpart, with the same methods, is service/store/postgresql/live.py's Sources (tables, woken by NOTIFY)."""

    def __init__(self, store):
        self.store = store
        self.changes = ChangeLog(store)
        self.slots = Slots(store.config)
        store.observers.append(self.changes.observe)

    def feed(self, tenant: str, after: int, limit: int) -> tuple[list[FeedUnit], int]:
        """New units with seq > after (events.read_feed), and the seq the feed is resolved to."""
        return read_feed(self.store.tenant(tenant), after, limit, tokenizer=self.store.tokenizer,
                         batch=self.store.config.index_batch)

    def expiry(self, tenant: str, cid: str) -> int | None:
        return unit_expiry(self.store.tenant(tenant), cid)

    def positions(self, tenant: str) -> tuple[int, int]:
        """(the tenant's last seq, the change log's last n)."""
        return self.store.max_seq(tenant), self.changes.max_n(tenant)

    def wait(self, timeout: float, stop: threading.Event) -> set[str] | None:
        """Block until the next look; the tenants known to have changed, or None: look at every one."""
        stop.wait(timeout)
        return None

    def close(self) -> None:
        self.slots.close()
        self.changes.close()
