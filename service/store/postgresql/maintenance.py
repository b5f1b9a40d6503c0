"""Indexer and janitor on PostgreSQL: any node may do either, with no leader.

Indexer: a transaction claims up to a batch of queue rows (``FOR UPDATE ... SKIP LOCKED``: rows
another node holds are skipped, not waited for), tokenizes their units, writes each one's term
frequencies (``tfs``),
adds their BM25 statistics and deletes the queue rows; a crash before the commit leaves the rows
queued for whoever comes next. Janitor: per tenant under a transaction-level advisory lock, deletes
expired units with their statistics, then drops day partitions no unit lives in any more.
"""
from __future__ import annotations

import logging
import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, wait

import psycopg
from psycopg import sql as pgsql
from psycopg_pool import PoolTimeout

from ...errors import StorageUnavailable
from ...instruments import DAYS_UNLINKED, UNITS_INDEXED, UNITS_PURGED
from ..loop import Loop, TenantLock
from .nodeindex import INDEX_CHANGES_KEEP_MS, NodeIndex
from .live import prune_changes
from .queries import sql, template
from .rows import JANITOR_LOCKS, PARTITION_LOCK, add_df, dumps, partition_day, unstat

log = logging.getLogger(__name__)

PURGE_BATCH = 5000
SEARCH_COLUMNS = ("tenant", "cid", "day", "seq", "type", "source", "timestamp", "expires_at", "parent_cid", "project",
                  "is_global")
CATCH_UP_POLL_S = 0.005          # while another node's indexer holds rows a strong read waits for
TOKEN_CHUNK = 64                 # units per thread-pool task when a batch is tokenized in parallel
# Indexer transactions one process keeps in flight while its queue is long: while one's statements run on
# the server (its process waits on the socket, the GIL released), the next claims and tokenizes its batch
# (SKIP LOCKED: other rows). The two then write in turn: the second waits at the statistics rows the
# first holds until it commits, and both lock them in one order.
INDEXERS = 2


def _tokenize(tokenizer, texts: list[str], pool: ThreadPoolExecutor | None) -> list[list[str]]:
    if pool is None or len(texts) <= TOKEN_CHUNK:
        return [tokenizer.tokens(x) for x in texts]
    chunks = [texts[i:i + TOKEN_CHUNK] for i in range(0, len(texts), TOKEN_CHUNK)]
    return [tl for part in pool.map(lambda ch: [tokenizer.tokens(x) for x in ch], chunks) for tl in part]


def _index_claimed(conn, rows, token_lists) -> None:
    """Write claimed units' term frequencies and lengths, their statistics, and take them off the queue:
    a handful of statements whatever the batch's size, sent in one pipeline (one round trip)."""
    inserts = []
    claimed: dict[str, list[str]] = defaultdict(list)
    docs: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    dfs: dict[str, Counter] = defaultdict(Counter)
    for r, toks in zip(rows, token_lists):
        claimed[r["tenant"]].append(r["cid"])
        if not toks:   # empty or whitespace content is stored but not searchable (or the unit is gone)
            continue
        tfs = Counter(toks)
        inserts.append({**{k: r[k] for k in SEARCH_COLUMNS}, "ntok": len(toks), "tfs": tfs})
        key = (r["tenant"], r["day"])
        docs[key][0] += 1
        docs[key][1] += len(toks)
        dfs[r["tenant"]].update(tfs.keys())
    with conn.pipeline():
        if inserts:
            conn.execute(sql("unit_terms_insert"), {"rows": dumps(inserts)})
            conn.execute(sql("unit_terms_clean"))
        # Rows locked in one order by every indexer, and by deletes and the janitor (rows.unstat:
        # statistics, then the tenant's mark): no deadlock.
        for tenant in sorted(claimed):
            conn.execute(sql("pending_delete_many"), {"tenant": tenant, "cids": claimed[tenant]})
        for key in sorted(docs):
            conn.execute(sql("stats_add"), {"tenant": key[0], "day": key[1], "ndocs": docs[key][0],
                                            "ntokens": docs[key][1]})
        for tenant in sorted(dfs):
            add_df(conn, tenant, dfs[tenant])
        for tenant in sorted(claimed):
            conn.execute(sql("index_mark"), {"tenant": tenant})


def index_pending(store, tokenizer, limit: int = 512, tenant: str | None = None,
                  pool: ThreadPoolExecutor | None = None, on_lags=None) -> int:
    """Index up to ``limit`` queued units (of one tenant, or any); return how many."""
    def tx(conn):
        conn.execute(sql("index_plan"))
        if tenant is None:
            rows = conn.execute(sql("pending_claim"), {"limit": limit}).fetchall()
        else:
            rows = conn.execute(sql("pending_claim_tenant"), {"limit": limit, "tenant": tenant}).fetchall()
        if rows:
            _index_claimed(conn, rows, _tokenize(tokenizer, [r["content"] or "" for r in rows], pool))
            if on_lags is not None:
                now = time.time() * 1000
                on_lags([now - r["pushed_ms"] for r in rows])
        return len(rows)

    for attempt in range(5):
        try:
            with store.primary.connection() as conn, conn.transaction():
                return tx(conn)
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            time.sleep(0.01 * (attempt + 1))
        except (psycopg.OperationalError, PoolTimeout) as e:
            # (a strong search or a forget waits on this: the primary gone is a 503, as for any write)
            raise StorageUnavailable(f"Storage is unavailable: {type(e).__name__}") from e
    return store.write(tx)


def catch_up(store, tenant: str, wait_ms: int) -> None:
    """Read-your-writes for strong searches and forget, bounded in time: index the tenant's queue now,
    then wait for the rows another node's indexer holds (the claim skips them) to be committed, so
    every unit pushed before the call is searchable when it returns."""
    if store.primary_down():
        raise StorageUnavailable("Storage is unavailable: the PostgreSQL primary does not answer")
    before = time.time() * 1000
    deadline = time.monotonic() + wait_ms / 1000
    batch = store.config.pg_index_batch
    while time.monotonic() < deadline:
        if index_pending(store, store.tokenizer, batch, tenant=tenant) == batch:
            continue
        if not store.one("pending_before", {"tenant": tenant, "before": before})["waiting"]:
            return
        time.sleep(CATCH_UP_POLL_S)


def purge_tenant(store, tenant: str, now: int) -> int:
    """Delete a tenant's expired units (and their statistics, queue and catalog rows); one node at a time."""
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
    return store.write(tx)


def _partition_dead(conn, part, day: str) -> bool:
    busy = conn.execute(template("partition_has_rows", part=part)).fetchone()["b"]
    return not (busy or conn.execute(sql("day_live_anywhere"), {"day": day}).fetchone()["b"])


def _drop_if_dead(conn, name: str) -> bool:
    # Every push holds the partition lock shared from its look at its partitions to its commit: with it
    # held exclusively no push is between the two. Taken only if free, since pushes would queue behind
    # a janitor waiting for it; a busy partition is dropped on a later pass.
    if not conn.execute(sql("advisory_try_lock"), {"key": PARTITION_LOCK}).fetchone()["ok"]:
        return False
    conn.execute(sql("lock_timeout"))
    part, day = pgsql.Identifier(name), partition_day(name)
    if not _partition_dead(conn, part, day):
        return False
    # The locks DROP takes, in a push's order (the parent table, then the partition), so that it never
    # deadlocks with a search. No second look under them: with the partition lock held no push writes.
    conn.execute(template("partition_lock", part=part))
    conn.execute(template("partition_drop", part=part))
    return True


def drop_dead_partitions(store) -> list[str]:
    """Drop day partitions that hold no unit and that no tenant counts as live (the TTL drop)."""
    dropped = []
    for r in store.read(lambda c: c.execute(sql("partitions")).fetchall()):
        try:
            if store.write(_drop_if_dead, r["name"]):
                dropped.append(partition_day(r["name"]))
                log.info("dropped expired day partition %s", r["name"])
        except Exception as e:  # noqa: BLE001  (a busy partition is dropped on a later pass)
            log.info("day partition %s not dropped now: %s", r["name"], e)
    DAYS_UNLINKED.inc(len(dropped))
    return dropped


class PgMaintenance(Loop):
    """The background indexer and janitor of one process (every node runs one; no leader), and this node's
    read indexes of the tenants it leads (one process of the node per tenant, as on SQLite)."""

    def __init__(self, store):
        super().__init__(store)
        self._locks: dict[str, TenantLock] = {}
        self.node_indexes: dict[str, NodeIndex] = {}
        self.indexers = ThreadPoolExecutor(INDEXERS, thread_name_prefix="pg-indexer")

    def stopped(self) -> None:
        self.indexers.shutdown(wait=True)
        self.step_down()

    def step_down(self) -> None:
        for ni in self.node_indexes.values():
            ni.close()
        self.node_indexes.clear()
        for lock in self._locks.values():
            lock.release()
        self._locks.clear()

    def leads(self, tenant: str) -> bool:
        lock = self._locks.get(tenant)
        if lock is None:
            folder = self.store.root / "tenants" / tenant
            folder.mkdir(parents=True, exist_ok=True)
            lock = self._locks[tenant] = TenantLock(folder / "maintenance.lock")
        return lock.try_acquire()

    def node_index(self, tenant: str) -> NodeIndex:
        ni = self.node_indexes.get(tenant)
        if ni is None:
            ni = self.node_indexes[tenant] = NodeIndex(self.store, tenant)
        return ni

    def sync_node_indexes(self, purge: bool = False) -> int:
        """Bring this node's read index of each tenant it leads up to date with PostgreSQL (when due)."""
        sent = 0
        if not self.config.replicas:
            return sent
        for tenant in self.store.tenant_names():
            if self._stop.is_set() or not self.leads(tenant):
                continue
            ni = self.node_index(tenant)
            if ni.due() or purge or ni.building:
                try:
                    sent += ni.sync(purge=purge)
                except Exception:  # noqa: BLE001 - the next pass starts again from the last state written
                    log.exception("read index of tenant %s: pass failed", tenant)
        return sent

    def _drain(self) -> int:
        """Index queued units batch after batch until a batch comes up short (the queue is empty)."""
        total = 0
        while not self._stop.is_set():
            n = self._index_batch()
            total += n
            if n < self.config.pg_index_batch:
                break
        return total

    def _index_batch(self) -> int:
        return index_pending(self.store, self.tokenizer, self.config.pg_index_batch, pool=self.pool,
                             on_lags=self._record_lags)

    def run_once(self, force_janitor: bool = False) -> int:
        """Index every queued unit (any tenant); the janitor when due; this node's read indexes. Returns
        units indexed."""
        total = self._index_batch()       # a short queue, the usual case, is one batch in this thread
        if total == self.config.pg_index_batch and not self._stop.is_set():
            drains = [self.indexers.submit(self._drain) for _ in range(INDEXERS)]
            wait(drains)
            total += sum(f.result() for f in drains)     # (a failed one raises once both are done)
        UNITS_INDEXED.inc(total)
        if self.janitor_due(force_janitor):
            now = int(time.time())
            for tenant in self.store.tenant_names():
                UNITS_PURGED.inc(purge_tenant(self.store, tenant, now))
            self.store.write(lambda c: c.execute(sql("pending_orphans")))
            self.store.write(prune_changes, int(time.time() * 1000), INDEX_CHANGES_KEEP_MS)
            drop_dead_partitions(self.store)
            self._last_janitor = time.time()
            self.sync_node_indexes(purge=True)
        else:
            self.sync_node_indexes()
        return total
