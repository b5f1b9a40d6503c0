"""The PostgreSQL backend's SQL, by name (sql/postgresql/queries.sql) and its schema script."""
from __future__ import annotations

from psycopg import sql as pgsql

from ..statements import named, sql_file


def sql(name: str) -> str:
    """A named statement from sql/postgresql/queries.sql."""
    return named("postgresql/queries.sql", "postgresql")[name]


def template(name: str, **parts) -> pgsql.Composed:
    """A named statement with ``{field}`` identifiers or literals filled in by psycopg (quoted)."""
    return pgsql.SQL(sql(name)).format(**parts)


def lock_wait(conn, ms: float) -> None:
    """For the rest of this transaction, wait at most ``ms`` (at least 1) for any lock, then LockNotAvailable
    (a 503 for the request: ``connections.connection_lost`` tells it from an outage)."""
    conn.execute(sql("lock_timeout"), {"ms": str(max(1, int(ms)))})


def schema() -> str:
    return sql_file("postgresql/schema.sql")

