"""The store API on PostgreSQL: the same public methods and answers as service/store/sqlite/store.py.

Push protocol: one transaction per request locks the tenant's row (its seq counter), checks every
unit's CID against the catalog (duplicate, 409 collision, parent), inserts catalog, unit and queue
rows, and commits; only then the ack. There is no window in which a catalog row exists without its
unit (one transaction), so the SQLite backend's stale-reservation repair has no counterpart here.
"""
from __future__ import annotations

import logging
import time

from psycopg import sql as pgsql

from ...errors import ApiError, NotFound
from ...formats import TENANT_RE, is_cid
from ...tokenize import tokenizer_for
from ...units import now_ms, unit_dict
from ...uris import UNITS_PREFIX
from ..base import StoreApi
from ...budget import Budget
from ...readindex.reader import Readers
from ..push import PushPlan, check_day_cap
from . import manage, threads
from .connections import Db
from .live import record_changes
from .queries import schema, sql, template
from .rows import (
    PARTITION_LOCK,
    SCHEMA_LOCK,
    SCHEMA_VERSION,
    THREADS_VERSION,
    backfill_keys,
    escape_content,
    next_day,
    partition_name,
    units_at,
)
from .search import Searcher

log = logging.getLogger(__name__)

class PartitionGone(Exception):
    """A day partition a push needs was dropped (empty) between its look and its lock."""


class Store(StoreApi):
    """Every tenant in one PostgreSQL database; ``searcher.standby`` a streaming hot standby of it."""

    backend = "postgresql"
    manage = manage         # list, stats, export and forget (service/store/postgresql/manage.py)

    def __init__(self, config):
        super().__init__(config)
        # Local files a node still keeps: the MCP cursor key when none is configured (set
        # CONTEXT_MCP_CURSOR_SECRET on every node behind one load balancer).
        self.root = config.data_path
        self.root.mkdir(parents=True, exist_ok=True)
        self.db = Db(config)
        self.db.write(self._ensure_schema, config.thread_gap_s)
        # what this process keeps open for its tenants (service/budget.py, issue 49): read indexes, writers
        self.budget = Budget.of(config)
        # this process's views of the node's read indexes (a tantivy file watcher each while loaded)
        self.readers = Readers(self.root, self.budget.read_indexes, self.budget.idle_s)
        self.change_numbers = self.readers.change_numbers
        self.listeners: list = []   # callables(tenant, days) told about new queued units
        self.observers: list = []   # callables(tenant, changes) told after a delete or forget committed
        self.tokenizer = tokenizer_for(config)
        self.searcher = Searcher(self)

    # --- connections ------------------------------------------------------------------------------
    @staticmethod
    def _ensure_schema(conn, gap: int) -> None:
        """Create the tables once, or upgrade them from an earlier schema version (re-runnable; under a
        lock, since every node starts with this): a database made before version 4 gets its units' keys
        (backfill_keys), one made before threads (5) its units' threads (threads.migrate), in the same
        transaction. With CONTEXT_THREAD_GAP_S, the index time adjacency reads."""
        for bound in ("lock_timeout", "statement_timeout"):      # (an upgrade may wait on another node's, and
            conn.execute(sql(bound), {"ms": "0"})                # take minutes: not a request's bounds)
        present = conn.execute(sql("schema_present")).fetchone()["ok"]
        if not (present and conn.execute(sql("schema_version")).fetchone()["version"] >= SCHEMA_VERSION):
            conn.execute(sql("advisory_lock"), {"key": SCHEMA_LOCK})
            # (read again under the lock: another node may have upgraded it meanwhile; no meta table: a new database)
            before = (conn.execute(sql("schema_version")).fetchone()["version"]
                      if conn.execute(sql("meta_present")).fetchone()["ok"] else SCHEMA_VERSION)
            conn.execute(schema())
            if before < 4:                  # (version 4 added the keys derived from metadata)
                backfill_keys(conn)
            if before < THREADS_VERSION:
                threads.migrate(conn, gap)
        if gap > 0:
            threads.ensure_gap_index(conn)

    def sweep(self) -> None:
        self.readers.sweep()
        self.searcher.sweep()

    def close(self) -> None:
        self.readers.close()
        self.db.close()

    # --- tenants ----------------------------------------------------------------------------------
    def read_index_lag(self, tenant: str) -> dict | None:
        if not self.config.replicas:
            return None
        state = self.readers.state(tenant) if self.readers.view(tenant) is not None else None
        row, _ = self.db.read_fresh(lambda c: c.execute(sql("node_behind"), {
            "tenant": tenant, "low": (state or {}).get("low", 1), "now": int(time.time())}).fetchone())
        return {"units": row["n"], "lag_ms": max(0, now_ms() - row["oldest"]) if row["oldest"] else 0}

    def read_index_state(self, tenant: str) -> dict | None:
        """The node's read index of this tenant (its last pass: low, seq, backlog) when default searches
        read it; None when they read the tables."""
        if not self.config.replicas or self.readers.view(tenant) is None:
            return None
        return self.readers.state(tenant) or {}

    def tenant_names(self) -> list[str]:
        return [r["tenant"] for r in self.db.read(lambda c: c.execute(sql("tenant_names")).fetchall())
                if TENANT_RE.match(r["tenant"])]

    def live_days(self, tenant: str, first: str = "0001-01-01", last: str = "9999-12-31") -> list[str]:
        return [r["day"] for r in self.db.read(lambda c: c.execute(sql("days_live"), {
            "tenant": tenant, "now": int(time.time()), "first": first, "last": last}).fetchall())]

    def max_seq(self, tenant: str) -> int:
        return self.db.one("tenant_seq", {"tenant": tenant})["seq"]

    # --- push -------------------------------------------------------------------------------------
    def push_many(self, tenant: str, raws: list) -> list[dict | ApiError]:
        """Validate and store units; per item a result dict or the ApiError that rejected it."""
        now = time.time()
        results, valid = self.validate(raws, now)
        if not valid:
            return results
        days = sorted({u.day for _, u in valid})
        self.check_days_per_request(days)
        out = list(results)
        try:
            self.db.write(self._push_tx, tenant, valid, now, out, days, False)
        except PartitionGone:
            # a new day, or one the janitor dropped (empty): create it, holding the partition lock
            # exclusively, in the transaction that writes the units, so nothing drops it before they commit
            out = list(results)
            self.db.write(self._push_tx, tenant, valid, now, out, days, True)
        for listener in self.listeners:
            listener(tenant, days)
        return out

    @staticmethod
    def _hold_partitions(conn, days: list[str], create: bool) -> None:
        """Day partitions for these days that stay until this transaction ends. The janitor drops a
        partition only with the partition lock held exclusively, so a push holds it shared, then looks
        (PartitionGone if a day has none); ``create`` takes the lock exclusively and creates what is
        missing. (A cache of known partitions, looked at outside the transaction, lost pushes: the
        janitor, sweeping through empty days, dropped one after each of three looks: a 500 in CI.)"""
        names = {partition_name(d): d for d in days}

        def missing() -> list[str]:
            return [names[r["name"]] for r in conn.execute(sql("partitions_missing"), {"names": list(names)})]
        if not create:
            with conn.pipeline():           # one round trip: the lock, then the look
                conn.execute(sql("advisory_lock_shared"), {"key": PARTITION_LOCK})
                if missing():
                    raise PartitionGone
            return
        conn.execute(sql("advisory_lock"), {"key": PARTITION_LOCK})
        for day in missing():
            # the name from a validated day (digits and dashes only), bounds as literals
            part = pgsql.Identifier(partition_name(day))
            conn.execute(template("partition_create", part=part))
            conn.execute(template("partition_attach", part=part, lo=pgsql.Literal(day), hi=pgsql.Literal(next_day(day))))

    def _check_tenant_days(self, conn, tenant: str, days: list[str]) -> None:
        cap = self.config.max_days_per_tenant
        if not cap:
            return
        known = {r["day"] for r in conn.execute(sql("days_known"), {"tenant": tenant, "days": days})}
        check_day_cap(cap, len([d for d in days if d not in known]),
                      lambda: conn.execute(sql("days_count"), {"tenant": tenant}).fetchone()["n"])

    def _push_tx(self, conn, tenant: str, valid: list, now: float, results: list, days: list[str],
                 create: bool) -> None:
        last = conn.execute(sql("tenant_lock"), {"tenant": tenant}).fetchone()["last_seq"]
        # after the tenant's row (which may wait for that tenant's delete or forget): a push holds the
        # partition lock only while it writes, so no janitor or other tenant's new day waits on a forget
        self._hold_partitions(conn, days, create)
        self._check_tenant_days(conn, tenant, days)
        wanted = list({u.cid for _, u in valid} | {u.parent_cid for _, u in valid if u.parent_cid})
        with conn.pipeline():           # one round trip: the batch's catalog rows and its threads' last places
            rows = conn.execute(sql("catalog_many"), {"tenant": tenant, "cids": wanted})
            ends = conn.cursor().execute(sql("catalog_threads_last"), {
                "tenant": tenant, "cids": wanted, "threads": threads.candidate_threads([u for _, u in valid])})
            stored = {r["cid"]: r for r in rows.fetchall()}
            lookup = threads.CatalogThreads(conn, tenant, threads.read_ahead(ends.fetchall()))
        plan = Plan(tenant, last, now_ms(), stored, now, lookup, self.config.thread_gap_s)
        for i, u in valid:
            try:
                results[i] = plan.add(u)
            except ApiError as e:
                results[i] = e
        plan.write(conn)
        # a re-pushed unit (its fields may have changed) is a change listeners hear: in the log
        # with the push, so it is there iff the push committed; new units are the feed (service/store/postgresql/live.py)
        record_changes(conn, tenant, [(UNITS_PREFIX + r["cid"], "changed") for r in results
                                      if isinstance(r, dict) and r["status"] == "duplicate"])

    # --- reads ------------------------------------------------------------------------------------
    def get(self, tenant: str, cid: str) -> dict | None:
        """One live unit, or None (unknown or expired)."""
        if not is_cid(cid):
            return None
        now = int(time.time())
        found = self.db.one("catalog_day", {"tenant": tenant, "cid": cid, "now": now})
        if found is None:
            return None
        # (the day as a value: only its partition is planned and read)
        rows = self.units_at(tenant, [(cid, found["day"])])
        return unit_dict(rows[cid]) if cid in rows and rows[cid]["expires_at"] > now else None

    def units_at(self, tenant: str, located: list[tuple[str, str]]) -> dict:
        """Stored units by CID, of these (cid, day) pairs."""
        return self.db.read(units_at, tenant, located)

    def thread_window(self, tenant: str, cids: list[str], n: int) -> dict[str, list[tuple[int, dict]]]:
        now = int(time.time())
        rows = self.db.read(lambda c: c.execute(sql("catalog_window"), {
            "tenant": tenant, "cids": cids, "n": n, "now": now}).fetchall())
        units = self.units_at(tenant, list({(r["cid"], r["day"]) for r in rows}))
        out: dict[str, list[tuple[int, dict]]] = {cid: [] for cid in cids}
        for r in rows:
            u = units.get(r["cid"])
            if u is not None and u["expires_at"] > now:
                out[r["around"]].append((r["shift"], unit_dict(u)))
        return out

    def children(self, tenant: str, cid: str, limit: int) -> list[str]:
        return [r["cid"] for r in self.db.read(lambda c: c.execute(sql("catalog_children"), {
            "tenant": tenant, "cid": cid, "now": int(time.time()), "limit": limit}).fetchall())]

    def recent(self, tenant: str, limit: int = 50, before_seq: int | None = None) -> list[dict]:
        """Live units, newest (highest seq) first, strictly below ``before_seq``."""
        now = int(time.time())
        rows = self.db.read(lambda c: c.execute(sql("catalog_recent"), {
            "tenant": tenant, "now": now, "before": before_seq if before_seq is not None else 2**62,
            "limit": limit}).fetchall())
        units = self.units_at(tenant, [(r["cid"], r["day"]) for r in rows])
        return [unit_dict(units[r["cid"]]) for r in rows if r["cid"] in units and units[r["cid"]]["expires_at"] > now]

    def delete(self, tenant: str, cid: str) -> dict:
        """Remove a unit everywhere: catalog, unit row, queue row and its share of the BM25 statistics."""
        if not is_cid(cid) or not self.remove(tenant, {"": [cid]}):
            raise NotFound(f"No live unit with CID {cid!r}.", field="cid")
        return {"status": "deleted", "cid": cid}

    # --- operations -------------------------------------------------------------------------------
    def freshness(self, tenant: str) -> dict:
        """What a default search of this tenant cannot see yet without reading PostgreSQL: with this node's
        read index, the live units it lacks (its lag behind PostgreSQL) and how long the oldest has waited;
        without, the units still queued for the indexer and the standby's replay lag."""
        state = self.read_index_state(tenant)

        def read(conn):
            if state is None:
                return conn.execute(sql("pending_count"), {"tenant": tenant}).fetchone()
            return conn.execute(sql("node_behind"), {"tenant": tenant, "low": state.get("low", 1),
                                                     "now": int(time.time())}).fetchone()
        row, where = self.db.read_fresh(read)
        lag = max(0, now_ms() - row["oldest"]) if row["oldest"] else 0
        standby = self.searcher.standby
        if standby is not None and (state is None or where == "standby"):
            lag = max(lag, standby.lag_ms() or 0)
        return {"index_pending": row["n"], "replica_lag_ms": lag, "read_index": state is not None}

    def live_counts(self, tenant: str) -> dict:
        live = self.db.one("catalog_count_live", {"tenant": tenant, "now": int(time.time())})["n"]
        return {"units_live": live, **self.freshness(tenant)}

    def check_writable(self) -> str | None:
        """None when the primary accepts a write; otherwise the problem (readiness)."""
        try:
            self.db.write(lambda c: c.execute(sql("writable_probe")))
            return None
        except ApiError as e:
            return f"PostgreSQL primary not writable: {e.message}"

    def _search(self, tenant: str, params) -> dict:
        return self.searcher.search(tenant, params)


class Plan(PushPlan):
    """One push transaction's rows: new units, duplicates' newer mutable fields, days' expiry range."""

    def __init__(self, tenant: str, last_seq: int, ms: int, stored: dict, now: float, lookup, gap: int):
        super().__init__(stored, now, threads=lookup, gap=gap)
        self.tenant = tenant
        self.last = last_seq
        self.ms = ms
        self.new: dict[str, dict] = {}       # cid -> row params, inserted after the loop
        self.updates: list[dict] = []

    def add(self, u) -> dict:
        row, _ = self.check(u)
        thread, tpos = self.thread(u, row)      # (a duplicate keeps its own)
        # the unit's columns (its seq comes below), the catalog's and the queue's; PostgreSQL's text holds no NUL
        params = {**u.columns(seq=None, thread=thread, tpos=tpos), "content": escape_content(u.content),
                  "tenant": self.tenant, "day": u.day, "digest": u.digest, "pushed_ms": self.ms}
        if row is None:
            self.last += 1
            params["seq"] = self.last
            self.new[u.cid] = params
            status = "ok"
        elif u.cid in self.new:
            # the same unit twice in one batch: the later mutable fields win, as for any duplicate
            params["seq"] = row["seq"]
            self.new[u.cid].update(params)
            status = "duplicate"
        else:
            params["seq"], params["day"] = row["seq"], row["day"]
            self.updates.append(params)
            status = "duplicate"
        self.planned(u, params)
        return {"status": status, "cid": u.cid, "seq": params["seq"], "indexed": False}

    def write(self, conn) -> None:
        with conn.cursor() as cur:
            rows = list(self.new.values())
            if rows:
                cur.executemany(sql("catalog_insert"), rows)
                cur.executemany(sql("unit_insert"), rows)
                cur.executemany(sql("pending_insert"), rows)
            if self.updates:
                cur.executemany(sql("catalog_update_mutable"), self.updates)
                cur.executemany(sql("unit_update_mutable"), self.updates)
                cur.executemany(sql("pending_update_mutable"), self.updates)
                cur.executemany(sql("unit_terms_update_mutable"), self.updates)
                # an updated row that did not fit its page put its keys in the GIN index's pending list,
                # which every search would read until the next indexer batch: empty it now
                cur.execute(sql("unit_terms_clean"))
            if self.expiry:
                cur.executemany(sql("days_upsert"), [{"tenant": self.tenant, "day": d, "lo": lo, "hi": hi}
                                                     for d, (lo, hi) in sorted(self.expiry.items())])
            cur.execute(sql("tenant_set_seq"), {"tenant": self.tenant, "seq": self.last})
