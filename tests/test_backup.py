"""Backup and restore (issue 7): `context-mode backup DIR` of a LIVE store, restore, serve it again."""
from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from conftest import VENV_BIN, make_unit

# backup/restore copy SQLite files (PostgreSQL: pg_dump, docs/postgresql.md):
# CONTEXT_TEST_BACKEND=postgresql runs these on SQLite
pytestmark = pytest.mark.sqlite_only

DAY = 86_400
FIELDS = ("type", "source", "timestamp", "content", "metadata", "parent_cid")


@pytest.fixture
def servers(live_server_factory):
    """Start real gunicorns on given data dirs; all are stopped after the test."""
    return lambda data_dir, **kw: live_server_factory(data_dir=data_dir, **kw)


def cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "context-mode"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def unit_for(i: int, now: int, parent: str | None = None, tag: str = "bk") -> dict:
    u = make_unit(f"backup unit {tag}{i:05d}q 备份 恢复 " + "filler text " * 60,
                  timestamp=now - (i % 3) * DAY, ttl=7 * DAY, source=f"backup_v1_{i % 5}",
                  metadata={"i": i, "tag": tag})
    if parent:
        u["parent_cid"] = parent
    return u


def same(stored: dict, sent: dict) -> bool:
    return all(stored.get(k) == sent.get(k) for k in FIELDS)


def get_all(url: str, cids) -> dict[str, dict | None]:
    """GET every CID (8 threads); None for a 404."""
    local = threading.local()

    def one(cid):
        sess = getattr(local, "s", None) or setattr(local, "s", requests.Session()) or local.s
        rv = sess.get(f"{url}/mcp/units/{cid}", timeout=30)
        assert rv.status_code in (200, 404), rv.text
        return cid, rv.json() if rv.status_code == 200 else None

    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, list(cids)))


def wait_indexed(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if requests.get(url + "/readyz", timeout=10).json()["index_pending"] == 0:
            return
        time.sleep(0.2)
    raise AssertionError("index_pending never reached 0")


def shard_rows(data_dir: Path) -> dict[str, dict]:
    """Every unit row of every primary shard, read straight from the files."""
    out = {}
    for db in sorted((data_dir / "tenants" / "default" / "primary").glob("*.db")):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        for r in conn.execute("SELECT cid, type, source, timestamp, content, metadata, parent_cid FROM units"):
            out[r["cid"]] = {**dict(r), "metadata": json.loads(r["metadata"]) if r["metadata"] else None}
        conn.close()
    return out


def test_backup_of_a_live_store_restores_every_acked_unit(servers, tmp_path):
    live, backup_dir, restored = tmp_path / "live", tmp_path / "backup", tmp_path / "restored"
    server = servers(live, env={"CONTEXT_REPLICA_DEBOUNCE_MS": "100"})
    now = int(time.time())
    sent: dict[str, dict] = {}
    s = requests.Session()

    # 1,500 units in three day shards before the backup (batches, then singles with parents).
    for start in range(0, 1400, 500):
        batch = [unit_for(i, now) for i in range(start, min(start + 500, 1400))]
        rv = s.post(server.url + "/mcp/push", json={"units": batch}, timeout=60)
        assert rv.status_code == 200, rv.text
        for u, r in zip(batch, rv.json()["results"]):
            assert r["status"] == "ok", r
            sent[r["cid"]] = u
    parents = list(sent)
    for i in range(1400, 1500):
        u = unit_for(i, now, parent=random.choice(parents))
        rv = s.post(server.url + "/mcp/push", json=u, timeout=30)
        assert rv.status_code == 200, rv.text
        sent[rv.json()["cid"]] = u
    # A unit deleted before the backup must not come back.
    gone = parents[7]
    assert s.delete(f"{server.url}/mcp/units/{gone}", timeout=30).status_code == 200
    acked_before = {c: u for c, u in sent.items() if c != gone}

    # Pushes keep arriving from two threads while the backup runs.
    during: dict[str, dict] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def pusher(w: int):
        sess, i = requests.Session(), 0
        while not stop.is_set():
            i += 1
            n = 1 if i % 3 else 10
            batch = [unit_for(10_000 * (w + 1) + i * 100 + k, now, tag=f"d{w}x") for k in range(n)]
            rv = sess.post(server.url + "/mcp/push", json=batch if n > 1 else batch[0], timeout=30)
            assert rv.status_code == 200, rv.text
            results = rv.json()["results"] if n > 1 else [rv.json()]
            with lock:
                for u, r in zip(batch, results):
                    during[r["cid"]] = u

    threads = [threading.Thread(target=pusher, args=(w,), daemon=True) for w in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    with lock:
        in_flight_start = len(during)
    rv = cli("backup", backup_dir, "--data-dir", live)
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert rv.returncode == 0, rv.stderr + rv.stdout
    assert "backup complete" in rv.stdout
    with lock:
        assert len(during) > in_flight_start, "no push was acked while the backup ran"

    manifest = json.loads((backup_dir / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["sqlite_version"] == sqlite3.sqlite_version
    assert len(manifest["tenants"]["default"]["shards"]) == 3
    assert not list(backup_dir.rglob("replica/*")), "replicas are derived and never backed up"
    assert not list(backup_dir.rglob("*-wal")), "backup files are self-contained"

    rv = cli("restore", backup_dir, "--data-dir", restored)
    assert rv.returncode == 0, rv.stderr + rv.stdout
    assert "restore complete" in rv.stdout and "integrity ok" in rv.stdout

    # Serve the restored copy (the live server keeps running on its own directory).
    again = servers(restored)
    s2 = requests.Session()
    for cid, stored in get_all(again.url, acked_before).items():
        assert stored is not None, f"acked unit {cid} missing after restore"
        assert same(stored, acked_before[cid]), cid
    assert s2.get(f"{again.url}/mcp/units/{gone}", timeout=30).status_code == 404

    wait_indexed(again.url)
    by_token = {f"bk{u['metadata']['i']:05d}q": c for c, u in acked_before.items()}
    tokens = sorted(by_token)
    for k in range(0, len(tokens), 50):
        chunk = tokens[k:k + 50]
        rv = s2.post(again.url + "/mcp/search", json={"query": " ".join(chunk), "top_k": 100,
                                                      "consistency": "strong"}, timeout=60)
        assert rv.status_code == 200, rv.text
        found = {r["cid"] for r in rv.json()["results"]}
        missing = {by_token[t] for t in chunk} - found
        assert not missing, f"acked units not searchable after restore: {sorted(missing)[:5]}"

    # Nothing that was not acked, and whatever arrived during the backup is complete and identical.
    all_acked = {**acked_before, **during}
    rows = shard_rows(restored)
    assert gone not in rows
    assert set(rows) <= set(all_acked), "the backup holds a unit nobody was acked for"
    for cid, stored in get_all(again.url, rows).items():
        assert same(rows[cid], all_acked[cid]), cid
        assert stored is not None and same(stored, all_acked[cid]), cid
    present_during = len(set(rows) & set(during))
    print(f"\nbackup round trip: {len(acked_before)} units acked before the backup all restored and "
          f"searchable; {present_during} of {len(during)} acked during it present and identical")
    assert len(acked_before) == 1499


def _tiny_store(make_app, data_dir: Path, text: str) -> str:
    app = make_app(data_dir=data_dir)
    rv = app.test_client().post("/mcp/push", json=make_unit(text))
    assert rv.status_code == 200
    return rv.get_json()["cid"]


def test_restore_refuses_non_empty_dir_unless_forced(tmp_path, make_app):
    from service.cli import main
    src, dst, out = tmp_path / "src", tmp_path / "dst", tmp_path / "out"
    cid = _tiny_store(make_app, src, "the backed-up unit 小")
    runner = CliRunner()
    rv = runner.invoke(main, ["backup", str(out), "--data-dir", str(src)])
    assert rv.exit_code == 0, rv.output
    assert runner.invoke(main, ["backup", str(out), "--data-dir", str(src)]).exit_code == 1  # not empty

    other = _tiny_store(make_app, dst, "a unit the restore replaces 大")
    # A stale WAL and replica of the tenant being replaced must not survive a forced restore.
    (dst / "tenants" / "default" / "replica" / "2000-01-01.db").write_bytes(b"stale")
    rv = runner.invoke(main, ["restore", str(out), "--data-dir", str(dst)])
    assert rv.exit_code == 1 and "not empty" in rv.output
    rv = runner.invoke(main, ["restore", str(out), "--data-dir", str(dst), "--force"])
    assert rv.exit_code == 0, rv.output
    assert "1 units" in rv.output
    assert not (dst / "tenants" / "default" / "replica" / "2000-01-01.db").exists()

    app = make_app(data_dir=dst)
    c = app.test_client()
    assert c.get(f"/mcp/units/{cid}").status_code == 200
    assert c.get(f"/mcp/units/{other}").status_code == 404  # the tenant is exactly the backup


@pytest.mark.parametrize("command", ["backup", "restore"])
def test_backup_and_restore_refuse_a_postgresql_store_unless_given_a_data_dir(tmp_path, make_app, monkeypatch,
                                                                              command):
    """With CONTEXT_STORE on PostgreSQL they would copy ./data (nothing, or an older SQLite store) and say
    it worked; they say what to use instead, never showing the password."""
    from service.cli import main
    src, out = tmp_path / "src", tmp_path / "out"
    _tiny_store(make_app, src, "a unit of an older SQLite store")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONTEXT_DATA_DIR", raising=False)
    monkeypatch.setenv("CONTEXT_STORE", "postgresql://ctx:s3cret@127.0.0.1:5432/context")
    target = out if command == "backup" else src
    rv = CliRunner().invoke(main, [command, str(target)])
    assert rv.exit_code == 1
    assert "CONTEXT_STORE is PostgreSQL" in rv.output and "pg_dump" in rv.output
    assert "s3cret" not in rv.output
    assert not out.exists() and not (tmp_path / "data").exists()
    if command == "backup":        # --data-dir: a SQLite data directory on purpose
        rv = CliRunner().invoke(main, ["backup", str(out), "--data-dir", str(src)])
        assert rv.exit_code == 0 and "1 units" in rv.output, rv.output


def test_backup_refuses_any_store_that_is_not_sqlite(tmp_path, monkeypatch):
    """It refused only "postgresql": a backend added later would have been given a copy of ./data."""
    from service.cli import main
    from service.config import Config
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONTEXT_DATA_DIR", raising=False)
    monkeypatch.setattr(Config, "backend", property(lambda self: "elsewhere"))
    for command in ("backup", "restore"):
        rv = CliRunner().invoke(main, [command, str(tmp_path)])
        assert rv.exit_code == 1 and "CONTEXT_STORE is elsewhere" in rv.output, rv.output
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("tenant, day_file", [
    ("../escape", "2024-01-01.db"), ("default", "../../../etc/passwd"), ("default", "2024-01-01.db/../x"),
    ("Default", "2024-01-01.db"), ("default", "catalog.db"), ("", "2024-01-01.db"),
])
def test_restore_rejects_a_hostile_manifest(tmp_path, tenant, day_file):
    from service.store.sqlite.backup import BackupError, restore
    bdir = tmp_path / "b"
    bdir.mkdir()
    (bdir / "manifest.json").write_text(json.dumps({
        "format": 1, "tenants": {tenant: {"catalog": None, "shards": {day_file: {"units": 0}}}}}))
    with pytest.raises(BackupError, match="invalid"):
        restore(bdir, tmp_path / "data")
    assert not (tmp_path / "data").exists() and not (tmp_path / "etc").exists()


def test_restore_refuses_while_a_server_holds_the_tenant(servers, tmp_path):
    from service.store.sqlite.backup import BackupError, backup, restore
    server = servers(tmp_path / "d")
    assert requests.post(server.url + "/mcp/push", json=make_unit("held"), timeout=10).status_code == 200
    deadline = time.monotonic() + 10
    while not (tmp_path / "d" / "tenants" / "default" / "maintenance.lock").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)
    backup(tmp_path / "d", tmp_path / "b")
    with pytest.raises(BackupError, match="running service"):
        restore(tmp_path / "b", tmp_path / "d", force=True)


def test_backup_and_restore_paths_with_uri_characters(tmp_path, make_app):
    from service.store.sqlite.backup import backup, restore
    src, out, dst = tmp_path / "src #1?x=%20", tmp_path / "out #2", tmp_path / "dst?mode=memory"
    cid = _tiny_store(make_app, src, "a unit in an awkward directory")
    m = backup(src, out)
    assert m["totals"]["units"] == 1
    assert restore(out, dst)["units"] == 1
    app = make_app(data_dir=dst)
    assert app.test_client().get(f"/mcp/units/{cid}").status_code == 200
