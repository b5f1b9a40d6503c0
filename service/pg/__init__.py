"""The PostgreSQL backend (issue 18): ``CONTEXT_STORE=postgresql://...``.

Same store API, contracts and ranking as the SQLite backend (service/store.py); one PostgreSQL
primary holds every tenant (day partitions, the index queue, BM25 statistics), a streaming hot
standby (``CONTEXT_STORE_REPLICA``) serves default searches. Any number of service processes on
any number of machines share one primary with no other coordination: pushes serialize per tenant
on a row lock, indexers claim queue rows with ``FOR UPDATE SKIP LOCKED``, the janitor runs under an
advisory lock (docs/postgresql.md).

Modules, in data-flow order: store.py (connections, push, reads, delete), maintenance.py (indexer,
janitor), standby.py (the read replica), search.py (BM25), manage.py (list, stats, export, forget).
"""
from __future__ import annotations

import re
from functools import lru_cache

from psycopg import sql as pgsql

from ..shards import SQL_DIR

PG_SQL_DIR = SQL_DIR / "postgresql"
_NAME_RE = re.compile(r"^--\s*name:\s*(\S+)\s*$", re.M)


def is_postgresql(url: str | None) -> bool:
    return bool(url) and url.split("://", 1)[0] in ("postgresql", "postgres")


@lru_cache(maxsize=None)
def _named() -> dict[str, str]:
    text = (PG_SQL_DIR / "queries.sql").read_text(encoding="utf-8")
    parts = _NAME_RE.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def sql(name: str) -> str:
    """A named statement from sql/postgresql/queries.sql."""
    return _named()[name]


def template(name: str, **parts) -> pgsql.Composed:
    """A named statement with ``{field}`` identifiers or literals filled in by psycopg (quoted)."""
    return pgsql.SQL(sql(name)).format(**parts)


@lru_cache(maxsize=None)
def schema() -> str:
    return (PG_SQL_DIR / "schema.sql").read_text(encoding="utf-8")


def redact(url: str) -> str:
    """A connection URL for logs and messages: never its password."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
