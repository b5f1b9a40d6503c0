"""The indexer (docs/design.md §2, §5.1): pending rows -> the service's tokens -> FTS5.

The ``indexed = 0`` flag is the durable queue. Tokenizing happens outside the write lock;
writing the FTS rows and flipping the flags is one transaction that re-checks the flags, so
a batch indexed twice (two workers, or a crash and a restart) changes nothing the second time.
Who runs it and when: maintenance.py's leader loop; strong searches and forget (``catch_up``); the live
feed when it meets a pending unit (live.py); read-your-writes makes the tokens of pending units and
stores them in the row for the indexer (tail.py).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ...tokenize import Tokenizer
from .connections import Db
from .queries import sql


def index_pending(db: Db, tokenizer: Tokenizer, limit: int = 512, pool: ThreadPoolExecutor | None = None,
                  on_lags=None) -> int:
    """Index up to ``limit`` pending rows of one shard; return how many rows this call indexed."""
    rows = db.read(lambda c: c.execute(sql("pending_fetch"), {"limit": limit}).fetchall())
    if not rows:
        return 0
    # tokens a search already made (read-your-writes) are reused; the others are made here
    todo = [r["content"] for r in rows if r["tokens"] is None]
    if pool is not None and len(todo) > 64:
        chunks = [todo[i:i + 64] for i in range(0, len(todo), 64)]
        made = iter([tl for part in pool.map(lambda ch: [tokenizer.tokens(x) for x in ch], chunks) for tl in part])
    else:
        made = iter([tokenizer.tokens(x) for x in todo])
    token_lists = [r["tokens"].split() if r["tokens"] is not None else next(made) for r in rows]

    def tx(conn):
        done = ndocs = ntokens = 0
        for r, toks in zip(rows, token_lists):
            joined = " ".join(toks)
            cur = conn.execute(sql("unit_mark_indexed"), {"id": r["id"], "ntok": len(toks), "tokens": joined})
            if cur.rowcount == 0:
                continue  # indexed meanwhile by another worker, or deleted
            done += 1
            if toks:  # empty or whitespace content is stored but not searchable
                conn.execute(sql("fts_insert"), {"id": r["id"], "tokens": joined})
                ndocs += 1
                ntokens += len(toks)
        if done:
            conn.execute(sql("meta_add"), {"key": "ndocs", "delta": ndocs})
            conn.execute(sql("meta_add"), {"key": "ntokens", "delta": ntokens})
            conn.execute(sql("meta_touch"), {"now_ms": int(time.time() * 1000)})
        return done

    done = db.write(tx)
    if on_lags is not None and done:
        now = time.time() * 1000
        on_lags([now - r["pushed_ms"] for r in rows])
    return done


def catch_up(t, days: list[str], tokenizer: Tokenizer, batch: int, wait_ms: int) -> None:
    """Read-your-writes for strong searches and forget, bounded in time: index what is pending in these
    day shards now, so every unit pushed before the call is searchable when it returns (or the time is up)."""
    deadline = time.monotonic() + wait_ms / 1000
    for day in days:
        db = t.shard(day, create=False)
        while db is not None and time.monotonic() < deadline:
            if index_pending(db, tokenizer, batch) < batch:
                break
