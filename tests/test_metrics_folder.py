"""The folder gunicorn's workers sum their metrics through: removed when the server stops, and a killed
start's removed at the next start, never a live server's (service/boot.py, service/gunicorn_conf.py)."""
import os
import signal
import subprocess
import time

import requests

from conftest import LiveServer
from service.boot import METRICS_PREFIX, remove_stale_metrics_dirs


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def metrics_dirs(base) -> list:
    return sorted(p.name for p in base.iterdir() if p.name.startswith(METRICS_PREFIX))


def test_a_stopped_server_leaves_no_metrics_folder_and_the_next_start_removes_a_killed_ones(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    killed = LiveServer(tmp_path / "data1", env=env).start()
    assert requests.get(killed.url + "/metrics", timeout=10).status_code == 200
    [mine] = metrics_dirs(tmp)
    assert mine.startswith(f"{METRICS_PREFIX}{killed.proc.pid}-")
    assert os.listdir(tmp / mine)                 # the workers write their files there
    killed.kill()                                  # no exit hook runs: the folder stays behind
    assert metrics_dirs(tmp) == [mine]
    legacy_live = tmp / f"{METRICS_PREFIX}abcd1234"           # an older start's name, its process still running
    legacy_live.mkdir()
    (legacy_live / f"counter_{os.getpid()}.db").write_bytes(b"")
    os.utime(legacy_live, (time.time() - 3600,) * 2)

    server = LiveServer(tmp_path / "data2", env=env).start()
    try:
        now = metrics_dirs(tmp)
        assert mine not in now                     # the killed master's folder is gone
        assert legacy_live.name in now             # one a live process writes to is kept
        [ours] = [n for n in now if n.startswith(f"{METRICS_PREFIX}{server.proc.pid}-")]
        assert requests.get(server.url + "/metrics", timeout=10).status_code == 200
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)
        server.stop()
    assert metrics_dirs(tmp) == [legacy_live.name]   # a clean stop removes its own


def test_only_stale_folders_of_this_user_are_removed(tmp_path):
    live = tmp_path / f"{METRICS_PREFIX}{os.getpid()}-x1"
    gone = tmp_path / f"{METRICS_PREFIX}{dead_pid()}-x2"
    legacy_old = tmp_path / f"{METRICS_PREFIX}old1"
    legacy_fresh = tmp_path / f"{METRICS_PREFIX}new1"
    other = tmp_path / "something-else"
    for d in (live, gone, legacy_old, legacy_fresh, other):
        d.mkdir()
    (legacy_old / f"histogram_{dead_pid()}.db").write_bytes(b"")
    os.utime(legacy_old, (time.time() - 3600,) * 2)
    removed = remove_stale_metrics_dirs(str(tmp_path))
    assert sorted(removed) == sorted([str(gone), str(legacy_old)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, legacy_fresh.name, other.name])
