"""The SQLite backend (the embedded default, ``CONTEXT_STORE=sqlite``; docs/design.md §5.1): per tenant a
catalog and one file per day under ``CONTEXT_DATA_DIR``, FTS5 as the index of record, a tantivy read index
for default searches.

Modules, in data-flow order, each role under the PostgreSQL backend's name for it (tests/test_code_shape.py):
connections.py (files, connections, the per-file writer), queries.py (the SQL by name), rows.py (row functions,
the day files' upgrades), store.py (push, reads, delete), threads.py (a new unit's thread; catalogs made before
threads), indexer.py (pending rows -> FTS5), janitor.py (expiry, day drops, compaction), maintenance.py (the
leader's loop), readsync.py (the read index's sync), search.py and tail.py (default searches, read-your-writes),
engine.py (what the ranking reads of the day files: the pool, a thread's places),
manage.py (list, stats, export, forget), live.py (feed, change log, stream slots), registry.py (the tool registry).
Its own: tenant.py (one tenant's files), groupcommit.py (one commit per group of pushes), fts.py (strong searches
over FTS5), backup.py (backup and restore of the files).
"""
from __future__ import annotations


def check(config) -> None:
    from .connections import check_fts5
    problem = check_fts5()
    if problem:
        raise RuntimeError(problem)


def doctor(config) -> list[tuple[bool, str]]:
    import sqlite3

    from .connections import check_fts5
    problem = check_fts5()
    return [(tuple(map(int, sqlite3.sqlite_version.split("."))) >= (3, 35), f"SQLite {sqlite3.sqlite_version}"),
            (problem is None, problem or "FTS5 and fts5vocab available"),
            (True, "storage: SQLite files in the data directory")]


def open_store(config):
    from .maintenance import Maintenance
    from .store import Store
    store = Store(config)
    return store, Maintenance(store)


def open_live(store):
    """The live hub's sources (the tenants' files, polled) and the tool registry."""
    from .live import Sources
    from .registry import Registry
    sources = Sources(store)
    return sources, Registry(store, sources.changes)
