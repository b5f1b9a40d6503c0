"""`make pg-cluster` (tools/pg_cluster.py) by hand: Ctrl-C, SIGTERM (a service manager, `kill`) and SIGHUP (the
terminal closed) all stop both PostgreSQL servers and remove their folder; SIGTERM used to leave both running."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, pg_cluster_module, stop_group

VENV = Path(sys.executable).parent.parent
pytestmark = pytest.mark.skipif(pg_cluster_module().pg_bin() is None,
                                reason="PostgreSQL is not installed (.ci/setup.d/postgresql.sh installs it)")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(cmd: list[str], log: Path) -> tuple[subprocess.Popen, Path, list[int]]:
    """The cluster started by ``cmd``, once it printed its URLs: (process, its folder, its two ports)."""
    out = open(log, "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "CONTEXT_STORE_REPLICA=postgresql" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    text = log.read_text()
    folder = Path(re.search(r"# data in (\S+),", text).group(1))
    ports = [int(p) for p in re.findall(r"^CONTEXT_STORE(?:_REPLICA)?=postgresql://postgres@127\.0\.0\.1:(\d+)/",
                                        text, flags=re.M)]
    assert len(ports) == 2 and all(listening(p) for p in ports) and folder.is_dir()
    return proc, folder, ports


def force_stop(folder: Path) -> None:
    """What a failed cleanup left: its servers stopped, its folder removed (so a failing test leaks nothing)."""
    tool = pg_cluster_module()
    for data in (folder / "primary", folder / "standby"):
        if (data / "postmaster.pid").exists():
            cmd = [str(tool.pg_bin() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
            subprocess.run(["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd,
                           capture_output=True, timeout=60)
    shutil.rmtree(folder, ignore_errors=True)


def assert_cleaned_up(proc: subprocess.Popen, folder: Path, ports: list[int]) -> None:
    try:
        proc.wait(timeout=60)
        left = folder.exists()
        running = [p for p in ports if listening(p)]
    finally:
        stop_group(proc, signal.SIGKILL)
        force_stop(folder)
    assert not left, f"{folder} was left behind"
    assert not running, "a PostgreSQL server kept running"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_the_script_cleans_up_on_each_stop_signal(tmp_path, sig):
    proc, folder, ports = start([sys.executable, "tools/pg_cluster.py"], tmp_path / "out.log")
    proc.send_signal(sig)                         # to the script alone, as `kill` sends it
    assert_cleaned_up(proc, folder, ports)


def test_make_pg_cluster_cleans_up_when_make_gets_sigterm(tmp_path):
    """make passes its SIGTERM on to the script and waits for it (a service manager stops make, not python)."""
    proc, folder, ports = start(["make", "--no-print-directory", "-o", f"{VENV}/.installed", f"VENV={VENV}",
                                 "pg-cluster"], tmp_path / "out.log")
    proc.send_signal(signal.SIGTERM)
    assert_cleaned_up(proc, folder, ports)
