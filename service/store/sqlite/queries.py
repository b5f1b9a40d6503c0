"""The SQLite backend's SQL, by name (sql/sqlite/queries.sql and every sql/sqlite/*_queries.sql), and its schema scripts
(sql/sqlite/*_schema.sql, *_migrate_v*.sql)."""
from __future__ import annotations

import sqlite3

from ..statements import named, sql_file


def sql(name: str) -> str:
    """A named statement from sql/sqlite/queries.sql (or another sql/sqlite/*_queries.sql, e.g. live_queries.sql)."""
    return named("sqlite/*queries.sql")[name]


def fetch_all(conn: sqlite3.Connection, name: str, params: dict | None = None) -> list:
    """The rows of a named statement: ``db.read(fetch_all, "catalog_recent", {...})``."""
    return conn.execute(sql(name), params or {}).fetchall()


def fetch_one(conn: sqlite3.Connection, name: str, params: dict | None = None):
    """The first row of a named statement (None when there is none)."""
    return conn.execute(sql(name), params or {}).fetchone()


def schema(filename: str) -> str:
    """A schema or migration script of sql/sqlite/ by its file name."""
    return sql_file(f"sqlite/{filename}")
