"""The indexer on PostgreSQL: any node may index any queued unit, with no leader (docs/design.md §5.2).

A transaction claims up to a batch of queue rows (``FOR UPDATE ... SKIP LOCKED``: rows another node holds are
skipped, not waited for), tokenizes their units, writes each one's term frequencies (``tfs``), adds their BM25
statistics and deletes the queue rows; a crash before the commit leaves the rows queued for whoever comes next.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg_pool import PoolTimeout

from ...errors import StorageUnavailable
from ...units import SEARCHED_COLUMNS
from .queries import lock_wait, sql
from .rows import add_df, dumps

SEARCH_COLUMNS = ("tenant", "day", *SEARCHED_COLUMNS)       # a unit_terms row's, beside its ntok and tfs
CATCH_UP_POLL_S = 0.005          # while another node's indexer holds rows a strong read waits for
TOKEN_CHUNK = 64                 # units per indexing-pool task when a batch is tokenized in parallel


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
                  pool: ThreadPoolExecutor | None = None, on_lags=None, lock_wait_ms: int | None = None) -> int:
    """Index up to ``limit`` queued units (of one tenant, or any); return how many. With ``lock_wait_ms``, a
    lock (a partition's DDL) waited for longer than that is a 503, not a wait for as long as it is held."""
    def tx(conn):
        conn.execute(sql("index_plan"))
        if lock_wait_ms is not None:
            lock_wait(conn, lock_wait_ms)
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
            with store.db.primary.connection() as conn, conn.transaction():
                return tx(conn)
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            time.sleep(0.01 * (attempt + 1))
        except (psycopg.OperationalError, PoolTimeout) as e:
            # (a strong search or a forget waits on this: the primary gone is a 503, as for any write)
            raise StorageUnavailable(f"Storage is unavailable: {type(e).__name__}") from e
    return store.db.write(tx)


def catch_up(store, tenant: str, wait_ms: int) -> None:
    """Read-your-writes for strong searches and forget, bounded in time: index the tenant's queue now,
    then wait for the rows another node's indexer holds (the claim skips them) to be committed, so
    every unit pushed before the call is searchable when it returns."""
    if store.db.primary_down():
        raise StorageUnavailable("Storage is unavailable: the PostgreSQL primary does not answer")
    before = time.time() * 1000
    deadline = time.monotonic() + wait_ms / 1000
    batch = store.config.pg_index_batch
    while time.monotonic() < deadline:
        left_ms = max(100, (deadline - time.monotonic()) * 1000)
        if index_pending(store, store.tokenizer, batch, tenant=tenant, lock_wait_ms=left_ms) == batch:
            continue
        if not store.db.one("pending_before", {"tenant": tenant, "before": before})["waiting"]:
            return
        time.sleep(CATCH_UP_POLL_S)
