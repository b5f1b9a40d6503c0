"""The maintainer process (service/maintainer.py, issue 17): under gunicorn, indexing, the read index
and the janitor run beside the workers, not in them; its death costs latency, never a unit; it ends
with the service."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from conftest import LiveServer
from workers import children, comm
from service.state import app_state


def alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def lock_holders(path: Path) -> set[int]:
    """Processes holding an flock on ``path`` (from /proc/locks, matched by inode)."""
    ino = os.stat(path).st_ino
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" in parts:               # a waiter, not a holder
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK" and int(parts[5].split(":")[2]) == ino:
            holders.add(int(parts[4]))
    return holders


def maintainer_pids(server: LiveServer) -> tuple[int, int]:
    """(supervisor, maintainer) under this gunicorn's master, waiting for both."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sups = [p for p in children(server.proc.pid) if comm(p) == "cms-supervisor"]
        if sups:
            runs = [p for p in children(sups[0]) if comm(p) == "cms-maintainer"]
            if runs:
                return sups[0], runs[0]
        time.sleep(0.1)
    raise AssertionError(f"no maintainer under gunicorn {server.proc.pid}:\n{server.log()}")


def push(server: LiveServer, i: int, tag: str) -> str:
    r = requests.post(server.url + "/mcp/push", json={"type": "tool_output", "source": "maint", "timestamp": int(time.time()),
                                                      "content": f"maintainer probe {tag} number{i}"}, timeout=10)
    assert r.status_code in (200, 201), r.text
    return r.json()["cid"]


def wait_indexed(server: LiveServer, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = requests.get(server.url + "/readyz", timeout=5).json()
        if body["index_pending"] == 0 and body["replica_lag_ms"] == 0:
            return body
        time.sleep(0.1)
    raise AssertionError(f"not indexed within {timeout} s: {body}")


def found_in_read_index(server: LiveServer, tag: str, n: int) -> set[str]:
    """CIDs a default search finds for ``tag`` (once indexed: from the read index)."""
    r = requests.post(server.url + "/mcp/search", json={"query": f"maintainer probe {tag}", "top_k": max(n, 1)},
                          timeout=10)
    assert r.status_code == 200, r.text
    return {x["cid"] for x in r.json()["results"] if tag in x["content"]}


@pytest.fixture
def server(tmp_path):
    s = LiveServer(tmp_path / "data", env={"CONTEXT_INDEX_POLL_MS": "100"}).start()
    yield s
    s.stop()


def test_the_maintainer_indexes_and_the_workers_lead_nothing(server):
    sup, run = maintainer_pids(server)
    cids = {push(server, i, "alpha") for i in range(30)}
    body = wait_indexed(server)
    assert found_in_read_index(server, "alpha", 30) == cids
    tenant_lock = server.data_dir / "tenants" / "default" / "maintenance.lock"
    assert lock_holders(tenant_lock) == {run}                 # the maintainer leads the tenant, no worker
    assert lock_holders(server.data_dir / "maintainer.lock") == {run}
    status = json.loads((server.data_dir / "maintainer.json").read_text())
    assert status["pid"] == run
    deadline = time.monotonic() + 10                          # /readyz reports the maintainer's lag,
    while body["index_lag_ms"]["p50_ms"] is None and time.monotonic() < deadline:   # written each second
        time.sleep(0.2)
        body = requests.get(server.url + "/readyz", timeout=5).json()
    assert body["index_lag_ms"]["p50_ms"] is not None


def test_a_killed_maintainer_loses_nothing_and_comes_back(server):
    sup, run = maintainer_pids(server)
    before = {push(server, i, "beta") for i in range(10)}
    wait_indexed(server)
    os.kill(run, signal.SIGKILL)
    during = set()
    deadline = time.monotonic() + 20
    i = 0
    # pushes keep being acked and indexed while it is gone (the workers lead meanwhile) ...
    while time.monotonic() < deadline:
        during.add(push(server, 100 + i, "beta"))
        i += 1
        if i >= 20 and not alive(run):
            break
        time.sleep(0.02)
    wait_indexed(server)
    # ... and the supervisor starts a new one, which takes the tenant over from the workers.
    deadline = time.monotonic() + 30
    new = None
    while time.monotonic() < deadline:
        runs = [p for p in children(sup) if comm(p) == "cms-maintainer" and p != run]
        tenant_lock = server.data_dir / "tenants" / "default" / "maintenance.lock"
        if runs and lock_holders(tenant_lock) == {runs[0]}:
            new = runs[0]
            break
        time.sleep(0.1)
    assert new is not None, server.log()
    after = {push(server, 200 + j, "beta") for j in range(10)}
    wait_indexed(server)
    assert found_in_read_index(server, "beta", 100) == before | during | after
    assert f"maintainer {run} exited" in server.log()


def test_the_maintainer_ends_when_the_master_is_killed(tmp_path):
    """(A graceful stop of the whole group: test_signals_in_a_burst_still_end_the_maintainer.)"""
    s = LiveServer(tmp_path / "b").start()
    try:
        sup, run = maintainer_pids(s)
        os.kill(s.proc.pid, signal.SIGKILL)      # the master alone dies: no orphan keeps the data locked
        s.proc.wait(10)
        deadline = time.monotonic() + 20
        while (alive(sup) or alive(run)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(sup) and not alive(run)
    finally:
        try:
            os.killpg(s.proc.pid, signal.SIGKILL)  # the workers, if they have not noticed yet
        except ProcessLookupError:
            pass


def test_signals_in_a_burst_still_end_the_maintainer(tmp_path):
    """A group SIGTERM reaches the maintainer three times at once (from the shell's kill of the group,
    from its supervisor, and as its parent-death signal): it must still finish and exit."""
    s = LiveServer(tmp_path / "data").start()
    try:
        for _ in range(3):
            sup, run = maintainer_pids(s)
            for _ in range(300):
                try:
                    os.kill(run, signal.SIGTERM)
                except ProcessLookupError:
                    break
            deadline = time.monotonic() + 20
            while alive(run) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not alive(run), "the maintainer hung on a burst of SIGTERMs"
        os.killpg(s.proc.pid, signal.SIGTERM)                  # the whole group, as a terminal would
        s.proc.wait(30)
        deadline = time.monotonic() + 20
        while (alive(sup) or any(comm(p) == "cms-maintainer" for p in children(sup))) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(sup)
    finally:
        s.stop()


def test_off_the_workers_maintain_as_before(tmp_path):
    s = LiveServer(tmp_path / "data", env={"CONTEXT_MAINTENANCE_PROCESS": "false"}).start()
    try:
        assert not [p for p in children(s.proc.pid) if comm(p) == "cms-supervisor"]
        cids = {push(s, i, "gamma") for i in range(10)}
        wait_indexed(s)
        assert found_in_read_index(s, "gamma", 10) == cids
        holders = lock_holders(s.data_dir / "tenants" / "default" / "maintenance.lock")
        assert holders and holders <= set(children(s.proc.pid))    # a worker leads
    finally:
        s.stop()


# --- in process: which days a pass reads, and what the FIFO carries ---------------------------------

@pytest.mark.sqlite_only            # reads the day files (PostgreSQL's queue is one table: no days to tell)
def test_a_pass_reads_the_days_it_was_told_and_every_day_once_a_second(make_app):
    from service.store.sqlite.maintenance import FULL_SCAN_S
    told, other = make_app(background=False), make_app(background=False)   # two workers of one data folder
    maint = app_state(told).maintenance
    store = app_state(told).store
    now = int(time.time())

    def put(app, content, ts):
        r = app.test_client().post("/mcp/push", json={"type": "tool_output", "source": "t", "timestamp": ts,
                                                      "content": content})
        assert r.status_code == 200, r.get_json()

    put(told, "first unit", now)
    assert maint.run_once() >= 1                                  # the first pass reads every file
    put(other, "elsewhere unit", now - 3 * 86400)                 # another process's push: not told here
    put(told, "second unit", now)
    assert maint.run_once(full=False) == 1                        # only the day it was told about
    assert unindexed(store) == {(now - 3 * 86400) // 86400}
    assert maint.run_once(full=True) == 1                         # the scan of every live day finds the other
    assert unindexed(store) == set()
    assert FULL_SCAN_S <= 2.0                                     # so a lost wake-up costs at most this


def unindexed(store) -> set[int]:
    """Epoch days of the day files that hold rows not yet in FTS5."""
    import datetime
    import sqlite3
    out = set()
    for f in (store.tenant("default").dir / "primary").glob("*.db"):
        conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        if conn.execute("SELECT count(*) FROM units WHERE indexed = 0").fetchone()[0]:
            out.add(datetime.date.fromisoformat(f.name[:10]).toordinal() - datetime.date(1970, 1, 1).toordinal())
        conn.close()
    return out


class _Recorder:
    def __init__(self):
        self.marked, self.woken = [], 0

    def mark(self, tenant, days):
        self.marked.append((tenant, sorted(days)))

    def notify(self, tenant, days):
        self.woken += 1


def test_the_wake_fifo_carries_tenant_days_and_ignores_anything_else(tmp_path):
    from service.maintainer import Presence, _wake_fifo, _wake_lines
    fd = _wake_fifo(tmp_path / "maintainer.wake")
    try:
        p = Presence(tmp_path)
        p.wake("acme", ["2026-11-29", "2026-11-30"])
        p.wake("other-tenant", ["2026-11-30"])
        p.wake(None, ())                                          # a bare wake-up
        with open(tmp_path / "maintainer.wake", "wb", buffering=0) as w:   # what no worker writes
            w.write(b"../etc\t2026-11-30\nacme\tDROP TABLE\nacme\t2026-11-30\t\n\xff\xfe\t2026-11-30\nacme\t2026-1")
        rec = _Recorder()
        rest = _wake_lines(fd, b"", rec)
        assert sorted(rec.marked) == [("acme", ["2026-11-29", "2026-11-30"]), ("other-tenant", ["2026-11-30"])]
        assert rec.woken == 1
        assert rest == b"acme\t2026-1"                            # an unfinished line waits for its end
        os.write(os.open(tmp_path / "maintainer.wake", os.O_WRONLY | os.O_NONBLOCK), b"1-28\n")
        rec2 = _Recorder()
        assert _wake_lines(fd, rest, rec2) == b""
        assert rec2.marked == [("acme", ["2026-11-28"])]
        p.close()
    finally:
        os.close(fd)


def test_a_worker_wakes_nobody_when_no_maintainer_reads(tmp_path):
    from service.maintainer import Presence
    p = Presence(tmp_path)
    assert not p.alive()
    p.wake("acme", ["2026-11-30"])                               # no FIFO yet: nothing, no error
    os.mkfifo(tmp_path / "maintainer.wake")
    p.wake("acme", ["2026-11-30"])                               # a FIFO nobody reads: ENXIO, no error
    assert p.status() is None
    p.close()
