"""The SQLite backend's SQL, by name (sql/queries.sql and every sql/*_queries.sql), and its schema scripts."""
from __future__ import annotations

import sqlite3

from ..statements import named, sql_file


def sql(name: str) -> str:
    """A named statement from sql/queries.sql (or another sql/*_queries.sql, e.g. live_queries.sql)."""
    return named("*queries.sql")[name]


def fetch_all(conn: sqlite3.Connection, name: str, params: dict | None = None) -> list:
    """The rows of a named statement: ``db.read(fetch_all, "catalog_recent", {...})``."""
    return conn.execute(sql(name), params or {}).fetchall()


def fetch_one(conn: sqlite3.Connection, name: str, params: dict | None = None):
    """The first row of a named statement (None when there is none)."""
    return conn.execute(sql(name), params or {}).fetchone()


def schema(filename: str) -> str:
    return sql_file(filename)
