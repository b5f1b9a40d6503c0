"""Seeing and managing the memory on PostgreSQL (list, stats, export and forget):
the same answers as service/store/sqlite/manage.py. Filters are the search filters (service/store/filters.py, as bound
parameters), so listing, exporting and forgetting select units exactly as search does.

- Listing and export walk the catalog by ``seq`` (its (tenant, seq) index) and join the units.
- Stats group the tenant's live units by day and type in one statement.
- Forget matches with the GIN index (after indexing what is queued, bounded) and removes in chunks
  (``rows.remove_units``): catalog, units, queue and statistics in one transaction per chunk.
"""
from __future__ import annotations

import time

from ...ranking.results import MAX_QUERY_TERMS
from ...units import day_of, export_fields, unit_dict
from ..base import FORGET_CHUNK, PAGE_BYTES, PAGE_ROWS
from ..statements import expand
from .indexer import catch_up
from .queries import sql
from .rows import remove_units
from ..filters import pg_filters
from .scoring import match_where

UNIT_COLUMNS = expand("@unit_columns(u), u.day::text AS day", "postgresql")     # (service/units.py's)


def _page(store, tenant: str, p, pos: int, descending: bool, n: int, max_seq: int | None = None) -> tuple[list, bool]:
    """Live units past ``pos`` in seq order that pass every filter: at most ``n``, and only while their
    contents so far hold less than PAGE_BYTES (at least one; octet_length reads the stored size, not the
    text); and whether the byte bound cut the page short."""
    args: dict = {"tenant": tenant, "now": int(time.time()), "pos": pos, "n": n, "bytes": PAGE_BYTES}
    where = ["c.tenant = %(tenant)s", "c.expires_at > %(now)s",
             "c.seq < %(pos)s" if descending else "c.seq > %(pos)s"] + pg_filters(p, args)
    if max_seq is not None:
        args["max_seq"] = max_seq
        where.append("c.seq <= %(max_seq)s")
    order = f"c.seq {'DESC' if descending else 'ASC'}"
    within = f"seq {'DESC' if descending else 'ASC'}"
    query = (f"SELECT * FROM (SELECT page.*, count(*) OVER () AS page_rows, "
             f"sum(size) OVER (ORDER BY {within}) - size AS bytes_before FROM ("
             f"SELECT {UNIT_COLUMNS}, octet_length(u.content) AS size "
             f"FROM catalog c JOIN units u ON u.tenant = c.tenant AND u.day = c.day AND u.cid = c.cid "
             f"WHERE {' AND '.join(where)} ORDER BY {order} LIMIT %(n)s) AS page) AS sized "
             f"WHERE bytes_before < %(bytes)s ORDER BY {within}")
    rows = store.db.read(lambda conn: conn.execute(query, args).fetchall())
    return rows, bool(rows) and len(rows) < rows[0]["page_rows"]


def list_units(store, tenant: str, p, limit: int, before: int | None = None) -> tuple[list[dict], int | None]:
    """Live units newest (highest seq) first, below ``before``; and where the next page starts (None:
    nothing older). One statement per page: the filters run in PostgreSQL. A page ends once its contents
    pass PAGE_BYTES (large units: a shorter page, never a worker's memory)."""
    rows, cut = _page(store, tenant, p, before if before is not None else 2 ** 62, True, limit + 1)
    units = [unit_dict(r) for r in rows[:limit]]
    return units, units[-1]["seq"] if len(rows) > limit or cut else None


def export_units(store, tenant: str, p):
    """Every live unit that passes the filters, oldest seq first, up to the newest seq when the export
    began; yields export_fields dicts (a page of PAGE_ROWS per transaction)."""
    max_seq = store.max_seq(tenant)
    pos = 0
    while True:
        rows, cut = _page(store, tenant, p, pos, False, PAGE_ROWS, max_seq)
        for r in rows:
            yield export_fields(unit_dict(r))
        if len(rows) < PAGE_ROWS and not cut:
            return
        pos = rows[-1]["seq"]


def stats(store, tenant: str) -> dict:
    """Units and content bytes per type and per day, oldest and newest timestamp, the index queue, the
    standby's lag, and the tenant's days (partitions) with the bytes its rows take in them."""
    now = int(time.time())

    def read(conn):
        args = {"tenant": tenant, "now": now}
        return (conn.execute(sql("stats_by_day_type"), args).fetchall(),
                conn.execute(sql("days_summary"), args).fetchone())
    rows, days = store.db.read(read)
    by_type: dict[str, dict] = {}
    by_day: dict[str, dict] = {}
    for r in rows:
        entry = by_day.setdefault(r["day"], {"day": r["day"], "units": 0, "bytes": 0, "types": {}})
        entry["units"] += r["units"]
        entry["bytes"] += r["bytes"]
        entry["types"][r["type"]] = r["units"]
        agg = by_type.setdefault(r["type"], {"units": 0, "bytes": 0})
        agg["units"] += r["units"]
        agg["bytes"] += r["bytes"]
    fresh = store.freshness(tenant)
    return {
        "units": sum(d["units"] for d in by_day.values()), "bytes": sum(d["bytes"] for d in by_day.values()),
        "types": dict(sorted(by_type.items())), "days": [by_day[d] for d in sorted(by_day)],
        "oldest": min((r["oldest"] for r in rows), default=None),
        "newest": max((r["newest"] for r in rows), default=None),
        "index_pending": fresh["index_pending"],
        "read_index": {"in_use": False, "pending": None},
        "replica_lag_ms": fresh["replica_lag_ms"],
        "day_files": {"count": days["n"], "bytes": sum(r["stored"] for r in rows),
                      "first": days["first"], "last": days["last"]},
        "generated_at": now,
    }


def matches(store, tenant: str, p, *, cids: list[str] | None = None, max_seq: int | None = None) -> list[dict]:
    """Every live unit that passes the filters, the CIDs (when given) and, with ``p.query``, holds the
    query's terms (every term with operator "and", any with "or"); oldest seq first. Each is
    {day, cid, seq, type, source, timestamp}. A query with no searchable term matches nothing."""
    args: dict = {"tenant": tenant, "now": int(time.time()),
                  "first": day_of(p.since) if p.since is not None else "0001-01-01",
                  "last": day_of(p.until) if p.until is not None else "9999-12-31"}
    terms = store.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS] if p.query else None
    if terms is not None:
        if not terms:
            return []
        catch_up(store, tenant, store.config.strong_wait_ms)
        where = match_where(p, terms, args)
    else:
        where = ["u.tenant = %(tenant)s", "u.day BETWEEN %(first)s AND %(last)s"] + pg_filters(p, args)
    if cids is not None:
        args["cids"] = cids
        where.append("u.cid = ANY(%(cids)s)")
    if max_seq is not None:
        args["max_seq"] = max_seq
        where.append("u.seq <= %(max_seq)s")
    table = "units" if terms is None else "unit_terms"       # (with a query: the search rows, their GIN index)
    query = (f"SELECT u.day::text AS day, u.cid, u.seq, u.type, u.source, u.timestamp FROM {table} u "
             f"WHERE {' AND '.join(where)} ORDER BY u.seq")
    return [dict(r) for r in store.db.read(lambda conn: conn.execute(query, args).fetchall())]


def remove(store, tenant: str, by_day: dict[str, list[str]]) -> int:
    """Remove units (CIDs by day; the catalog's days are used) everywhere (default searches leave them
    out at once, the standby's too), in chunks so a push to the tenant waits at most one chunk; how many
    were stored."""
    cids = [cid for chunk in by_day.values() for cid in chunk]
    removed = 0
    for i in range(0, len(cids), FORGET_CHUNK):
        chunk = cids[i:i + FORGET_CHUNK]
        gone = store.db.write(remove_units, tenant, chunk, int(time.time()))
        removed += len(gone)
        if gone:
            for observer in store.observers:     # committed (and in the change log): wake the listeners
                observer(tenant, [{"status": "deleted", "cid": cid} for cid in gone])
    return removed
