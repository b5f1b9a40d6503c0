"""What starts a process of the service, a gunicorn worker (service.create_app) or the maintainer
(service/maintainer.py): the open-files limit, malloc arenas, the frozen heap (logging: service/logs.py; the
store is opened by service/store/__init__.py's ``open_backend``), and the folder through which gunicorn's workers
sum their metrics."""
from __future__ import annotations

import gc
import os
import re
import shutil
import tempfile
import time

METRICS_PREFIX = "context-mode-metrics-"
_OWNED = re.compile(re.escape(METRICS_PREFIX) + r"(\d+)-")       # the folders this code makes: the master's pid
_PID_FILE = re.compile(r"_(\d+)\.db$")                           # prometheus_client's files: one per process
STALE_AFTER_S = 600


def make_metrics_dir() -> str:
    """A new folder for the workers' metrics (``PROMETHEUS_MULTIPROC_DIR``), named by this process (gunicorn's
    master), after removing the ones earlier starts left behind."""
    base = tempfile.gettempdir()
    remove_stale_metrics_dirs(base)
    return tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}-", dir=base)


def remove_stale_metrics_dirs(base: str, now: float | None = None) -> list[str]:
    """Remove the metrics folders under ``base`` whose server is gone: one named by a master that no longer
    runs (a start that was killed before its exit hook ran), or one from before folders were named (no pid)
    whose every process is gone and that nothing touched for 10 minutes. Only this user's folders."""
    now = time.time() if now is None else now
    removed = []
    for entry in os.scandir(base):
        if not entry.name.startswith(METRICS_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            owner = _OWNED.match(entry.name)
            if owner:
                stale = not running(int(owner.group(1)))
            else:
                pids = [int(m.group(1)) for name in os.listdir(entry.path) for m in [_PID_FILE.search(name)] if m]
                stale = (now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S
                         and not any(map(running, pids)))
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def running(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts: it cannot be signalled, but it runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
