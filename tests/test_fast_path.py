"""The fast path of a default search (issue 42, docs/design.md §11): what a search depends on but does not
ask for (the leader's state, the read index's latest commit, the catalog's read-your-writes tail and
expiries) is read again only when a change number says it changed (service/change_numbers.py), and every process
of the data folder sees each change at once."""
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from conftest import drain, make_unit
from workers import worker_pids

BACKENDS = ("sqlite", "postgresql")


def test_a_change_number_set_by_one_process_is_seen_by_another(tmp_path):
    from service.change_numbers import CATALOG, INDEX, SLOTS, ChangeNumbers
    numbers = ChangeNumbers.of(tmp_path)
    assert ChangeNumbers._offset(CATALOG, "acme") != ChangeNumbers._offset(CATALOG, "globex")     # (not one shared slot)
    before = {(k, t): numbers.read(k, t) for k in (INDEX, CATALOG) for t in ("acme", "globex")}
    subprocess.run([sys.executable, "-c", "import sys; from service.change_numbers import CATALOG, ChangeNumbers; "
                    "ChangeNumbers(sys.argv[1]).bump(CATALOG, 'acme')", str(tmp_path)], check=True, timeout=60)
    after = {(k, t): numbers.read(k, t) for k in (INDEX, CATALOG) for t in ("acme", "globex")}
    assert after[(CATALOG, "acme")] != before[(CATALOG, "acme")]
    assert {k: v for k, v in after.items() if k != (CATALOG, "acme")} == \
           {k: v for k, v in before.items() if k != (CATALOG, "acme")}
    assert (tmp_path / "signals").stat().st_size == (1 + 2 * SLOTS) * 8


def _look_now(numbers) -> None:
    numbers._checked = float("-inf")           # (as CHECK_S later: the next read or write looks at the file)


def test_a_change_set_in_a_removed_file_is_set_again_in_the_new_one(tmp_path, caplog):
    """Two processes (two views of one folder): the file is removed; a process started since makes a new file
    and reads from it. The older one, which set a change into the file before it was removed, looks before its
    next write: it moves to the new file, sets its change again there, and distrusts the numbers for DISTRUST_S
    (its reads differ each time: the slow path)."""
    from service.change_numbers import CATALOG, INDEX, ChangeNumbers
    older = ChangeNumbers(tmp_path)
    older.bump(CATALOG, "acme")
    (tmp_path / "signals").unlink()
    newer = ChangeNumbers(tmp_path)
    seen = newer.read(CATALOG, "acme")                      # a new file, made by the newer process
    assert seen == newer.read(CATALOG, "acme")
    older.bump(INDEX, "acme")                            # (a write looks first)
    assert newer.read(CATALOG, "acme") != seen              # the change before the removal set again
    assert older.read(CATALOG, "acme") != older.read(CATALOG, "acme")    # distrusted for a while
    assert "not the file this process read" in caplog.text


@pytest.mark.parametrize("damage", ["unlink", "replace", "unopenable"])
def test_a_change_after_a_move_reaches_a_process_that_has_not_looked_yet(tmp_path, damage):
    """A process looks at the file at most every CHECK_S before a read, but before every write: a writer moves at
    once and, for DISTRUST_S, sets its changes in the file it left too, where a reader that looked just before the
    damage still reads (CI saw that reader answer from a view the leader had replaced, its number unchanged)."""
    from service.change_numbers import INDEX, ChangeNumbers
    writer, reader = ChangeNumbers(tmp_path), ChangeNumbers(tmp_path)
    seen = reader.read(INDEX, "acme")                       # (both looked just now)
    writer.read(INDEX, "acme")
    path = tmp_path / "signals"
    if damage == "replace":
        path.with_name("signals.new").write_bytes(os.urandom(path.stat().st_size))
        os.replace(path.with_name("signals.new"), path)
    else:
        path.unlink()
        if damage == "unopenable":
            path.mkdir()
    _look_now(writer)
    writer.read(INDEX, "acme")                              # the writer has moved (or found no file to use)
    writer.bump(INDEX, "acme")
    assert reader._checked > float("-inf") and reader.read(INDEX, "acme") != seen     # (it has not looked yet)
    if damage != "unopenable":
        newer = ChangeNumbers(tmp_path)                           # a process started since: the file the path names
        number = newer.read(INDEX, "acme")
        writer.bump(INDEX, "acme")
        assert newer.read(INDEX, "acme") != number


def test_a_write_looks_at_the_file_first(tmp_path):
    """A writer that looked just before the file was replaced sets its change in the new file, where a process
    started since reads (before: into the old file, unseen there for up to CHECK_S)."""
    from service.change_numbers import INDEX, ChangeNumbers
    writer = ChangeNumbers(tmp_path)
    writer.read(INDEX, "acme")
    path = tmp_path / "signals"
    path.with_name("signals.new").write_bytes(os.urandom(path.stat().st_size))
    os.replace(path.with_name("signals.new"), path)
    newer = ChangeNumbers(tmp_path)
    number = newer.read(INDEX, "acme")
    writer.bump(INDEX, "acme")
    assert newer.read(INDEX, "acme") != number


@pytest.mark.parametrize("damage", ["truncate", "zero"])
def test_a_truncated_or_zeroed_file_never_faults_and_is_filled_anew(tmp_path, damage):
    """Read with pread, a short file answers fewer bytes (a mapping faulted: SIGBUS); the next look fills it anew
    under a new identity, which every process then takes up (and distrusts for a while)."""
    from service.change_numbers import CATALOG, INDEX, SIZE, ChangeNumbers
    one, two = ChangeNumbers(tmp_path), ChangeNumbers(tmp_path)
    one.bump(INDEX, "acme")
    before = two.read(INDEX, "acme")
    path = tmp_path / "signals"
    if damage == "truncate":
        os.truncate(path, 0)
    else:
        path.write_bytes(b"\0" * path.stat().st_size)      # (in place: the same file, all zeros)
    values = {two.read(INDEX, "acme") for _ in range(3)}     # no fault; a number that says "changed"
    assert before not in values
    one.bump(CATALOG, "acme")                            # a write past the end never faults either
    _look_now(one)
    _look_now(two)
    assert one.read(INDEX, "acme") != one.read(INDEX, "acme")             # both distrust it for a while
    assert path.stat().st_size == SIZE and path.read_bytes()[:8] != b"\0" * 8


def test_a_path_that_cannot_be_opened_leaves_searches_on_the_slow_path(tmp_path, caplog):
    from service.change_numbers import INDEX, ChangeNumbers
    (tmp_path / "signals").mkdir()                          # (a folder where the file should be)
    numbers = ChangeNumbers(tmp_path)
    assert numbers.read(INDEX, "acme") != numbers.read(INDEX, "acme")
    numbers.bump(INDEX, "acme")                          # nothing to write to, no error
    assert "cannot use" in caplog.text and caplog.text.count("cannot use") == 1
    (tmp_path / "signals").rmdir()
    _look_now(numbers)
    numbers.read(INDEX, "acme")
    assert (tmp_path / "signals").is_file()                 # usable again at the next look


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


# --- issue 50, M1: the change-numbers file damaged while serving ------------------------------------------
def _zero(path):
    with open(path, "r+b") as fh:                           # in place: the same file, all zeros
        fh.write(b"\0" * os.fstat(fh.fileno()).st_size)


def _replace(path):
    path.with_name("signals.new").write_bytes(os.urandom(path.stat().st_size))
    os.replace(path.with_name("signals.new"), path)


DAMAGE = {"delete": lambda p: p.unlink(), "truncate": lambda p: os.truncate(p, 0), "replace": _replace,
          "zero": _zero, "unopenable": lambda p: (p.unlink(), p.mkdir())}


def _heron_cids(url: str) -> tuple[set, int]:
    rv = requests.post(f"{url}/mcp/search", json={"query": "heron", "top_k": 50}, timeout=30)
    assert rv.status_code == 200, rv.text
    return {r["cid"] for r in rv.json()["results"]}, rv.json()["freshness"]["index_pending"]


def _every_search_finds(url: str, expected: set, timeout: float = 20) -> None:
    """Searches over new connections (both workers answer some) find ``expected``, soon and from then on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found, pending = _heron_cids(url)
        if found == expected and not pending:
            break
        time.sleep(0.2)
    assert [_heron_cids(url)[0] == expected for _ in range(30)] == [True] * 30


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_change_numbers_file_damaged_while_serving(live_server_factory, damage):
    """data/signals removed, truncated, replaced, zeroed or made unopenable while two workers serve, then one
    worker replaced (SIGTERM): 3 units forgotten and 3 pushed are seen by every search within seconds, with no
    5xx (before: the surviving worker kept the old file for ever and answered with forgotten units; a truncated
    file killed every process with SIGBUS; an unopenable one made searches, pushes and /readyz answer 500)."""
    from service.change_numbers import CHECK_S
    server = live_server_factory(workers=2)
    url = server.url
    push = lambda text: requests.post(f"{url}/mcp/push", json=make_unit(text), timeout=30).json()["cid"]  # noqa: E731
    cids = [push(f"a heron by the weir {i}") for i in range(6)]
    _every_search_finds(url, set(cids), timeout=60)
    DAMAGE[damage](server.data_dir / "signals")
    damaged = time.monotonic()
    before = worker_pids(server.proc.pid)
    os.kill(before[0], signal.SIGTERM)
    deadline = time.monotonic() + 60
    while (before[0] in worker_pids(server.proc.pid) or len(worker_pids(server.proc.pid)) < 2) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert before[0] not in worker_pids(server.proc.pid)
    for cid in cids[:3]:
        assert requests.delete(f"{url}/mcp/units/{cid}", timeout=30).status_code == 200
    fresh = [push(f"a heron on the bank {i}") for i in range(3)]
    # The bound is CHECK_S: a process that looked just before the damage trusts its copy that long, and a change
    # made meanwhile by a process that never read that file (the new worker) cannot reach it there.
    time.sleep(max(0.0, damaged + CHECK_S + 0.05 - time.monotonic()))
    _every_search_finds(url, set(cids[3:] + fresh))
    assert requests.get(f"{url}/readyz", timeout=30).status_code == 200
    assert set(worker_pids(server.proc.pid)) & set(before) == {before[1]}     # (no worker died on its own)
