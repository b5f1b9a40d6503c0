"""Storage faults (issue 7): a full or read-only data directory gives 503 + Retry-After on writes,
searches keep answering from what exists, nothing is corrupted, and writes resume afterwards."""
import sqlite3
import subprocess

import pytest

from conftest import drain, make_unit

# a full or read-only data directory (PostgreSQL down: tests/test_crash.py, test_postgresql.py):
# CONTEXT_TEST_BACKEND=postgresql runs these on SQLite
pytestmark = pytest.mark.sqlite_only


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    rv = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if rv.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {rv.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path):
    """Fill the filesystem at path; return the filler file."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as fh:   # unbuffered: nothing left to fail at close
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_disk_full_then_space_back(small_disk, make_app):
    app = make_app(data_dir=small_disk / "data")
    c = app.test_client()
    kept = [c.post("/mcp/push", json=make_unit(f"before full {i} 满")).get_json()["cid"] for i in range(20)]
    drain(app)
    filler = fill(small_disk)
    failures = 0
    for i in range(30):   # big units so the WAL must grow
        rv = c.post("/mcp/push", json=make_unit(f"while full {i} " + "x" * 200_000))
        assert rv.status_code in (200, 503), rv.get_data(as_text=True)
        if rv.status_code == 503:
            failures += 1
            body = rv.get_json()
            assert body["code"] == "storage_unavailable" and rv.headers["Retry-After"]
    assert failures > 0
    ready = c.get("/readyz")
    assert ready.status_code == 503 and ready.get_json()["storage_writable"] is False
    # Searches keep working from what exists.
    rv = c.post("/mcp/search", json={"query": "满", "top_k": 50})
    assert rv.status_code == 200 and len(rv.get_json()["results"]) == 20
    for cid in kept:
        assert c.get(f"/mcp/units/{cid}").status_code == 200
    filler.unlink()
    rv = c.post("/mcp/push", json=make_unit("after space is back 恢复"))
    assert rv.status_code == 200
    found = c.post("/mcp/search", json={"query": "恢复", "consistency": "strong"}).get_json()["results"]
    assert [r["cid"] for r in found] == [rv.get_json()["cid"]]
    assert c.get("/readyz").status_code == 200
    for db in (small_disk / "data").rglob("*.db"):
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok", db
        conn.close()


def test_read_only_storage(make_app, monkeypatch):
    """Remounting read-only needs no open writers, so this patches the writer to fail as SQLite does."""
    from service.store.sqlite.connections import Db
    app = make_app()
    c = app.test_client()
    cid = c.post("/mcp/push", json=make_unit("written before read-only 只读")).get_json()["cid"]
    drain(app)
    real_write = Db.write

    def readonly_write(self, fn, *a, **kw):
        raise sqlite3.OperationalError("attempt to write a readonly database")
    monkeypatch.setattr(Db, "write", readonly_write)
    rv = c.post("/mcp/push", json=make_unit("refused while read-only"))
    assert rv.status_code == 503 and rv.get_json()["code"] == "storage_unavailable"
    assert rv.headers["Retry-After"]
    rv = c.post("/mcp/push", json=[make_unit("batch refused too")])
    assert rv.status_code == 503 and rv.get_json()["code"] == "storage_unavailable"
    assert c.post("/mcp/search", json={"query": "只读"}).get_json()["results"][0]["cid"] == cid
    assert c.get(f"/mcp/units/{cid}").status_code == 200
    monkeypatch.setattr(Db, "write", real_write)
    assert c.post("/mcp/push", json=make_unit("accepted again")).status_code == 200
