"""Row functions of a day shard (docs/design.md §5): the public shape of a stored unit, and removing
rows with their FTS entries. Like every store function they take a connection first and run inside
the caller's transaction (``db.write(remove_rows, rows)``); the store, the janitor, search and
backup share them from here."""
from __future__ import annotations

import logging
import sqlite3

from ...unitkeys import derive_text
from ...units import now_ms
from .shards import schema, sql

log = logging.getLogger(__name__)


def run_script(conn: sqlite3.Connection, filename: str) -> None:
    """The statements of a migration script in sql/, one by one, in the caller's transaction."""
    for statement in schema(filename).split(";\n"):
        if statement.strip():
            conn.execute(statement)


def migrate_shard(conn: sqlite3.Connection, threads=None) -> None:
    """Bring a shard written by an older version to the current schema (inside the write lock).
    ``threads()``: the (cid, thread, tpos) rows of this day in the (migrated) catalog."""
    version = conn.execute(sql("schema_version")).fetchone()[0]
    if version == 1:
        log.info("migrating shard to schema 2 (tokens in units, external-content FTS5)")
        run_script(conn, "shard_migrate_v2.sql")
    if version <= 2:
        log.info("migrating shard to schema 3 (keys derived from metadata: project, is_global; threads)")
        run_script(conn, "shard_migrate_v3.sql")
        # keys derived by the push's own rule; threads as the (migrated) catalog has them
        conn.executemany(sql("migrate_v3_set"), [{"id": r["id"], **derive_text(r["metadata"])}
                                                 for r in conn.execute(sql("migrate_v3_rows")).fetchall()])
        conn.executemany(sql("unit_set_thread"), [dict(r) for r in (threads() if threads else [])])


def remove_rows(conn: sqlite3.Connection, rows) -> int:
    """Delete unit rows (id, indexed, ntok, tokens) with their FTS entries, keeping the BM25 stats exact;
    each leaves a tombstone for the read index."""
    ndocs = ntokens = 0
    for row in rows:
        conn.execute(sql("unit_read_delete"), {"id": row["id"], "indexed": row["indexed"]})
        if row["indexed"] and row["ntok"]:
            conn.execute(sql("fts_delete"), {"id": row["id"], "tokens": row["tokens"]})
            ndocs += 1
            ntokens += row["ntok"]
        conn.execute(sql("unit_delete"), {"id": row["id"]})
    if rows:
        conn.execute(sql("meta_add"), {"key": "ndocs", "delta": -ndocs})
        conn.execute(sql("meta_add"), {"key": "ntokens", "delta": -ntokens})
        conn.execute(sql("meta_touch"), {"now_ms": now_ms()})
    return len(rows)


def delete_rows(conn: sqlite3.Connection, cids: list[str]) -> int:
    """Delete units by CID with their FTS rows."""
    rows = [r for r in (conn.execute(sql("unit_delete_fetch"), {"cid": cid}).fetchone() for cid in cids)
            if r is not None]
    return remove_rows(conn, rows)
