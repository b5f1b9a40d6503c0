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


def bounded(lock_ms: int, statement_ms: int):
    """A pool's ``configure``: every connection waits at most ``lock_ms`` for a lock and runs a statement at most
    ``statement_ms`` (0: no bound), then LockNotAvailable / QueryCanceled, a 503 for the request alone
    (issue 50, M2: writes and unit reads waited for a LOCK TABLE on units, catalog or tools as long as it was
    held, each holding its thread: 24 pushes held every thread and /healthz took 28.7 s). A transaction that
    must wait longer (the schema's upgrade at start, the janitor's drop) sets its own with SET LOCAL."""
    def configure(conn) -> None:
        conn.execute(f"SET lock_timeout = {int(lock_ms)}")
        conn.execute(f"SET statement_timeout = {int(statement_ms)}")
    return configure


def schema() -> str:
    return sql_file("postgresql/schema.sql")

