"""Which gunicorn worker holds a connection (Linux /proc): used by the live-context tests
(tests/live_support.py) and bench/listen.py, to push through the worker that does *not* hold a
listener and to report cross-worker deliveries apart. Standard library only."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """Direct children of a process."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def comm(pid: int) -> str:
    """A process's name (the maintainer's supervisor and maintainer name themselves: they are forks of
    the gunicorn master and share its command line)."""
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def worker_pids(master: int) -> list[int]:
    """The pids of the gunicorn master's workers (not the maintainer's supervisor, service/maintainer.py)."""
    return [p for p in children(master) if comm(p) != "cms-supervisor"]


def _inode(server_port: int, client_port: int) -> str | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == server_port and int(f[2].rsplit(":", 1)[1], 16) == client_port:
                return f[9]
    return None


def worker_holding(sock: socket.socket, workers: list[int], timeout: float = 5.0) -> int | None:
    """The gunicorn worker whose descriptors hold the server side of this client socket."""
    client_port, server_port = sock.getsockname()[1], sock.getpeername()[1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inode = _inode(server_port, client_port)
        if inode and inode != "0":
            target = f"socket:[{inode}]"
            for pid in workers:
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                            return pid
                    except OSError:
                        continue
        time.sleep(0.01)
    return None
