"""Seeing and managing the memory: list, stats, export and forget, store side.

Like service/store/sqlite/store.py these functions know the files and SQL; the REST views, the MCP tool and
the console call them with a tenant that auth already checked. Filters are a
:class:`~service.params.SearchParams` from ``parse_search`` (its query unused), so listing,
exporting and forgetting select units exactly as search filters them (service/store/filters.py).

- Listing and export walk the catalog by ``seq`` (ack order, as MCP ``resources/list``) and read
  the units from their day files, one query per day per page.
- Stats group each live day file by type; a day's figures are cached per process until the file
  changes (``shard_signature``) or its next unit expires.
- Forget finds the matching units day by day (FTS5 for a query) and removes them in chunks with the
  same tombstones as expiry (``rows.remove_rows``), then from the catalog: default searches drop
  read-index answers the catalog no longer holds (``Searcher._gone``), so they leave search at once;
  the read index forgets them at its next pass. The janitor compacts a day file once a tenth of it
  was forgotten (``compact``).
"""
from __future__ import annotations

import json
import os
import threading
import time
import weakref
from dataclasses import replace

from ...params import SearchParams
from ...ranking.results import MAX_QUERY_TERMS
from ...units import day_of, export_fields, unit_dict
from ..base import FETCH_ROWS, FORGET_CHUNK, PAGE_BYTES, PAGE_ROWS
from ..filters import filters
from .fts import UNIT_COLUMNS, fts_query
from .indexer import catch_up
from .rows import remove_rows
from .queries import fetch_all, fetch_one, sql

SCAN_BUDGET = 20_000           # catalog rows one page may look at; a selective filter gets a shorter page
COMPACT_SHARE = 0.10           # the janitor compacts a day file once this share of its rows was forgotten


def _all(conn, query: str, args: dict) -> list:
    return conn.execute(query, args).fetchall()


# --- list and export ------------------------------------------------------------------------------
def _catalog_page(t, p: SearchParams, pos: int, descending: bool, n: int, now: int, max_seq: int | None = None):
    """Catalog rows (seq, cid, day) past ``pos`` that the catalog's own columns do not rule out."""
    args: dict = {"now": now, "pos": pos, "n": n}
    where = filters(replace(p, types=None), args)      # expiry, source, since, until, parent
    where.append("u.seq < :pos" if descending else "u.seq > :pos")
    if max_seq is not None:
        args["max_seq"] = max_seq
        where.append("u.seq <= :max_seq")
    query = (f"SELECT seq, cid, day FROM catalog u WHERE {' AND '.join(where)} "
             f"ORDER BY seq {'DESC' if descending else 'ASC'} LIMIT :n")
    return t.catalog.read(_all, query, args)


def _fetch(t, p: SearchParams, rows, now: int) -> dict[str, dict]:
    """The live units of these catalog rows that pass every filter (type included), by CID."""
    by_day: dict[str, list[str]] = {}
    for r in rows:
        by_day.setdefault(r["day"], []).append(r["cid"])
    out: dict[str, dict] = {}
    for day, cids in by_day.items():
        db = t.shard(day, create=False)
        if db is None:
            continue
        args: dict = {"cids": json.dumps(cids), "now": now}
        where = ["u.cid IN (SELECT value FROM json_each(:cids))"] + filters(p, args)
        query = f"SELECT {UNIT_COLUMNS} FROM units u WHERE {' AND '.join(where)}"
        for r in db.read(_all, query, args):
            out[r["cid"]] = unit_dict(r)
    return out


def units_of_rows(t, rows, now: int) -> dict[str, dict]:
    """The live units of these catalog rows (cid, day), by CID, whatever a search's filters."""
    return _fetch(t, SearchParams(query=""), rows, now)


def _units_of(t, p: SearchParams, rows, now: int):
    """(catalog row, its unit or None) in the rows' order, the units read FETCH_ROWS at a time."""
    for i in range(0, len(rows), FETCH_ROWS):
        part = rows[i:i + FETCH_ROWS]
        units = _fetch(t, p, part, now)
        for r in part:
            yield r, units.get(r["cid"])


def list_units(store, tenant: str, p: SearchParams, limit: int, before: int | None = None) -> tuple[list[dict], int | None]:
    """Live units newest (highest seq) first, below ``before``; and where the next page starts
    (None: nothing older). A page looks at most SCAN_BUDGET catalog rows, so a filter that
    matches rarely answers a short (even empty) page with a position to go on from; and it ends once
    its contents pass PAGE_BYTES (large units: a shorter page, never a worker's memory)."""
    t = store.tenant(tenant)
    now = int(time.time())
    pos = before if before is not None else 2 ** 62
    out: list[dict] = []
    scanned = size = 0
    while True:
        want = limit - len(out)
        n = PAGE_ROWS if p.types else min(PAGE_ROWS, want + 8)
        rows = _catalog_page(t, p, pos, True, n, now)
        scanned += len(rows)
        for i, (r, u) in enumerate(_units_of(t, p, rows, now)):
            if u is not None:
                out.append(u)
                size += len(u["content"])
                if len(out) == limit or size >= PAGE_BYTES:
                    # no cursor when the catalog has nothing past this unit (rows after it may still
                    # fail the type filter: then the next page is empty)
                    more = i < len(rows) - 1 or len(rows) == n
                    return out, r["seq"] if more else None
        if len(rows) < n:
            return out, None
        pos = rows[-1]["seq"]
        if scanned >= SCAN_BUDGET:
            return out, pos


def export_units(store, tenant: str, p: SearchParams):
    """Every live unit that passes the filters, oldest seq first (parents before the children
    pushed after them), up to the newest seq when the export began; yields export_fields dicts."""
    t = store.tenant(tenant)
    max_seq = t.max_seq()
    pos = 0
    while True:
        now = int(time.time())
        rows = _catalog_page(t, p, pos, False, PAGE_ROWS, now, max_seq)
        if not rows:
            return
        for _, u in _units_of(t, p, rows, now):
            if u is not None:
                yield export_fields(u)
        pos = rows[-1]["seq"]


# --- stats ----------------------------------------------------------------------------------------
_stats_lock = threading.Lock()
_stats_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # store -> {(tenant, day): entry}


def _day_stats(store, t, day: str, now: int) -> list[dict] | None:
    """One day file's live units by type, from the cache while the file is unchanged."""
    db = t.shard(day, create=False)
    if db is None:
        return None
    with _stats_lock:
        cache = _stats_cache.setdefault(store, {})
    sig = tuple(db.read(lambda c: c.execute(sql("shard_signature")).fetchone()))
    key = (t.name, day)
    hit = cache.get(key)
    if hit is not None and hit[0] == sig and now < hit[1]:
        return hit[2]
    rows = [dict(r) for r in db.read(lambda c: c.execute(sql("shard_stats"), {"now": now}).fetchall())]
    valid_until = min((r["next_expiry"] for r in rows), default=2 ** 62)
    with _stats_lock:
        cache[key] = (sig, valid_until, rows)
    return rows


def _file_bytes(path) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.stat(f"{path}{suffix}").st_size
        except OSError:
            pass
    return total


def stats(store, tenant: str) -> dict:
    """Units and content bytes per type and per day, oldest and newest timestamp, what indexing and
    the read index still lack, and the day files on disk."""
    t = store.tenant(tenant)
    now = int(time.time())
    days = t.live_days()
    by_type: dict[str, dict] = {}
    by_day = []
    oldest = newest = None
    pending = 0
    for day in days:
        rows = _day_stats(store, t, day, now)
        if not rows:
            continue
        entry = {"day": day, "units": 0, "bytes": 0, "types": {}}
        for r in rows:
            entry["units"] += r["units"]
            entry["bytes"] += r["bytes"] or 0
            entry["types"][r["type"]] = r["units"]
            agg = by_type.setdefault(r["type"], {"units": 0, "bytes": 0})
            agg["units"] += r["units"]
            agg["bytes"] += r["bytes"] or 0
            oldest = r["oldest"] if oldest is None else min(oldest, r["oldest"])
            newest = r["newest"] if newest is None else max(newest, r["newest"])
        by_day.append(entry)
    for day in t.primary_days():
        db = t.shard(day, create=False)
        if db is not None:
            pending += db.read(fetch_one, "pending_count")[0]
    fresh = store.freshness(tenant)
    in_use, backlog, lag_ms = fresh["read_index"], fresh["index_pending"], fresh["replica_lag_ms"]
    files = t.primary_days()
    return {
        "units": sum(d["units"] for d in by_day), "bytes": sum(d["bytes"] for d in by_day),
        "types": dict(sorted(by_type.items())), "days": by_day,
        "oldest": oldest, "newest": newest,
        "index_pending": pending,
        "read_index": {"in_use": in_use, "pending": backlog if in_use else None},
        "replica_lag_ms": lag_ms,
        "day_files": {"count": len(files), "bytes": sum(_file_bytes(t.primary_path(d)) for d in files),
                      "first": files[0] if files else None, "last": files[-1] if files else None},
        "generated_at": now,
    }


# --- forget ---------------------------------------------------------------------------------------
def matches(store, tenant: str, p: SearchParams, *, cids: list[str] | None = None, max_seq: int | None = None) -> list[dict]:
    """Every live unit that passes the filters, the CIDs (when given) and, with ``p.query``, holds
    the query's terms (every term with operator "and", any with "or"); oldest seq first. Each is
    {day, id, cid, seq, type, source, timestamp}. A query with no searchable term matches nothing."""
    t = store.tenant(tenant)
    now = int(time.time())
    first = day_of(p.since) if p.since is not None else "0000-00-00"
    last = day_of(p.until) if p.until is not None else "9999-99-99"
    days = t.live_days(first, last)
    terms = store.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS] if p.query else None
    if terms is not None:
        if not terms:
            return []
        catch_up(t, days, store.tokenizer, store.config.index_batch, store.config.strong_wait_ms)
    found: list[dict] = []
    for day in days:
        db = t.shard(day, create=False)
        if db is None:
            continue
        args: dict = {"now": now}
        where = filters(p, args)
        if cids is not None:
            args["cids"] = json.dumps(cids)
            where.append("u.cid IN (SELECT value FROM json_each(:cids))")
        if max_seq is not None:
            args["max_seq"] = max_seq
            where.append("u.seq <= :max_seq")
        columns = "u.id, u.cid, u.seq, u.type, u.source, u.timestamp"
        if terms is None:
            query = f"SELECT {columns} FROM units u WHERE {' AND '.join(where)}"
        else:
            args["match"] = fts_query(list(dict.fromkeys(terms)), p.operator)
            query = (f"SELECT {columns} FROM units_fts JOIN units u ON u.id = units_fts.rowid "
                     f"WHERE units_fts MATCH :match AND {' AND '.join(where)}")
        found += [dict(r, day=day) for r in db.read(_all, query, args)]
    found.sort(key=lambda r: r["seq"])
    return found


def _remove_in_shard(conn, cids: list[str]) -> list[str]:
    """Delete these units (FTS rows, BM25 stats, read-index tombstones); the CIDs that were stored."""
    rows = conn.execute(sql("units_delete_fetch_cids"), {"cids": json.dumps(cids)}).fetchall()
    remove_rows(conn, rows)
    if rows:
        conn.execute(sql("meta_forgotten_add"), {"n": len(rows)})
    return [r["cid"] for r in rows]


def remove(store, tenant: str, by_day: dict[str, list[str]]) -> int:
    """Remove units (CIDs by day) everywhere: day file, FTS5, catalog (searches leave them out at
    once; the read index drops them at its next pass). Returns how many were stored."""
    t = store.tenant(tenant)
    removed: list[str] = []
    for day, cids in by_day.items():
        db = t.shard(day, create=False)
        for i in range(0, len(cids), FORGET_CHUNK):
            chunk = cids[i:i + FORGET_CHUNK]
            removed += db.write(_remove_in_shard, chunk) if db is not None else []
            t.catalog.write(fetch_all, "catalog_delete_many", {"cids": json.dumps(chunk)})
    if removed:
        # the one place a removal is told to open streams (DELETE and forget both come here)
        for observer in store.observers:
            observer(tenant, [{"status": "deleted", "cid": cid} for cid in removed])
    return len(removed)


# --- compaction (the janitor) ---------------------------------------------------------------------
def compact_due(db) -> bool:
    n, rows = db.read(lambda c: c.execute(sql("meta_forgotten_get")).fetchone())
    return n > 0 and n >= COMPACT_SHARE * (n + rows)


def compact(db) -> bool:
    """Give a day file's forgotten space back: merge FTS5's segments (dropping deleted entries),
    then VACUUM (row ids, which FTS5 and the read index use, are INTEGER PRIMARY KEYs and survive).
    False when another process kept the file busy: the next janitor run tries again."""
    db.write(lambda c: c.execute(sql("fts_optimize")))
    if not db.vacuum():
        return False
    db.write(lambda c: c.execute(sql("meta_forgotten_reset")))
    return True
