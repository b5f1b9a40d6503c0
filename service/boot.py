"""What starts a process of the service, a gunicorn worker (service.create_app) or the maintainer
(service/maintainer.py): logging, the open-files limit, the storage check and opening the store."""
from __future__ import annotations

import logging
import os
import sys

from .config import Config


def check_store(config: Config) -> None:
    """Stop the start, with a message, on a storage setting that cannot work (before anything is opened)."""
    from .pg import is_postgresql
    from .shards import check_fts5
    postgresql = is_postgresql(config.store)
    if not postgresql and config.store != "sqlite":
        raise RuntimeError(f"CONTEXT_STORE must be 'sqlite' or a postgresql://... URL, not {config.store!r}.")
    if config.store_replica and not (postgresql and is_postgresql(config.store_replica)):
        raise RuntimeError("CONTEXT_STORE_REPLICA is a postgresql://... URL and needs CONTEXT_STORE=postgresql://...")
    problem = None if postgresql else check_fts5()
    if problem:
        raise RuntimeError(problem)


def open_store(config: Config):
    """The store and its background maintenance: SQLite files, or PostgreSQL (issue 18, service/pg/)."""
    from .pg import is_postgresql
    if is_postgresql(config.store):
        from .pg.maintenance import PgMaintenance
        from .pg.store import PgStore
        store = PgStore(config)
        return store, PgMaintenance(store)
    from .maintenance import Maintenance
    from .store import Store
    store = Store(config)
    return store, Maintenance(store)


def open_files_needed(config) -> int:
    """Descriptors one process may need: each open primary day keeps a writer and up to
    ``shard_readers`` readers (database and WAL each), plus replicas, catalogs and sockets."""
    return config.max_open_shards * (1 + config.shard_readers) * 2 * 2 + 256


def raise_open_files_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to the hard one (many systems start at 1,024)."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 65536
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(target, 65536), hard))
    except (ImportError, ValueError, OSError):
        pass


def setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def limit_malloc_arenas(n: int = 2) -> None:
    """At most ``n`` glibc malloc arenas in this process and the workers it forks (glibc's default is
    8 per core, and each of a worker's threads may grow its own: after a batch ingest a worker kept
    10-25 MiB more; bench/README.md, issue 17). Called before any thread starts; a MALLOC_ARENA_MAX
    in the environment wins; nothing on other C libraries."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(-8, n)          # M_ARENA_MAX
