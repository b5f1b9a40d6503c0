"""Background maintenance in its own process, next to the gunicorn workers.

Indexing, the read-index writer and the janitor are CPU-bound Python. Run as a thread inside a
request worker, they hold that worker's GIL in 5 ms slices, and every request the worker serves
waits for those slices at each of its own I/O steps: at a fixed load of 250 pushes/s a push's ack
took tens of milliseconds on the worker that led the tenant, a few on the other (bench/README.md).
So under gunicorn the master forks one *maintainer*: a small supervisor (process name
``cms-supervisor``) that forks the maintenance (``cms-maintainer``) and forks it again if it dies.
Forked from the master like the workers, both share its loaded modules and the segmenter's
dictionary instead of loading them again (an exec'd interpreter cost ~0.7 s of CPU at every start).
The workers then keep their maintenance thread idle:

- ``maintainer.lock`` in the data folder (fcntl, held by the running maintainer, released by the
  kernel when it dies) says whether one runs. While it is held, a worker leads no tenant: it lets
  go of any tenant it led, and the maintainer takes each over within one poll interval (the
  tenants' own ``maintenance.lock`` files still decide who leads, so two never index one tenant).
- While it is not held (no maintainer yet, or it died and is restarting), the workers lead as they
  did before: a maintainer's death costs latency, never an unindexed unit.
- A push wakes the maintainer through a FIFO in the data folder, with the tenant and days it wrote
  (non-blocking lines), so a pass reads only those day files; every live day is still read once a
  second (``maintenance.FULL_SCAN_S``), and the maintainer also polls every ``index_poll_ms``.
- The maintainer writes ``maintainer.json`` (its pid and index lag percentiles) at most once a
  second, for ``/readyz``.

The supervisor and the maintainer end when their parent does (``PR_SET_PDEATHSIG`` where the
platform has it, and a parent check every poll), and on SIGTERM the maintainer finishes its pass.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

from .boot import freeze_heap, limit_malloc_arenas, raise_open_files_limit, running
from .config import Config
from .formats import DAY_RE, TENANT_RE
from .logs import setup_logging
from .store import check_backend, open_backend

log = logging.getLogger("service.maintainer")   # also when run as __main__

LOCK_NAME = "maintainer.lock"
WAKE_NAME = "maintainer.wake"
STATUS_NAME = "maintainer.json"
STATUS_EVERY_S = 1.0
PIPE_BUF = 4096                      # POSIX: writes up to this size reach a FIFO whole (Linux: 4096)
RESTART_BACKOFF_S = (0.5, 30.0)      # first and longest pause before starting a dead maintainer again


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` when this process's parent dies (Linux; elsewhere the poll checks)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)            # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Presence:
    """A worker's view of the maintainer: is one running, and waking it after a push."""

    def __init__(self, data_dir: str | os.PathLike):
        self.dir = Path(data_dir)
        self._lock_fd: int | None = None
        self._wake_fd: int | None = None
        self._mu = threading.Lock()

    def alive(self) -> bool:
        """True while a maintainer holds ``maintainer.lock`` (a shared lock taken and given back at once)."""
        with self._mu:
            if self._lock_fd is None:
                try:
                    self._lock_fd = os.open(self.dir / LOCK_NAME, os.O_RDONLY)
                except FileNotFoundError:
                    return False
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            return False

    def wake(self, tenant: str | None = None, days=()) -> None:
        """Tell the maintainer which days of a tenant have new rows: one line per day into its FIFO,
        never blocking. Nobody reading is fine; so is a full pipe (the maintainer is behind, and its
        scan of every live day each FULL_SCAN_S finds what a lost line named)."""
        msg = b"".join(f"{tenant}\t{day}\n".encode() for day in days) if tenant else b""
        with self._mu:
            if self._wake_fd is None:
                try:
                    self._wake_fd = os.open(self.dir / WAKE_NAME, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:          # ENXIO: no reader; ENOENT: no maintainer has run here
                    return
            try:
                for i in range(0, max(1, len(msg)), PIPE_BUF):    # each write whole, never interleaved
                    os.write(self._wake_fd, msg[i:i + PIPE_BUF] or b"\n")
            except BlockingIOError:
                pass
            except OSError:              # EPIPE: the reader is gone; open again next time
                os.close(self._wake_fd)
                self._wake_fd = None

    def status(self) -> dict | None:
        """What the running maintainer last wrote (None when none runs or it wrote nothing yet)."""
        if not self.alive():
            return None
        try:
            return json.loads((self.dir / STATUS_NAME).read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        with self._mu:
            for fd in (self._lock_fd, self._wake_fd):
                if fd is not None:
                    os.close(fd)
            self._lock_fd = self._wake_fd = None


SUPERVISOR_NAME = b"cms-supervisor"   # /proc/<pid>/comm, ps -o comm (forked: the command line is gunicorn's)
MAINTAINER_NAME = b"cms-maintainer"


def _set_name(name: bytes) -> None:
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)     # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _fork(target, *args) -> int:
    """Fork a child that runs ``target(*args)`` and exits with its result, never returning here (no
    atexit or cleanup of the parent's runs in the child). Returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = target(*args)
    except BaseException:          # noqa: BLE001 - whatever ends the child is logged, and it exits
        log.exception("%s failed", getattr(target, "__name__", target))
    finally:
        os._exit(code if isinstance(code, int) else 1)


def spawn(server) -> int:
    """Fork the supervisor from the gunicorn master (``when_ready``: the master has loaded the service's
    modules and the segmenter's dictionary, and runs no thread yet). The child shares those pages, as
    the workers do, instead of loading them again. Returns its pid."""
    master = os.getpid()

    def child() -> int:
        for sig in list(server.SIGNALS) + [signal.SIGCHLD]:       # the master's handlers are not ours
            signal.signal(sig, signal.SIG_DFL)
        for listener in list(server.LISTENERS):                  # nor its listening sockets
            listener.close()
        return supervise(master)
    return _fork(child)


def _alive(pid: int) -> bool:
    """True until ``pid`` has exited (reaped by us, or by gunicorn's master, which reaps every child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return running(pid)


def stop(pid: int | None, timeout: float = 15.0) -> None:
    """End the supervisor and its maintainer (SIGTERM: the maintainer finishes its pass)."""
    if pid is None or not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)


class _Stop:
    """Set by SIGTERM/SIGINT. A handler only assigns a flag: it runs between any two bytecodes of the
    main thread, and one that took a lock (``threading.Event.set``) deadlocked when a second signal
    came while the first handler held it (seen: a parent's death signal, then its SIGTERM)."""

    def __init__(self):
        self.flag = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame) -> None:
        self.flag = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less once stopped; True when stopped."""
        end = time.monotonic() + seconds
        while not self.flag and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return self.flag


_STOP: _Stop | None = None


def _stopper() -> _Stop:
    """This process's one stop flag. A maintainer forked by the supervisor keeps the supervisor's
    (handlers and all), so a SIGTERM that arrives before ``run`` has started is not lost."""
    global _STOP
    if _STOP is None:
        _STOP = _Stop()
    return _STOP


def supervise(parent: int) -> int:
    """Run the maintainer in a forked child, and again after it dies, until SIGTERM or the parent ends."""
    _set_name(SUPERVISOR_NAME)
    _die_with_parent()
    stopping = _stopper()
    pause = RESTART_BACKOFF_S[0]
    child = None
    while not stopping.flag and os.getppid() == parent:
        started = time.monotonic()
        child = _fork(run, os.getpid())
        while _alive(child) and not stopping.flag and os.getppid() == parent:
            stopping.wait(0.2)
        if stopping.flag or os.getppid() != parent:
            break
        if time.monotonic() - started > 60:
            pause = RESTART_BACKOFF_S[0]
        log.error("maintainer %d exited; the workers maintain meanwhile; starting it again in %.1f s", child, pause)
        stopping.wait(pause)
        pause = min(pause * 2, RESTART_BACKOFF_S[1])
    stop(child, timeout=30)                     # it finishes its pass; killed past 30 s
    return 0


def _wake_fifo(path: Path) -> int:
    """The FIFO pushes write to: made once, opened read-write (so no writer leaving closes it)."""
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            os.unlink(path)
            os.mkfifo(path, 0o600)
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


def run(parent: int) -> int:
    """The maintainer itself: hold the lock, maintain every tenant, until SIGTERM or the parent ends.
    Forked by the supervisor, or run as ``python -m service.maintainer run`` (by hand: its parent
    is then the shell)."""
    _set_name(MAINTAINER_NAME)
    _die_with_parent()
    limit_malloc_arenas()
    setup_logging()
    config = Config.from_env()
    os.umask(0o077)
    raise_open_files_limit()
    check_backend(config)
    data = config.data_path
    data.mkdir(parents=True, exist_ok=True)
    stopping = _stopper()

    lock_fd = os.open(data / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    while True:                          # a worker's check holds a shared lock for a moment
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if stopping.wait(0.05) or os.getppid() != parent:
                return 0
    backend = open_backend(config)
    store, maintenance = backend.store, backend.maintenance
    maintenance.start()
    freeze_heap()                        # its store and maintenance live until it ends (service/boot.py)
    wake_fd = _wake_fifo(data / WAKE_NAME)
    log.info("maintainer %d maintains %s", os.getpid(), data)
    last_status = 0.0
    try:
        import select
        poll_s = config.index_poll_ms / 1000
        rest = b""
        while not stopping.flag and os.getppid() == parent:
            ready, _, _ = select.select([wake_fd], [], [], poll_s)
            if ready:
                rest = _wake_lines(wake_fd, rest, maintenance)
            if time.monotonic() - last_status >= STATUS_EVERY_S:
                last_status = time.monotonic()
                _write_status(data, {"pid": os.getpid(), "index_lag_ms": maintenance.lag_percentiles()})
    finally:
        maintenance.stop()
        store.close()
        os.close(wake_fd)
        os.close(lock_fd)
    return 0


def _wake_lines(fd: int, rest: bytes, maintenance) -> bytes:
    """Read what the FIFO holds, tell the maintenance which tenant days have new rows, wake it.
    Returns an unfinished last line. Lines that are not a tenant and a day are ignored."""
    chunks = [rest]
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except BlockingIOError:
        pass
    data = b"".join(chunks)
    lines = data.split(b"\n")
    by_tenant: dict[str, set[str]] = {}
    for line in lines[:-1]:
        tenant, _, day = line.decode("ascii", "replace").partition("\t")
        if TENANT_RE.match(tenant) and DAY_RE.fullmatch(day):
            by_tenant.setdefault(tenant, set()).add(day)
    for tenant, days in by_tenant.items():
        maintenance.mark(tenant, days)
    maintenance.notify(None, ())
    return lines[-1][-4096:]


def _write_status(data: Path, status: dict) -> None:
    tmp = data / (STATUS_NAME + ".tmp")
    try:
        tmp.write_text(json.dumps(status))
        os.replace(tmp, data / STATUS_NAME)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            log.warning("maintainer status not written: %s", e)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parent = int(argv[argv.index("--parent") + 1]) if "--parent" in argv else os.getppid()
    if argv and argv[0] == "run":
        return run(parent)
    setup_logging()
    return supervise(parent)


if __name__ == "__main__":
    sys.exit(main())
