"""A throwaway PostgreSQL 15 primary and streaming hot standby on loopback (issue 18).

The test fixtures start their cluster with this (tests/conftest.py, ``pg_cluster``), and it runs
alone: ``python tools/pg_cluster.py`` starts both from Debian's binaries (``.ci/setup.d/postgresql.sh``
installs them), prints ``CONTEXT_STORE=...`` and ``CONTEXT_STORE_REPLICA=...`` and waits; Ctrl-C, SIGTERM or
SIGHUP stops both servers and removes their folder.
The standby is made with ``pg_basebackup -R`` and streams from the primary. PostgreSQL refuses to run
as root: as root the servers run as the ``postgres`` user (the package creates it), otherwise as the
current user. Both listen on 127.0.0.1 only and trust local connections: for tests and trials only.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


def pg_bin() -> Path | None:
    """The directory of initdb/pg_ctl/pg_basebackup (Debian keeps them out of PATH), or None."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(d, "initdb").exists() and Path(d, "pg_basebackup").exists():
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Primary on one port, standby (pg_basebackup -R) on another; both trust local connections."""

    def __init__(self, base: Path | None = None, *, fsync: bool = True, shared_buffers: str = "32MB",
                 synchronous: bool = False):
        self.bin = pg_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install -y postgresql)")
        self.base = Path(base or tempfile.mkdtemp(prefix="cms-pg-"))
        self.base.mkdir(parents=True, exist_ok=True)
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no 'postgres' user to run PostgreSQL") from None
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        self.sockets = self.base / "sockets"
        self.primary_dir = self.base / "primary"
        self.standby_dir = self.base / "standby"
        self.primary_port = _free_port()
        self.standby_port = _free_port()
        self.started: list[Path] = []
        # fsync off (the test suite's cluster): commits still reach the kernel before the ack
        # (synchronous_commit stays on), so a killed or immediately stopped server loses nothing acked;
        # only a power cut would, and tests cut no power. DDL-heavy fixtures run ~3x faster.
        self.extra = ("" if fsync else " -c fsync=off") + f" -c shared_buffers={shared_buffers}"
        # synchronous replication (docs/postgresql.md, "Failover"): a commit is acked once the standby has
        # it too, so promoting the standby loses nothing acked
        self.synchronous = synchronous

    def _run(self, *args: str, timeout: float = 120) -> str:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.base)
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
        return out.stdout

    def url(self, port: int, dbname: str = "postgres", options: str | None = None) -> str:
        url = f"postgresql://postgres@127.0.0.1:{port}/{dbname}"
        return url + (f"?options={options}" if options else "")

    @property
    def primary_url(self) -> str:
        return self.url(self.primary_port)

    @property
    def standby_url(self) -> str:
        return self.url(self.standby_port)

    def _start(self, data: Path, port: int) -> None:
        opts = (f"-p {port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                "-c max_wal_senders=5 -c wal_keep_size=256MB -c hot_standby=on" + self.extra)
        self.started.append(data)      # first: a signal during pg_ctl's wait must still stop what it started
        try:
            self._run("pg_ctl", "-D", str(data), "-o", opts, "-l", str(data.parent / f"{data.name}.log"), "-w",
                      "-t", "60", "start")
        except RuntimeError:
            self.started.remove(data)   # pg_ctl says it did not start
            raise

    def start(self) -> "Cluster":
        self._run_as_owner(lambda: self.sockets.mkdir(exist_ok=True))
        self._run("initdb", "-D", str(self.primary_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--locale=C.UTF-8")
        self._start(self.primary_dir, self.primary_port)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
                  "-D", str(self.standby_dir), "-R", "-X", "stream", "-c", "fast")
        self._start(self.standby_dir, self.standby_port)
        if self.synchronous:
            import psycopg
            with psycopg.connect(self.primary_url, autocommit=True) as c:
                c.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                c.execute("SELECT pg_reload_conf()")
        return self

    def hosts_url(self, target: str, dbname: str = "postgres") -> str:
        """Both servers in one libpq host list: ``target_session_attrs=read-write`` reaches whichever is the
        primary (after a promotion, the old standby), ``prefer-standby`` a standby while there is one."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}/{dbname}"
                f"?target_session_attrs={target}&connect_timeout=2")

    def promote_standby(self) -> None:
        """Make the standby the primary (after the primary died)."""
        self._run("pg_ctl", "-D", str(self.standby_dir), "-w", "promote")

    def _run_as_owner(self, fn) -> None:
        fn()
        if self.user is not None:
            os.chown(self.sockets, self.user.pw_uid, self.user.pw_gid)

    def stop_standby(self) -> None:
        self._stop(self.standby_dir)

    def start_standby(self) -> None:
        self._start(self.standby_dir, self.standby_port)

    def stop_primary(self, mode: str = "immediate") -> None:
        """Stop the primary; ``immediate`` is a crash (no checkpoint: recovery replays the WAL at start)."""
        self._stop(self.primary_dir, mode)

    def start_primary(self) -> None:
        self._start(self.primary_dir, self.primary_port)

    def _stop(self, data: Path, mode: str = "fast") -> None:
        if data in self.started:
            self._run("pg_ctl", "-D", str(data), "-m", mode, "-w", "stop")
            self.started.remove(data)

    def pause_replay(self, paused: bool) -> None:
        """Hold (or resume) the standby's WAL replay: its lag then grows with the primary's writes."""
        import psycopg
        with psycopg.connect(self.standby_url, autocommit=True) as c:
            c.execute("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")

    def stop(self) -> None:
        for data in list(reversed(self.started)):
            try:
                self._stop(data, "immediate")
            except Exception:  # noqa: BLE001  (best effort at teardown)
                pass
        shutil.rmtree(self.base, ignore_errors=True)


def _stop_on(signum, _frame):
    raise SystemExit(128 + signum)


def main() -> None:
    # SIGTERM (a service manager, `kill`, make passing on its own SIGTERM) and SIGHUP (the terminal closed) clean up
    # like Ctrl-C: both servers stopped, the temporary folder removed
    # (SIGINT too, explicitly: a shell starts a background job with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler of its own)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _stop_on)
    cluster = Cluster(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    try:
        cluster.start()
        print(f"# data in {cluster.base}, removed when this stops (Ctrl-C or SIGTERM)")
        print(f"# or, surviving a promotion of the standby:\n# CONTEXT_STORE={cluster.hosts_url('read-write')}\n"
              f"# CONTEXT_STORE_REPLICA={cluster.hosts_url('prefer-standby')}")
        print(f"CONTEXT_STORE={cluster.primary_url}\nCONTEXT_STORE_REPLICA={cluster.standby_url}", flush=True)
        signal.pause()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)      # a second signal must not cut the cleanup short
        cluster.stop()


if __name__ == "__main__":
    main()
