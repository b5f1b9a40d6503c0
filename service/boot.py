"""What starts a process of the service, a gunicorn worker (service.create_app) or the maintainer
(service/maintainer.py): the open-files limit, malloc arenas, the frozen heap (logging: service/logs.py; the
store is opened by service/store/__init__.py's ``open_backend``)."""
from __future__ import annotations

import gc
import os


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


def freeze_heap() -> None:
    """Leave every object this process holds now out of the collector's later passes (``gc.freeze``):
    modules, the segmenter's dictionary, the app and its store, all of which live as long as the process.
    What start-up left as garbage is collected first, so none of it is kept for good.

    A full (generation 2) collection walks every tracked object with the GIL held, so all of a worker's
    threads stop for it: under search load a worker's walked ~83,000 start-up objects and took 179 ms at
    p50, up to 461 ms; with them frozen, 1.4 ms (bench/README.md "Full collections"). Called in gunicorn's
    master just before the workers fork, it also keeps their collectors from writing to the pages they
    inherit (copy-on-write), as the ``gc`` module's documentation advises."""
    gc.collect()
    gc.freeze()


def limit_malloc_arenas(n: int = 2) -> None:
    """At most ``n`` glibc malloc arenas in this process and the workers it forks (glibc's default is
    8 per core, and each of a worker's threads may grow its own: after a batch ingest a worker kept
    10-25 MiB more; bench/README.md). Called before any thread starts; a MALLOC_ARENA_MAX
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
