"""Project scopes in search (docs/design.md §3, §4): a search with ``project`` sees the units whose
``metadata.project`` is that project and the units marked global (``metadata.global`` true), on every path a
search can take (the units just pushed, the read index, strong reads, no read index), on both stores; the keys
are derived at push time (service/unitkeys.py) and follow a re-push; shards and databases stored before the
keys existed get theirs when they are upgraded."""
import shutil

import pytest

from conftest import assert_error, drain, make_unit, replayed
from service.unitkeys import MAX_PROJECT_CHARS, derive, derive_text
from service.state import app_state

BACKENDS = ("sqlite", "postgresql")
INDEX_NOW = {"replica_debounce_ms": 0}

# what each unit's metadata says, and the projects a search must see it from
UNITS = {
    "alpha": ({"project": "/src/alpha"}, {"/src/alpha"}),
    "alpha2": ({"project": "/src/alpha", "global": False}, {"/src/alpha"}),
    "beta": ({"project": "/src/beta"}, {"/src/beta"}),
    "shared": ({"global": True}, {"/src/alpha", "/src/beta", "/src/gamma"}),
    "shared_beta": ({"project": "/src/beta", "global": True}, {"/src/alpha", "/src/beta", "/src/gamma"}),
    "none": (None, set()),
    "number": ({"project": 7}, set()),                       # not a string: in no project
    "string_true": ({"project": "/src/gamma", "global": "true"}, {"/src/gamma"}),   # "true" is not true
}
PROJECTS = ("/src/alpha", "/src/beta", "/src/gamma")


def push_all(client, word: str, tag: str = "") -> dict:
    """Each unit of UNITS holding ``word``: name -> cid."""
    out = {}
    for name, (meta, _) in UNITS.items():
        extra = {} if meta is None else {"metadata": meta}
        rv = client.post("/mcp/push", json=make_unit(f"{word} note {name} {tag}", **extra))
        assert rv.status_code == 200, rv.get_json()
        out[name] = rv.get_json()["cid"]
    return out


def found(client, query: str, **extra) -> set:
    rv = client.post("/mcp/search", json={"query": query, "top_k": 50, **extra})
    assert rv.status_code == 200, rv.get_json()
    return {r["cid"] for r in rv.get_json()["results"]}


def assert_scoped(client, word: str, cids: dict, **extra) -> None:
    everything = set(cids.values())
    assert found(client, word, **extra) == everything          # without a project: nothing changes
    for project in PROJECTS:
        want = {cids[name] for name, (_, seen) in UNITS.items() if project in seen}
        assert found(client, word, project=project, **extra) == want, (project, extra)
    assert found(client, word, project="/src/none", **extra) == {cids["shared"], cids["shared_beta"]}


def index_answers(app) -> bool:
    """Whether default searches of this app read its read index now (the path the assertions mean)."""
    store = app_state(app).store
    if hasattr(store.searcher, "reads"):                # PostgreSQL: the node's read index for the tenant
        return store.readers.view("default") is not None
    return store.searcher.view(store.tenant("default")) is not None


@pytest.fixture
def app(make_app):
    return make_app(**INDEX_NOW)


@pytest.fixture
def client(app):
    return app.test_client()


def test_the_keys_are_derived_by_one_rule():
    assert derive(None) == derive({}) == {"project": None, "is_global": False}
    assert derive({"project": "/a", "global": True}) == {"project": "/a", "is_global": True}
    for not_a_project in (7, "", "a\nb", "a\x85b", "x" * (MAX_PROJECT_CHARS + 1), ["/a"], None, "\ud800"):
        assert derive({"project": not_a_project})["project"] is None, not_a_project
    for not_true in ("true", 1, "yes", None):
        assert derive({"global": not_true})["is_global"] is False
    assert derive_text('{"project":"/a","global":true}') == {"project": "/a", "is_global": True}
    assert derive_text("[1]") == derive_text("not json") == derive_text(None) == derive(None)


def test_two_projects_see_their_own_units_and_the_global_ones_on_every_path(app, client):
    cids = push_all(client, "heron")
    assert_scoped(client, "heron", cids)                     # just pushed: read-your-writes
    assert_scoped(client, "heron", cids, consistency="strong")
    drain(app)
    replayed(app)
    assert index_answers(app)
    assert_scoped(client, "heron", cids)                     # the read index
    assert_scoped(client, "heron", cids, consistency="strong")
    # beside units the read index holds, new ones read from the store
    more = push_all(client, "heron", "again")
    for project in PROJECTS:
        want = {c[name] for c in (cids, more) for name, (_, seen) in UNITS.items() if project in seen}
        assert found(client, "heron", project=project) == want


def test_without_a_read_index_the_store_filters_alike(make_app):
    app = make_app(replicas=False)
    client = app.test_client()
    cids = push_all(client, "plover")
    assert_scoped(client, "plover", cids)
    drain(app)
    replayed(app)
    assert not index_answers(app)
    assert_scoped(client, "plover", cids)


def test_a_re_push_moves_a_unit_between_projects(app, client, backend):
    """Metadata is a mutable field (a re-push changes it): strong searches follow at once, default searches on
    PostgreSQL at once (re-pushed units are part of its tail) and on SQLite at the read index's next pass, as
    for the other mutable fields (docs/design.md §6.2)."""
    unit = make_unit("kestrel over the ridge", metadata={"project": "/src/alpha"})
    cid = client.post("/mcp/push", json=unit).get_json()["cid"]
    drain(app)
    replayed(app)
    assert found(client, "kestrel", project="/src/alpha") == {cid}
    for metadata, alpha, beta in (({"project": "/src/beta"}, set(), {cid}),
                                  ({"project": "/src/beta", "global": True}, {cid}, {cid}),
                                  ({}, set(), set())):
        rv = client.post("/mcp/push", json={**unit, "metadata": metadata})
        assert rv.get_json()["status"] == "duplicate"
        at_once = ("strong", "replica") if backend == "postgresql" else ("strong",)
        for consistency in at_once:
            assert found(client, "kestrel", project="/src/alpha", consistency=consistency) == alpha, metadata
            assert found(client, "kestrel", project="/src/beta", consistency=consistency) == beta, metadata
        drain(app)
        replayed(app)
        for consistency in ("strong", "replica"):
            assert found(client, "kestrel", project="/src/alpha", consistency=consistency) == alpha, metadata
            assert found(client, "kestrel", project="/src/beta", consistency=consistency) == beta, metadata


def test_the_other_doors_take_the_project(app, client):
    cids = push_all(client, "egret")
    drain(app)
    replayed(app)
    alpha = {cids["alpha"], cids["alpha2"], cids["shared"], cids["shared_beta"]}
    rv = client.get("/mcp/search", query_string={"q": "egret", "project": "/src/alpha", "top_k": 50})
    assert {r["cid"] for r in rv.get_json()["results"]} == alpha
    rv = client.post("/mcp/context", json={"query": "egret", "project": "/src/alpha"})
    assert {i["cid"] for i in rv.get_json()["items"]} == alpha
    rv = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                   "params": {"name": "context_search",
                                              "arguments": {"query": "egret", "project": "/src/alpha", "top_k": 50}}},
                     headers={"MCP-Protocol-Version": "2025-11-25"})
    assert {r["cid"] for r in rv.get_json()["result"]["structuredContent"]["results"]} == alpha


@pytest.mark.parametrize("value", ["", 5, ["/a"], "a\x00b", "a\tb", "x" * (MAX_PROJECT_CHARS + 1), True])
def test_a_bad_project_is_refused_and_changes_nothing(client, value):
    assert_error(client.post("/mcp/search", json={"query": "x", "project": value}), 400, "invalid_field", "project")
    assert_error(client.post("/mcp/context", json={"query": "x", "project": value}), 400, "invalid_field", "project")


def test_a_lone_surrogate_project_is_a_400(client):
    rv = client.post("/mcp/search", data=b'{"query": "x", "project": "\\ud800"}', content_type="application/json")
    assert rv.status_code == 400


V2_UNITS = ("id INTEGER PRIMARY KEY, cid TEXT NOT NULL UNIQUE, seq INTEGER NOT NULL, type TEXT NOT NULL, "
            "source TEXT NOT NULL, timestamp INTEGER NOT NULL, ttl INTEGER NOT NULL, expires_at INTEGER NOT NULL, "
            "content TEXT NOT NULL, metadata TEXT, parent_cid TEXT, pushed_ms INTEGER NOT NULL, "
            "indexed INTEGER NOT NULL DEFAULT 0, ntok INTEGER NOT NULL DEFAULT 0, tokens TEXT")
V2_COLUMNS = ", ".join(column.split()[0] for column in V2_UNITS.split(", "))


@pytest.mark.sqlite_only
def test_shards_stored_before_the_keys_get_them_when_opened(make_app, tmp_path):
    """A day file of schema version 2 (no keys) is migrated when opened: its rows get the keys their metadata
    gives, and the read index, of the previous format, is built again with them."""
    import sqlite3
    data = tmp_path / "data"
    app = make_app(data_dir=data, **INDEX_NOW)
    cids = push_all(app.test_client(), "avocet")
    drain(app)
    app_state(app).shutdown()
    tenant = data / "tenants" / "default"
    for shard in (tenant / "primary").glob("*.db"):
        with sqlite3.connect(shard) as c:       # the units table as schema version 2 made it
            c.execute(f"CREATE TABLE units_v2 ({V2_UNITS})")
            c.execute(f"INSERT INTO units_v2 SELECT {V2_COLUMNS} FROM units")
            c.execute("DROP TABLE units")
            c.execute("ALTER TABLE units_v2 RENAME TO units")
            c.execute("UPDATE meta SET value = 2 WHERE key = 'schema_version'")
    shutil.rmtree(tenant / "replica" / "index")
    again = make_app(data_dir=data, **INDEX_NOW)
    client = again.test_client()
    assert_scoped(client, "avocet", cids, consistency="strong")
    assert_scoped(client, "avocet", cids)          # no read index yet: the migrated files answer
    drain(again)
    assert index_answers(again)
    assert_scoped(client, "avocet", cids)          # the read index built again from them


@pytest.mark.postgresql_only
def test_a_version_3_database_gets_the_keys_at_start(make_app, tmp_path):
    """A database of schema version 3 (no keys) is upgraded by the first node that starts on it: the units,
    their queue rows and their term rows get the keys their metadata gives."""
    app = make_app(**INDEX_NOW)
    client = app.test_client()
    cids = push_all(client, "avocet")
    drain(app)
    queued = push_all(client, "avocet", "queued")   # still queued for the indexer at the upgrade
    store = app_state(app).store

    def as_version_3(c):
        for table in ("units", "pending", "unit_terms"):
            c.execute(f"ALTER TABLE {table} DROP COLUMN project, DROP COLUMN is_global")
        c.execute("UPDATE cms_meta SET value = 3 WHERE key = 'schema_version'")
    store.db.write(as_version_3)
    app_state(app).shutdown()
    again = make_app(data_dir=tmp_path / "node2", **INDEX_NOW)      # a node with no read index yet
    client = again.test_client()
    both = {**cids, **{f"queued {k}": v for k, v in queued.items()}}
    for project in PROJECTS:
        want = {both[n] for n in both for name, (_, seen) in UNITS.items()
                if n.removeprefix("queued ") == name and project in seen}
        assert found(client, "avocet", project=project, consistency="strong") == want
    drain(again)
    replayed(again)
    assert index_answers(again)
    for project in PROJECTS:
        want = {both[n] for n in both for name, (_, seen) in UNITS.items()
                if n.removeprefix("queued ") == name and project in seen}
        assert found(client, "avocet", project=project) == want
