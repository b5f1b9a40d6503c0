"""The fast path of a default search (issue 42, docs/design.md §11): what a search depends on but does not
ask for (the leader's state, the read index's latest commit, the catalog's read-your-writes tail and
expiries) is read again only when a change number says it changed (service/signals.py), and every process
of the data folder sees each change at once."""
import subprocess
import sys
import time

import pytest
import requests

from conftest import drain, make_unit

BACKENDS = ("sqlite", "postgresql")


def test_a_change_number_set_by_one_process_is_seen_by_another(tmp_path):
    from service.signals import CATALOG, INDEX, SLOTS, Signals
    signals = Signals.of(tmp_path)
    assert Signals._offset(CATALOG, "acme") != Signals._offset(CATALOG, "globex")     # (not one shared slot)
    before = {(k, t): signals.read(k, t) for k in (INDEX, CATALOG) for t in ("acme", "globex")}
    subprocess.run([sys.executable, "-c", "import sys; from service.signals import CATALOG, Signals; "
                    "Signals(sys.argv[1]).changed(CATALOG, 'acme')", str(tmp_path)], check=True, timeout=60)
    after = {(k, t): signals.read(k, t) for k in (INDEX, CATALOG) for t in ("acme", "globex")}
    assert after[(CATALOG, "acme")] != before[(CATALOG, "acme")]
    assert {k: v for k, v in after.items() if k != (CATALOG, "acme")} == \
           {k: v for k, v in before.items() if k != (CATALOG, "acme")}
    assert (tmp_path / "signals").stat().st_size == 2 * SLOTS * 8
    # a folder removed and made again: the process maps the new file, not the old one
    signals.changed(INDEX, "acme")
    (tmp_path / "signals").unlink()
    again = Signals.of(tmp_path)
    assert again is not signals and again.read(INDEX, "acme") == 0


@pytest.mark.sqlite_only
def test_a_default_search_with_nothing_changed_reads_no_file_and_no_sql(make_app, monkeypatch):
    from service.readindex import reader
    from service.store.sqlite import maintenance
    from service.store.sqlite.connections import Db
    monkeypatch.setattr(maintenance, "IN_FLIGHT_MS", 0)      # a pass takes every unit (none counts as in flight)
    app = make_app(replica_debounce_ms=0)
    client = app.test_client()

    def push(text):
        rv = client.post("/mcp/push", json=make_unit(text))
        assert rv.status_code == 200
        return rv.get_json()["cid"]

    def search(q):
        rv = client.post("/mcp/search", json={"query": q})
        assert rv.status_code == 200
        return [r["cid"] for r in rv.get_json()["results"]]

    first = push("a petrel over the harbour")
    drain(app)
    assert search("petrel") == [first]                       # the view, the state and the tail looked up
    looked, read = [], []
    signature, db_read = reader.signature, Db.read
    monkeypatch.setattr(reader, "signature", lambda path: looked.append(path) or signature(path))
    monkeypatch.setattr(Db, "read", lambda self, fn, *a, **k: read.append(self.path.name) or db_read(self, fn, *a, **k))
    for _ in range(5):
        assert search("petrel") == [first]
    assert looked == [] and read == []
    # A push commits to the catalog: the next search reads the tail again, and finds the new unit there.
    second = push("a second petrel, not indexed yet")
    assert sorted(search("petrel")) == sorted([first, second])
    assert "catalog.db" in read and looked == []
    read.clear()
    # (the unit the index lacks is read from its day's file by every search until the index has it)
    assert sorted(search("petrel")) == sorted([first, second]) and "catalog.db" not in read
    # The leader's pass commits the read index and writes its state: the next search looks at the files.
    drain(app)
    assert sorted(search("petrel")) == sorted([first, second]) and looked
    looked.clear()
    assert sorted(search("petrel")) == sorted([first, second]) and looked == []


def test_a_delete_leaves_every_workers_searches_at_once(live_server_factory):
    """Each worker keeps what it read of the catalog (units' expiries) until the catalog's change number moves:
    a delete made through one worker leaves the very next search of either, each over a new connection."""
    server = live_server_factory(workers=2)
    url = server.url
    cid = requests.post(f"{url}/mcp/push", json=make_unit("a skua chasing terns"), timeout=10).json()["cid"]
    deadline = time.time() + 60
    while time.time() < deadline:                            # in the read index (each worker's cache of it)
        body = requests.post(f"{url}/mcp/search", json={"query": "skua"}, timeout=10).json()
        if body["freshness"]["index_pending"] == 0 and [r["cid"] for r in body["results"]] == [cid]:
            break
        time.sleep(0.2)
    for _ in range(20):                                      # new connections: both workers answer some
        body = requests.post(f"{url}/mcp/search", json={"query": "skua"}, timeout=10).json()
        assert [r["cid"] for r in body["results"]] == [cid]
    assert requests.delete(f"{url}/mcp/units/{cid}", timeout=10).status_code == 200
    for _ in range(20):
        assert requests.post(f"{url}/mcp/search", json={"query": "skua"}, timeout=10).json()["results"] == []
