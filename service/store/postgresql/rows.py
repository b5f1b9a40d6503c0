"""Row functions of the PostgreSQL backend, shared by the store, the indexer, the janitor
and forget: day partitions' names, advisory lock keys, BM25 statistics kept exact when units go.
Like service/store/sqlite/rows.py they take a connection first and run inside the caller's transaction."""
from __future__ import annotations

import datetime
import json
from collections import Counter, defaultdict

from psycopg.rows import dict_row

from ...live import UNIT_PREFIX
from ...unitkeys import derive_text
from .live import record_changes
from .queries import sql

# PostgreSQL's text cannot hold U+0000, which a unit's content may (docs/design.md §3: any string).
# Content is stored escaped: U+FFFF (a noncharacter) doubles, U+0000 becomes U+FFFF "0"; content
# holding neither (nearly all) is stored as it is. Every row read through the pools (``content_rows``)
# comes back unescaped, so only the insert escapes and nothing else sees the difference.
ESCAPE = "\uffff"


def escape_content(text: str) -> str:
    if "\0" not in text and ESCAPE not in text:
        return text
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace("\0", ESCAPE + "0")


def unescape_content(text: str) -> str:
    if ESCAPE not in text:
        return text
    out, i = [], 0
    while (j := text.find(ESCAPE, i)) >= 0:
        out.append(text[i:j])
        out.append(ESCAPE if text[j + 1:j + 2] == ESCAPE else "\0")
        i = j + 2
    out.append(text[i:])
    return "".join(out)


def content_rows(cursor):
    """psycopg row factory: dict rows (as ``dict_row``) whose ``content`` column is unescaped."""
    make = dict_row(cursor)
    names = [c.name for c in cursor.description or ()]
    if "content" not in names:
        return make
    at = names.index("content")

    def row(values):
        text = values[at]
        if text is not None and ESCAPE in text:
            values = list(values)
            values[at] = unescape_content(text)
        return make(values)
    return row


SCHEMA_VERSION = 5            # sql/postgresql/schema.sql's last upgrade step
THREADS_VERSION = 5           # the first with threads (an older database gets them at its upgrade)
SCHEMA_LOCK = 0x636d_7331      # advisory lock keys: schema set-up, partition create/drop
PARTITION_LOCK = 0x636d_7332
JANITOR_LOCKS = 1 << 32        # + crc32(tenant): the advisory lock of one tenant's janitor


def partition_name(day: str) -> str:
    """units_pYYYYMMDD: from a validated day (digits and dashes only)."""
    return "units_p" + day.replace("-", "")


def partition_day(name: str) -> str:
    return f"{name[7:11]}-{name[11:13]}-{name[13:15]}"


def next_day(day: str) -> str:
    return (datetime.date.fromisoformat(day) + datetime.timedelta(days=1)).isoformat()


def units_at(conn, tenant: str, located: list[tuple[str, str]]) -> dict:
    """Stored units by CID, of these (cid, day) pairs (only their days' partitions are read)."""
    if not located:
        return {}
    args = {"tenant": tenant, "days": sorted({day for _, day in located}), "cids": [cid for cid, _ in located]}
    return {r["cid"]: r for r in conn.execute(sql("units_by_day_cids"), args)}


def remove_units(conn, tenant: str, cids: list[str], now: int) -> list[str]:
    """Delete these live units (catalog, queue, search and unit rows, their share of the statistics); the
    CIDs that were stored. Default searches on the standby wait for this change (``tenant_bump``)."""
    conn.execute(sql("tenant_hold"), {"tenant": tenant})    # (the lock order pushes use: tenant, then catalog)
    gone = conn.execute(sql("catalog_delete_many"), {"tenant": tenant, "cids": cids, "now": now}).fetchall()
    if not gone:
        return []
    cids = [r["cid"] for r in gone]
    conn.execute(sql("pending_delete_many"), {"tenant": tenant, "cids": cids})
    unstat(conn, tenant, conn.execute(sql("unit_terms_delete_many"), {"tenant": tenant, "cids": cids}).fetchall())
    rows = conn.execute(sql("units_delete_many"), {"tenant": tenant, "days": sorted({r["day"] for r in gone}),
                                                   "cids": cids}).fetchall()
    conn.execute(sql("tenant_bump"), {"tenant": tenant})
    removed = [r["cid"] for r in rows]
    # listeners hear it: the change-log rows commit with the removal (service/store/postgresql/live.py)
    record_changes(conn, tenant, [(UNIT_PREFIX + cid, "deleted") for cid in removed])
    return removed


def unstat(conn, tenant: str, rows) -> None:
    """Take deleted units' tokens out of the BM25 statistics (rows: day, ntok, tfs)."""
    docs: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    dfs: Counter = Counter()
    for r in rows:
        if r["ntok"]:
            docs[r["day"]][0] -= 1
            docs[r["day"]][1] -= r["ntok"]
            dfs.update({term: -1 for term in r["tfs"]})
    for day in sorted(docs):
        conn.execute(sql("stats_add"), {"tenant": tenant, "day": day, "ndocs": docs[day][0], "ntokens": docs[day][1]})
    if dfs:
        add_df(conn, tenant, dfs)
        conn.execute(sql("df_cleanup"), {"tenant": tenant, "dfs": dumps(dfs)})


def add_df(conn, tenant: str, counts: Counter) -> None:
    """Add these changes (term -> change) to the tenant's document frequencies: one JSON parameter (a
    text[] and a bigint[] of a batch's ~4,000 terms cost ~100 us of Python per unit indexed)."""
    if counts:
        conn.execute(sql("df_add"), {"tenant": tenant, "dfs": dumps(counts)})


def dumps(value) -> str:
    """JSON for a ::jsonb parameter (encoded in C, UTF-8 as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def backfill_keys(conn) -> int:
    """Schema version 4: the keys search filters on (service/unitkeys.py) for the units stored before it, in
    every table that holds them, derived by the push's own rule (inside the schema upgrade's transaction)."""
    rows = [{"tenant": r["tenant"], "day": r["day"], "cid": r["cid"], **derive_text(r["metadata"])}
            for r in conn.execute(sql("keys_backfill_rows")).fetchall()]
    rows = [r for r in rows if r["project"] is not None or r["is_global"]]
    with conn.cursor() as cur:
        for name in ("keys_backfill_units", "keys_backfill_pending", "keys_backfill_terms"):
            cur.executemany(sql(name), rows)
    return len(rows)
