"""Many tenants on one node (issue 49): what each process keeps open for its tenants is bounded, an idle
tenant's files and threads are closed, and a tenant closed and opened again answers as before.

What an operator sees: a node started under a small open-files limit (`ulimit -n`) serves more tenants than it
could keep open at once; an idle node holds no tenant's file (counted from /proc/<pid>/fd) and no tantivy
thread; the start warns when the limit is too low for the configuration."""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

import pytest
import requests

from conftest import drain, make_unit, replayed
from service.state import app_state

BACKENDS = ("sqlite", "postgresql")

TANTIVY_THREADS = ("thread-tantivy-", "segment_updater", "merge_thread_", "thrd-tantivy-in")


def tenant_keys(n: int) -> dict:
    return {f"key-tenant-{i:03d}-0123456789": (f"t{i:03d}", ("push", "search")) for i in range(n)}


def processes(server) -> list[int]:
    """gunicorn's master and every process under it (workers, the maintainer and its supervisor)."""
    out, todo = [], [server.proc.pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
            except OSError:
                pass
    return out


def held(pid: int, data_dir) -> tuple[int, int, collections.Counter]:
    """(open files, of which under the data folder's tenants/, threads by name) of one process, from /proc."""
    files = tenant_files = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        files += 1
        tenant_files += target.startswith(str(data_dir / "tenants") + "/")
    names = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as fh:
                names[fh.read().strip()] += 1
        except OSError:
            pass
    return files, tenant_files, names


def tantivy_threads(names: collections.Counter) -> int:
    return sum(n for name, n in names.items() if name.startswith(TANTIVY_THREADS))


def found(server, key: str, word: str, **params) -> bool:
    rv = requests.get(f"{server.url}/mcp/search", params={"q": word, **params}, headers=server.headers(key),
                      timeout=30)
    assert rv.status_code == 200, rv.text
    return any(word in r["content"] for r in rv.json()["results"])


def push(server, key: str, content: str) -> str:
    rv = requests.post(f"{server.url}/mcp/push", json=make_unit(content), headers=server.headers(key), timeout=30)
    assert rv.status_code == 200, rv.text
    return rv.json()["cid"]


# --- a node under a small limit ---------------------------------------------------------------------------
def test_a_node_under_256_open_files_serves_60_tenants(live_server_factory, tmp_path):
    """Each tenant keeps a catalog and a day file open (up to a dozen descriptors per process): 60 tenants need
    more than 256, and before issue 49 searches then failed with 503 "unable to open database file". Now
    every push, default search, strong search and read of each tenant answers, and no process holds more
    files than the limit leaves it."""
    keys = tenant_keys(60)
    server = live_server_factory(keys=keys, nofile=256)
    cids = {}
    for key, (tenant, _) in keys.items():
        cids[key] = push(server, key, f"first unit of w{tenant} order shipped")
    for rnd in range(2):
        for key, (tenant, _) in keys.items():
            assert found(server, key, f"w{tenant}"), (rnd, tenant)
            rv = requests.get(f"{server.url}/mcp/units/{cids[key]}", headers=server.headers(key), timeout=30)
            assert rv.status_code == 200 and f"w{tenant}" in rv.json()["content"]
    for key, (tenant, _) in list(keys.items())[::6]:
        assert found(server, key, f"w{tenant}", consistency="strong")
        push(server, key, f"second unit of v{tenant} pushed late")            # read your writes, at once
        assert found(server, key, f"v{tenant}")
    for pid in processes(server):
        files, _, names = held(pid, server.data_dir)
        assert files <= 256 - 32 and sum(names.values()) <= 128, (pid, files, names)
    assert "unable to open" not in server.log()


# --- a tenant closed and opened again ---------------------------------------------------------------------
def test_a_tenant_closed_and_opened_again_loses_nothing(make_app, backend):
    """A store keeping one tenant's files (and two read indexes) at a time: the others are closed as each is
    used, and each answers as before when used again: what was acknowledged, default searches (read your
    writes), strong searches, lineage."""
    app = make_app(open_read_indexes=2, replica_debounce_ms=0)
    store = app_state(app).store
    if backend == "sqlite":
        store._tenants.cap = 1
    names = [f"c{i}" for i in range(6)]
    cids = {}
    for name in names:
        cids[name] = store.push_one(name, make_unit(f"root unit of w{name} heron"))["cid"]
        store.push_one(name, make_unit(f"child of w{name} egret", parent_cid=cids[name]))
    drain(app)
    replayed(app)
    for rnd in range(2):
        for name in names:
            assert {r["content"] for r in store.search(name, _params(f"w{name}"))["results"]} == {
                f"root unit of w{name} heron", f"child of w{name} egret"}, (rnd, name)
            assert len(store.search(name, _params(f"w{name}", strong=True))["results"]) == 2
            assert store.get(name, cids[name])["content"] == f"root unit of w{name} heron"
            assert len(store.lineage(name, cids[name])["children"]) == 1
            late = store.push_one(name, make_unit(f"late unit {rnd} of x{name}"))
            assert late["status"] == "ok"
            assert [r["cid"] for r in store.search(name, _params(f"x{name} {rnd}", operator="and"))["results"]] == [
                late["cid"]]                                     # read your writes, before any maintenance
        assert store.readers.loaded() <= 2
        if backend == "sqlite":
            assert len(store.open_tenants()) == 1
        drain(app)
        replayed(app)


def _params(query: str, strong: bool = False, **kw):
    from service.config import Config
    from service.params import parse_search
    return parse_search({"query": query, **({"consistency": "strong"} if strong else {}), **kw}, Config())


@pytest.mark.sqlite_only            # counts SQLite's files
def test_closing_a_tenant_closes_its_files(make_app, tmp_path):
    """A tenant the store closes holds no descriptor in the process afterwards (counted from /proc/self/fd)."""
    app = make_app()
    store = app_state(app).store
    for name in ("a1", "a2"):
        store.push_one(name, make_unit(f"unit of w{name}"))
    drain(app)
    assert store.search("a1", _params("wa1"))["results"]
    folder = str(store.root / "tenants" / "a1") + "/"

    def open_files_of_a1() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(folder)
            except OSError:
                pass
        return n

    assert open_files_of_a1() > 0
    store._tenants.trim(lambda: "a1" in store.open_tenants())
    app_state(app).maintenance.step_down()
    assert open_files_of_a1() == 0
    assert [r["content"] for r in store.search("a1", _params("wa1"))["results"]] == ["unit of wa1"]


# --- idle ---------------------------------------------------------------------------------------------------
def test_an_idle_node_closes_every_tenants_files_and_threads(live_server_factory):
    """Tenants unused for CONTEXT_TENANT_IDLE_S have their files, read indexes and writers closed in every
    process (counted from /proc: files under tenants/, tantivy's threads); searched again, each answers."""
    keys = tenant_keys(12)
    server = live_server_factory(keys=keys, env={"CONTEXT_TENANT_IDLE_S": "2"})
    for key, (tenant, _) in keys.items():
        push(server, key, f"unit of w{tenant}")
    for key, (tenant, _) in keys.items():
        assert found(server, key, f"w{tenant}")
    busy = [held(pid, server.data_dir) for pid in processes(server)]
    assert sum(t for _, t, _ in busy) > 0 and sum(tantivy_threads(n) for _, _, n in busy) > 0
    deadline = time.monotonic() + 60
    while True:
        idle = [held(pid, server.data_dir) for pid in processes(server)]
        if sum(t for _, t, _ in idle) == 0 and sum(tantivy_threads(n) for _, _, n in idle) == 0:
            break
        assert time.monotonic() < deadline, idle
        time.sleep(0.5)
    for key, (tenant, _) in keys.items():
        assert found(server, key, f"w{tenant}")
        assert found(server, key, f"w{tenant}", consistency="strong")


# --- the warning at start -----------------------------------------------------------------------------------
@pytest.mark.sqlite_only            # the configuration alone
def test_the_start_warns_when_the_open_files_limit_is_too_low(tmp_path):
    """Under a limit that cannot keep CONTEXT_MAX_OPEN_SHARDS day files open, gunicorn's start and `context-mode
    doctor` say so, with what each process will keep and how to raise it; CONTEXT_OPEN_FILES above what the
    limit leaves is named too. A high limit says nothing."""
    import resource

    def run(nofile: int, **env):
        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        return subprocess.run([sys.executable, "-m", "service.cli", "doctor"], capture_output=True, text=True,
                              env={**os.environ, "CONTEXT_DATA_DIR": str(tmp_path / "dd"), **env},
                              preexec_fn=limit, timeout=120)

    from service.budget import Budget
    from service.config import Config
    low, shards = run(512), Budget.of(Config(), 512).shards
    assert 0 < shards < 64
    assert f"warn  the open-files limit (512) holds {shards} of CONTEXT_MAX_OPEN_SHARDS=64 day files" in low.stderr
    assert "ulimit -n 65536" in low.stderr and low.returncode == 0
    over = run(512, CONTEXT_OPEN_FILES="5000")
    assert "CONTEXT_OPEN_FILES=5000 is more than the open-files limit (512) leaves" in over.stderr
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= 4096:
        assert "open-files limit" not in run(4096).stderr


def test_the_budget_follows_the_limit():
    from service.budget import Budget
    from service.config import Config
    config = Config()
    small, large = Budget.of(config, 1024), Budget.of(config, 65536)
    assert (small.files, small.shards) == (768, 43) and small.tenants * 5 + small.shards * 7 <= small.files
    assert (large.shards, large.tenants) == (64, 1000)
    assert Budget.of(config.replace(open_files=200), 65536).files == 200
    assert Budget.of(config.replace(open_files=5000), 1024).files == 768
    with pytest.raises(ValueError, match="CONTEXT_OPEN_FILES"):
        Config(open_files=-1)
