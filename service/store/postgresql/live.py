"""Live context on PostgreSQL (docs/design.md §12): every node's listeners hear
every node's changes.

The tables are the source of truth; NOTIFY only wakes (service/hub.py's interface, as Sources):

- **the feed**: new units in the catalog's ``seq`` order. Seqs are assigned under the tenant's row lock,
  so once a seq is visible every lower one is visible or gone: the feed never skips a unit. A unit's
  terms are its ``unit_terms`` keys once indexed, else its content tokenized here (the indexer's tokens).
- **the change log** (``live_events``): re-pushes, deletes, forgets and tool changes, written by the
  change's own transaction (service/store/postgresql/store.py, rows.py, registry.py), numbered per tenant under the
  same row lock, so a row exists iff its change committed and rows appear in number order.
- **wake-ups**: after a commit the node sends ``NOTIFY cms_live, '<tenant>'`` (never content). Each
  worker's hub holds one listening connection; a notification makes it read that tenant's feed and log
  from its own last positions. A lost notification or a reconnect loses nothing: the hub also looks at
  every watched tenant each LOOK_S (or ``listen_poll_ms``, if longer), and after a reconnect at once.
- **stream slots** (``live_listeners``): the per-key and per-tenant limits over every worker of every node.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
import zlib

import psycopg

from ...config import redact
from ...live import KEEP_EVENTS_MS, STALE_MS, FeedUnit, LimitReached
from ...units import now_ms
from .queries import sql

log = logging.getLogger(__name__)

LOOK_S = 1.0                   # the longest wait for a notification; without one the hub looks at every
                               # watched tenant this often (hub.FULL_LOOK_S; or every listen_poll_ms if longer)
LISTENER_LOCKS = 2 << 32       # + crc32(tenant): the advisory lock of a tenant's stream slots


def record_changes(conn, tenant: str, changes: list[tuple[str, str]]) -> None:
    """Append (uri, kind) rows to the tenant's change log, inside the caller's transaction."""
    if changes:
        conn.execute(sql("live_events_add"), {"tenant": tenant, "uris": [u for u, _ in changes],
                                              "kinds": [k for _, k in changes], "at_ms": now_ms()})


def prune_changes(conn, now: int, keep_ms: int = KEEP_EVENTS_MS) -> None:
    """Drop change-log rows older than ``keep_ms`` (listeners need KEEP_EVENTS_MS; nodes' read indexes more)."""
    conn.execute(sql("live_events_prune"), {"before": now - max(keep_ms, KEEP_EVENTS_MS)})


def wake(store, tenant: str) -> None:
    """Wake every node's listening hubs for this tenant (after the change committed)."""
    try:
        store.db.read(lambda c: c.execute(sql("live_wake"), {"tenant": tenant}))
    except Exception:  # noqa: BLE001 - the change is committed; hubs find it at their next look (LOOK_S)
        log.warning("could not notify listeners of tenant %s", tenant, exc_info=True)


class ChangeLog:
    """live_events, read by every node's hub (the SQLite backend's ChangeLog: events.db)."""

    def __init__(self, store):
        self.store = store

    def record(self, tenant: str, changes: list[tuple[str, str]]) -> None:
        self.store.db.write(record_changes, tenant, changes)
        wake(self.store, tenant)

    def max_n(self, tenant: str) -> int:
        return self.store.db.one("live_positions", {"tenant": tenant})["n"]

    def since(self, tenant: str, after: int, limit: int = 1000) -> list:
        return self.store.db.read(lambda c: c.execute(sql("live_events_since"), {
            "tenant": tenant, "after": after, "limit": limit}).fetchall())

    def close(self) -> None:
        pass


class Slots:
    """Open streams of every worker of every node (the SQLite backend's Slots: streams.db), counted under a
    per-tenant lock."""

    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.owner = secrets.token_hex(8)
        self._tenants: dict[str, str] = {}        # slot -> tenant
        self._lock = threading.Lock()

    def take(self, tenant: str, key_id: str, kind: str) -> str:
        slot = secrets.token_hex(8)
        cfg = self.config

        def tx(conn):
            now = now_ms()
            conn.execute(sql("live_listeners_lock"), {"key": LISTENER_LOCKS + zlib.crc32(tenant.encode())})
            conn.execute(sql("live_listeners_expire"), {"tenant": tenant, "before": now - STALE_MS})
            n = conn.execute(sql("live_listeners_count"), {"tenant": tenant, "key_id": key_id}).fetchone()
            if n["key_n"] >= cfg.max_listeners_per_key:
                raise LimitReached("key", cfg.max_listeners_per_key)
            if n["tenant_n"] >= cfg.max_listeners_per_tenant:
                raise LimitReached("tenant", cfg.max_listeners_per_tenant)
            conn.execute(sql("live_listeners_insert"), {"tenant": tenant, "id": slot, "key_id": key_id,
                                                        "owner": self.owner, "kind": kind, "now": now})
        self.store.db.write(tx)
        with self._lock:
            self._tenants[slot] = tenant
        return slot

    def release(self, slot: str) -> None:
        with self._lock:
            tenant = self._tenants.pop(slot, None)
        if tenant is not None:
            self.store.db.write(lambda c: c.execute(sql("live_listeners_delete"), {"tenant": tenant, "id": slot}))

    def count(self, tenant: str) -> int:
        """The tenant's open streams over every worker of every node (a dead worker's past STALE_MS not counted)."""
        return self.store.db.read(lambda c: c.execute(sql("live_listeners_open"), {
            "tenant": tenant, "after": now_ms() - STALE_MS}).fetchone()["n"])

    def touch(self) -> None:
        self.store.db.write(lambda c: c.execute(sql("live_listeners_touch"), {"now": now_ms(), "owner": self.owner}))

    def close(self) -> None:
        pass


class Sources:
    """What service/hub.py reads on PostgreSQL: feed, change log, slots, and NOTIFY wake-ups."""

    def __init__(self, store):
        self.store = store
        self.changes = ChangeLog(store)
        self.slots = Slots(store)
        self._conn: psycopg.Connection | None = None     # this worker's listening connection (hub thread)
        store.listeners.append(lambda tenant, days: wake(store, tenant))      # a push committed
        store.observers.append(lambda tenant, changes: wake(store, tenant))   # a delete or forget committed

    def feed(self, tenant: str, after: int, limit: int) -> tuple[list[FeedUnit], int]:
        """Live units with seq > after in seq order, and the seq the feed is resolved to."""
        rows = self.store.db.read(lambda c: c.execute(sql("live_feed"), {
            "tenant": tenant, "after": after, "limit": limit}).fetchall())
        if not rows:
            return [], after
        queued = self.store.units_at(tenant, [(r["cid"], r["day"]) for r in rows if r["type"] is None])
        now = int(time.time())
        out = []
        for r in rows:
            if r["expires_at"] <= now:
                continue
            if r["type"] is not None:
                kind, terms = r["type"], frozenset(r["tfs"])
            elif r["cid"] in queued:                # not indexed yet (or no tokens): the indexer's tokens
                u = queued[r["cid"]]
                kind, terms = u["type"], frozenset(self.store.tokenizer.tokens(u["content"]))
            else:
                continue                            # deleted since
            out.append(FeedUnit(r["seq"], r["cid"], kind, r["source"], r["timestamp"], r["expires_at"], terms))
        return out, rows[-1]["seq"]

    def expiry(self, tenant: str, cid: str) -> int | None:
        row = self.store.db.one("live_expiry", {"tenant": tenant, "cid": cid})
        return row["expires_at"] if row is not None else None

    def positions(self, tenant: str) -> tuple[int, int]:
        row = self.store.db.one("live_positions", {"tenant": tenant})
        return row["seq"], row["n"]

    def wait(self, timeout: float, stop: threading.Event) -> set[str] | None:
        """Block until a notification or at most LOOK_S: the tenants named (maybe none; the hub looks at
        every tenant every ``max(LOOK_S, timeout)`` anyway), or None after a reconnect: look at every one."""
        if self._conn is None:
            try:
                self._conn = psycopg.connect(self.store.config.store, autocommit=True, connect_timeout=5,
                                             application_name="cms-live")
                self._conn.execute(sql("live_listen"))
            except psycopg.Error as e:
                log.warning("live hub: cannot listen on %s: %s", redact(self.store.config.store),
                            redact(str(e)).strip())
                self._drop()
                stop.wait(LOOK_S)
            return None             # (re)connected: a wake-up may have been missed meanwhile
        tenants: set[str] = set()
        try:
            for note in self._conn.notifies(timeout=LOOK_S, stop_after=1):
                tenants.add(note.payload)
            if tenants:             # the rest of a burst, in one look
                tenants.update(note.payload for note in self._conn.notifies(timeout=0.005))
        except psycopg.Error as e:
            log.warning("live hub: listening connection lost (%s); reconnecting", type(e).__name__)
            self._drop()
            return None
        return tenants

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def close(self) -> None:
        self._drop()
