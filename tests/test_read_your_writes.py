"""Read-your-writes by default (issue 14, item 4): a unit acknowledged to a tenant is found by that
tenant's next default search, without ``consistency: strong``, although the read index only gets it
at the leader's next pass; a deleted unit leaves default searches at once."""
import json
import time

import pytest
import requests

from conftest import drain, make_unit, replayed
from service.state import app_state

# The same contract on both storage backends (issue 18; tests/conftest.py): on PostgreSQL the replica is
# a streaming standby, and the tests that look inside SQLite's read index run on SQLite only.
BACKENDS = ("sqlite", "postgresql")


# Every pass of the leader commits the read index (no debounce between a test's passes).
INDEX_NOW = {"replica_debounce_ms": 0}


def push(client, content, **kw) -> str:
    rv = client.post("/mcp/push", json=make_unit(content, **kw))
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()["cid"]


def search(client, query, **extra) -> dict:
    rv = client.post("/mcp/search", json={"query": query, "top_k": 20} | extra)
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()


def cids(body) -> list[str]:
    return [r["cid"] for r in body["results"]]


def sent_to_index(app) -> None:
    """Everything so far in the read index, and the leader's state written (on PostgreSQL: indexed, and
    replayed by the standby that default searches read)."""
    drain(app)
    store = app_state(app).store
    if replayed(app):
        return
    assert store.searcher.view(store.tenant("default")) is not None


@pytest.fixture
def app(make_app):
    return make_app(**INDEX_NOW)


@pytest.fixture
def client(app):
    return app.test_client()


def test_pushed_unit_is_found_by_the_next_default_search(app, client):
    for i in range(30):
        push(client, f"old note {i} about the harbour")
    sent_to_index(app)
    new = push(client, "the walrus ate the harbour master's lunch")
    body = search(client, "walrus")      # not indexed, not sent: the search reads it from the primaries
    assert cids(body) == [new]
    assert body["freshness"] == {"replica_lag_ms": 0, "index_pending": 0}
    # ranked with the rest: the new unit among the read index's answers, scored on the same scale
    both = search(client, "walrus harbour")
    strong = search(client, "walrus harbour", consistency="strong")
    assert cids(both)[0] == new and len(both["results"]) == 20
    assert cids(both) == cids(strong)
    # the read index's statistics lack the one new unit: scores agree with the primaries' to a hair
    for a, b in zip(both["results"], strong["results"]):
        assert a["bm25_score"] == pytest.approx(b["bm25_score"], rel=0.05)


def test_read_your_writes_off_misses_the_new_unit(make_app):
    """The same sequence with the feature off: the read index alone does not have it (the test above
    would fail without read-your-writes)."""
    app = make_app(**INDEX_NOW, read_your_writes_ms=0)
    client = app.test_client()
    push(client, "an old harbour note")
    sent_to_index(app)
    push(client, "the walrus ate the harbour master's lunch")
    time.sleep(0.05)
    body = search(client, "walrus")
    assert cids(body) == [] and body["freshness"]["index_pending"] == 1
    assert body["freshness"]["replica_lag_ms"] >= 50


@pytest.mark.sqlite_only
def test_indexed_but_not_sent_and_changed_units(app, client):
    old = push(client, "kestrel sighting at the ridge", metadata={"v": 1})
    sent_to_index(app)
    # in FTS5 (the indexer ran) but not in the read index (no pass yet)
    maint = app_state(app).maintenance
    store = app_state(app).store
    ts = int(time.time())        # one timestamp for both pushes: the same unit, a second apart or not
    new = push(client, "kestrel nest on the cliff", timestamp=ts)
    maint.index_tenant(store.tenant("default"))
    assert set(cids(search(client, "kestrel"))) == {old, new}
    # a duplicate push that changes metadata: the result carries the primaries' fields at once
    rv = client.post("/mcp/push", json=make_unit("kestrel nest on the cliff", timestamp=ts, metadata={"v": 2}))
    assert rv.status_code == 200 and rv.get_json()["status"] == "duplicate"
    found = {r["cid"]: r for r in search(client, "kestrel nest")["results"]}
    assert found[new]["metadata"] == {"v": 2}


def test_operator_and_with_a_term_only_the_new_unit_holds(app, client):
    push(client, "alpha report for the quarter")
    sent_to_index(app)
    new = push(client, "alpha zephyrine report")
    assert cids(search(client, "alpha zephyrine", operator="and")) == [new]
    assert cids(search(client, "zephyrine")) == [new]


def test_deleted_unit_leaves_default_search_at_once(app, client):
    keep = push(client, "ledger entry one")
    gone = push(client, "ledger entry two")
    sent_to_index(app)
    assert set(cids(search(client, "ledger"))) == {keep, gone}
    assert client.delete(f"/mcp/units/{gone}").status_code == 200
    # the read index still holds it until the next pass; the search drops it by the catalog
    assert cids(search(client, "ledger")) == [keep]
    sent_to_index(app)
    assert cids(search(client, "ledger")) == [keep]


def test_deleted_units_make_room_for_the_next_best(app, client):
    units = [push(client, "gannet " * (10 - i) + f"colony {i}") for i in range(8)]
    sent_to_index(app)
    top3 = cids(search(client, "gannet", top_k=3))
    assert top3 == units[:3]
    for cid in units[:3]:
        assert client.delete(f"/mcp/units/{cid}").status_code == 200
    assert cids(search(client, "gannet", top_k=3)) == units[3:6]


def test_large_backlog_is_reported_not_read(make_app):
    """Past read_your_writes_max units behind, a default search reads the index alone and says so."""
    app = make_app(**INDEX_NOW, read_your_writes_max=3)
    client = app.test_client()
    push(client, "osprey one")
    sent_to_index(app)
    for i in range(5):
        push(client, f"osprey later {i}")
    body = search(client, "osprey")
    assert len(body["results"]) == 1 and body["freshness"]["index_pending"] == 5
    assert len(search(client, "osprey", consistency="strong")["results"]) == 6


@pytest.mark.sqlite_only
def test_state_low_water_mark(app, client):
    for i in range(3):
        push(client, f"heron {i}")
    sent_to_index(app)
    store = app_state(app).store
    from service.readindex.schema import index_dir
    state = json.loads((index_dir(store.root, "default") / "state.json").read_text())
    # every unit is in the index, but the last few seconds' units count as possibly in flight
    assert state["seq"] == 3 and state["backlog"] == 0
    assert 0 <= state["low"] <= 4


def test_live_server_push_then_search(live_server_factory, backend):
    """Two workers, background indexing on: each unit pushed through one request is found by the
    very next default search (which may land on the other worker), and a delete leaves at once
    (on PostgreSQL the default searches read the standby)."""
    server = live_server_factory(workers=2)
    url = server.url
    s = requests.Session()
    s.post(f"{url}/mcp/push", json=make_unit("warm up the store"), timeout=10).raise_for_status()
    fmt = server.data_dir / "tenants" / "default" / "replica" / "index" / "format.json"
    deadline = time.time() + 60
    while backend == "sqlite" and time.time() < deadline:   # the read index built: default searches read it
        if fmt.exists() and json.loads(fmt.read_text()).get("ready"):
            break
        time.sleep(0.2)
    assert backend != "sqlite" or json.loads(fmt.read_text())["ready"]
    misses = []
    for i in range(40):
        word = f"zq{i:03d}marker"
        cid = s.post(f"{url}/mcp/push", json=make_unit(f"note {word} number {i}"), timeout=10).json()["cid"]
        body = s.post(f"{url}/mcp/search", json={"query": word}, timeout=10).json()
        if [r["cid"] for r in body["results"]] != [cid]:
            misses.append((i, body))
        if i % 10 == 9:
            assert s.delete(f"{url}/mcp/units/{cid}", timeout=10).status_code == 200
            after = s.post(f"{url}/mcp/search", json={"query": word}, timeout=10).json()
            assert after["results"] == [], after
    assert misses == []


@pytest.mark.sqlite_only
def test_default_search_reads_pending_units_without_indexing_them(app, client):
    """Units still waiting for the indexer are tokenized by the search (once per process) but stay
    pending: a search never writes, the indexer does that work."""
    push(client, "a tern at the pier")
    sent_to_index(app)
    new = [push(client, f"tern flock number {i}") for i in range(5)]
    store = app_state(app).store
    t = store.tenant("default")
    assert set(cids(search(client, "flock"))) == set(new)
    from service.store.sqlite.queries import sql
    day = t.live_days()[-1]
    assert t.shard(day).read(lambda c: c.execute(sql("pending_count")).fetchone()[0]) == 5
    assert len(store.searcher.tokens._items) == 5       # made once, reused by the next search
    # ... and stored in the rows, for the other workers and the indexer
    assert t.shard(day).read(lambda c: c.execute(
        "SELECT count(*) FROM units WHERE indexed = 0 AND tokens IS NOT NULL").fetchone()[0]) == 5
    assert set(cids(search(client, "tern flock"))) >= set(new)
    assert len(store.searcher.tokens._items) == 5
    sent_to_index(app)
    assert set(cids(search(client, "flock"))) == set(new)
    assert t.shard(day).read(lambda c: c.execute(sql("pending_count")).fetchone()[0]) == 0


def test_pending_units_past_the_time_budget_are_reported(make_app):
    app = make_app(**INDEX_NOW, read_your_writes_ms=1)
    client = app.test_client()
    push(client, "plover")
    sent_to_index(app)
    batch = [make_unit(f"plover chick {i} " + "sand dune shore " * 200) for i in range(400)]
    assert client.post("/mcp/push", json={"units": batch}).status_code == 200
    body = search(client, "plover")
    # what it had no time to read is said, not hidden
    assert body["freshness"]["index_pending"] > 0 and body["freshness"]["replica_lag_ms"] >= 0
    assert len(body["results"]) + body["freshness"]["index_pending"] >= 20



def test_the_unit_just_pushed_is_read_first_when_the_budget_is_short(make_app):
    """Behind a queue longer than read_your_writes_ms can tokenize, the search reads the queue newest first:
    the unit the caller just pushed is found at once, the older ones wait for the indexer (which takes the
    queue oldest first) and are said to be pending. (Oldest first, the budget ran out long before it.)"""
    app = make_app(**INDEX_NOW, read_your_writes_ms=300)
    client = app.test_client()
    push(client, "an indexed gannet note")
    sent_to_index(app)
    filler = ("gannet cliff colony 海鸟 " * 10_000)[:200_000]
    batch = [make_unit(f"gannet {i} " + filler) for i in range(30)]        # ~6 MB queued: seconds of tokenizing
    assert client.post("/mcp/push", json={"units": batch}).status_code == 200
    newest = push(client, "the kittiwake nests below the gannets")
    body = search(client, "kittiwake")
    assert cids(body) == [newest]
    assert body["freshness"]["index_pending"] > 0                           # the rest: said, not hidden

def test_token_cache_is_bounded():
    from service.ranking.tail import TokenCache
    cache = TokenCache(max_bytes=100)
    for i in range(50):
        cache.put("t", "2026-01-01", i, f"{i:012x}", ["word"] * 3)
    assert cache.bytes <= 100 and cache.get("t", "2026-01-01", 49, f"{49:012x}") is not None
    assert cache.get("t", "2026-01-01", 0, f"{0:012x}") is None


@pytest.mark.sqlite_only
def test_nothing_indexed_yet_and_tokens_stored_by_an_earlier_search(app, client):
    """Found by the issue 18 helper: on a tenant with nothing indexed, a unit whose tokens an earlier
    search stored (pending, tokens in the row) must still be found by the next searches, AND too."""
    new = [push(client, f"heron egret {i}") for i in range(3)] + [push(client, "heron alone")]
    assert set(cids(search(client, "heron"))) == set(new)            # makes and stores the tokens
    store = app_state(app).store
    t = store.tenant("default")
    from service.store.sqlite.queries import sql
    day = t.live_days()[-1]
    assert t.shard(day).read(lambda c: c.execute(
        "SELECT count(*) FROM units WHERE indexed = 0 AND tokens IS NOT NULL").fetchone()[0]) == 4
    assert t.shard(day).read(lambda c: c.execute(sql("pending_count")).fetchone()[0]) == 4
    assert set(cids(search(client, "heron"))) == set(new)
    assert set(cids(search(client, "heron egret", operator="and"))) == set(new[:3])
    # scored as the tokens the search made in this process would be: the same scores both times
    first = {r["cid"]: r["bm25_score"] for r in search(client, "egret")["results"]}
    store.searcher.tokens._items.clear()      # (only the rows hold them now)
    assert {r["cid"]: r["bm25_score"] for r in search(client, "egret")["results"]} == first


class Interleave:
    """Runs ``step`` once, right after the search's n-th read of a day file: another worker's search
    storing tokens, the indexer, or the leader's pass moving a row on while the search reads it."""

    def __init__(self, monkeypatch, n: int, step):
        from service.store.sqlite.connections import Db
        self.n, self.step, self.reads, self.done = n, step, 0, False
        original = Db.read
        hook = self

        def read(db, fn, *args, **kwargs):
            result = original(db, fn, *args, **kwargs)
            if not hook.done and db.path.parent.name == "primary":
                hook.reads += 1
                if hook.reads == hook.n:
                    hook.done = True
                    hook.step()
            return result
        monkeypatch.setattr(Db, "read", read)


@pytest.mark.sqlite_only
@pytest.mark.parametrize("indexed_before", [False, True], ids=["primaries", "read-index"])
@pytest.mark.parametrize("step_name", ["tokens", "index", "send"])
def test_a_row_moving_on_during_the_search_is_found(make_app, tmp_path, monkeypatch, indexed_before, step_name):
    """Each read of a unit's row sees one of its states (no tokens, tokens stored by a search, in FTS5,
    sent to the read index); whichever read of the search it moves on after, the search finds it."""
    found_at = []
    for n in range(1, 12):
        data = tmp_path / f"d{n}"
        app = make_app(**INDEX_NOW, data_dir=data)
        client = app.test_client()
        if indexed_before:
            push(client, "an older note about gulls")
            sent_to_index(app)
        new = push(client, "a shearwater over the bay")
        other = make_app(**INDEX_NOW, data_dir=data)        # another worker on the same files
        maint = app_state(app).maintenance
        t = app_state(app).store.tenant("default")
        steps = {"tokens": lambda other=other: search(other.test_client(), "shearwater"),
                 "index": lambda maint=maint, t=t: maint.index_tenant(t),
                 "send": lambda maint=maint: maint.run_once()}
        with monkeypatch.context() as m:
            hook = Interleave(m, n, steps[step_name])
            body = search(client, "shearwater")
        assert cids(body) == [new], (n, step_name, body)
        found_at.append(hook.done)
    assert any(found_at)     # the step did land inside some searches' reads


@pytest.mark.sqlite_only
def test_a_view_older_than_the_leaders_state_is_not_trusted(app, client, monkeypatch):
    """A worker that cannot load the leader's last commit (a reload fails) must not read the tail from
    that pass's low-water mark against its old view, which lacks the units below it: the primaries answer."""
    from service.store.sqlite import maintenance
    from service.readindex.reader import Reader
    monkeypatch.setattr(maintenance, "IN_FLIGHT_MS", 0)      # nothing counts as in flight
    push(client, "an older note about gulls")
    sent_to_index(app)
    assert cids(search(client, "gulls"))                      # this process's view loaded
    monkeypatch.setattr(Reader, "_load", lambda self, sig: None)   # every reload fails
    new = push(client, "a shearwater over the bay")
    sent_to_index(app)
    store = app_state(app).store
    state = store.searcher.readers.state("default")
    assert state["low"] > state["seq"] - 1 and state["backlog"] == 0     # the leader: all in, none in flight
    assert cids(search(client, "shearwater")) == [new]
