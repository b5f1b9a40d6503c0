"""The PostgreSQL backend (``CONTEXT_STORE=postgresql://...``; docs/design.md §5.2).

Same store API, contracts and ranking as the SQLite backend (service/store/sqlite/store.py); one PostgreSQL
primary holds every tenant (day partitions, the index queue, BM25 statistics), a streaming hot
standby (``CONTEXT_STORE_REPLICA``) serves default searches. Any number of service processes on
any number of machines share one primary with no other coordination: pushes serialize per tenant
on a row lock, indexers claim queue rows with ``FOR UPDATE SKIP LOCKED``, the janitor runs under an
advisory lock (docs/postgresql.md).

Modules, in data-flow order, each role under the SQLite backend's name for it (tests/test_code_shape.py):
connections.py (the pools and failover), queries.py (the SQL by name), rows.py (row functions, partitions, lock
keys), store.py (push, reads, delete), threads.py (a new unit's thread; databases made before threads),
indexer.py (the queue -> unit_terms, on any node), janitor.py (expiry, day partitions), maintenance.py (the loop),
readsync.py (this node's read index), search.py and tail.py (BM25 over the tables and over the node's index,
read-your-writes), scoring.py (the search's SQL, as SQLite's fts module), engine.py (what the ranking reads of the tables: the pool, a thread's places), manage.py (list, stats, export, forget), live.py (feed, change log, stream slots, NOTIFY),
registry.py (the tool registry). Its own: standby.py (the streaming standby).
"""
from __future__ import annotations


def check(config) -> None:
    """Nothing to check before opening: the store's first connection says clearly what is wrong."""


def doctor(config) -> list[tuple[bool, str]]:
    """Whether the configured servers answer (their passwords never shown)."""
    from ...config import redact
    lines = []
    for name, url in (("CONTEXT_STORE", config.store), ("CONTEXT_STORE_REPLICA", config.store_replica)):
        if url:
            problem = reachable_problem(url)
            lines.append((problem is None, problem or f"{name} {redact(url)} answers"))
    return lines


def reachable_problem(url: str) -> str | None:
    """Why the PostgreSQL server at ``url`` does not answer, or None (no password shown)."""
    import psycopg

    from ...config import redact
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as e:
        return f"PostgreSQL at {redact(url)} does not answer: {' '.join(redact(str(e)).split())}"
    return None


def open_store(config):
    from .maintenance import Maintenance
    from .store import Store
    store = Store(config)
    return store, Maintenance(store)


def open_live(store):
    """The live hub's sources (tables every node shares, woken by NOTIFY) and the tool registry."""
    from .live import Sources
    from .registry import Registry
    sources = Sources(store)
    return sources, Registry(store, sources.changes)
