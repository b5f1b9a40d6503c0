"""The read index on every PostgreSQL node (service/store/postgresql/readsync.py, docs/design.md §5.2): two
nodes (two apps, two data folders) share one primary and standby. Each builds its own index from PostgreSQL,
follows every change another node makes, and a default search on either sees every unit acknowledged on
either before it began, never a deleted or forgotten one (read-your-writes: tail.py)."""
from __future__ import annotations

import json
import shutil

import psycopg
import pytest

from conftest import drain, make_unit, new_app
from service.state import app_state

pytestmark = pytest.mark.usefixtures("pg_cluster")


@pytest.fixture
def nodes(tmp_path, pg_urls):
    """``nodes(**config)``: two apps on the same PostgreSQL, each with its own data folder (a node each)."""
    made = []

    def make(**config):
        base = {"store": pg_urls[0], "store_replica": pg_urls[1], "replica_debounce_ms": 0,
                "read_your_writes_ms": 60_000, **config}
        pair = [new_app(tmp_path / f"node{len(made) + i}", **base) for i in range(2)]
        made.extend(pair)
        return pair
    yield make
    for app in made:
        app_state(app).shutdown()


def push(app, *contents, **fields) -> list[str]:
    rv = app.test_client().post("/mcp/push", json={"units": [make_unit(c, **fields) for c in contents]})
    assert rv.status_code == 200, rv.get_json()
    return [r["cid"] for r in rv.get_json()["results"]]


def search(app, query, **body):
    rv = app.test_client().post("/mcp/search", json={"query": query, "top_k": 50, **body})
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()


def cids(body) -> list[str]:
    return [r["cid"] for r in body["results"]]


def index_docs(app) -> int:
    view = app_state(app).store.readers.view("default")
    return view.searcher.num_docs if view is not None else -1


def from_index(app) -> int:
    return app_state(app).store.searcher.reads["index"]


def test_each_node_builds_its_index_and_ranks_as_the_tables(nodes):
    a, b = nodes()
    words = ["kestrel heron", "kestrel owl owl", "heron", "owl kestrel kestrel kestrel", "wren"]
    pushed = push(a, *[f"{w} note {i}" for i, w in enumerate(words * 8)])
    drain(a)        # the indexer (any node may run it) and a's read index
    assert index_docs(a) == len(pushed) and index_docs(b) == -1     # b has built nothing yet
    before = from_index(b)
    tables = search(b, "kestrel owl")          # no index on b: the tables answer
    assert from_index(b) == before and len(cids(tables)) == 24
    drain(b)
    assert index_docs(b) == len(pushed)
    for query in ("kestrel owl", "heron", "owl", "kestrel heron wren"):
        via_index, strong = search(b, query), search(b, query, consistency="strong")
        assert [(r["cid"], r["bm25_score"]) for r in via_index["results"]] == \
            [(r["cid"], r["bm25_score"]) for r in strong["results"]]
    assert from_index(b) > before


def test_a_unit_pushed_on_one_node_is_found_on_the_other_at_once(nodes):
    a, b = nodes()
    push(a, "albatross glides")
    drain(a)
    drain(b)
    [cid] = push(a, "puffin burrow")           # not indexed anywhere yet: the tail, read from the primary
    body = search(b, "puffin")
    assert cids(body) == [cid] and from_index(b) > 0
    assert body["freshness"]["index_pending"] == 0
    assert body["results"][0]["content"] == "puffin burrow"


def test_deleted_and_forgotten_units_on_another_node(nodes):
    a, b = nodes()
    gone, forgotten, changed, kept = push(a, "gannet one", "gannet two", "gannet three", "gannet four")
    drain(a)
    drain(b)
    assert sorted(cids(search(b, "gannet"))) == sorted([gone, forgotten, changed, kept])
    assert a.test_client().delete(f"/mcp/units/{gone}").status_code == 200
    client = a.test_client()
    dry = client.post("/mcp/forget", json={"query": "two"}).get_json()
    assert client.post("/mcp/forget", json={"query": "two", "confirm": dry["confirm"]}).status_code == 200
    # before b's index follows: the change log says what left
    assert sorted(cids(search(b, "gannet"))) == sorted([changed, kept])
    assert index_docs(b) == 4
    drain(b)
    assert sorted(cids(search(b, "gannet"))) == sorted([changed, kept]) and index_docs(b) == 2


def test_a_re_pushed_unit_answers_with_its_new_fields_on_every_node(nodes):
    a, b = nodes()
    unit = make_unit("shearwater colony", metadata={"v": 1})
    assert a.test_client().post("/mcp/push", json=unit).status_code == 200
    drain(a)
    drain(b)
    again = dict(unit, metadata={"v": 2}, type="model_thinking")
    assert a.test_client().post("/mcp/push", json=again).get_json()["status"] == "duplicate"
    for app in (b, a):
        [r] = search(app, "shearwater")["results"]
        assert (r["metadata"], r["type"]) == ({"v": 2}, "model_thinking")
    assert search(b, "shearwater", types=["tool_output"])["results"] == []
    drain(b)                                    # the index itself replaced the document
    [r] = search(b, "shearwater")["results"]
    assert r["metadata"] == {"v": 2} and index_docs(b) == 1


def test_a_tail_unit_deleted_between_the_tails_two_reads_leaves_every_answer(nodes, monkeypatch):
    """node_tail says where the tail is; node_tail_rows reads its rows in a later statement. A re-pushed unit
    (in the tail, and in the index with its old fields) deleted between the two has no row any more: it
    leaves the tail and the index's answers alike, and the statements before and after it answer as usual."""
    from service.store.postgresql import tail as tail_module
    a, b = nodes()
    unit = make_unit("petrel one", metadata={"v": 1})
    rv = a.test_client().post("/mcp/push", json={"units": [unit, make_unit("petrel two")]})
    doomed, kept = (r["cid"] for r in rv.get_json()["results"])
    drain(a)
    drain(b)
    again = dict(unit, metadata={"v": 2})
    assert a.test_client().post("/mcp/push", json=again).get_json()["status"] == "duplicate"
    real_sql, deleted = tail_module.sql, []

    def sql(name):
        if name == "node_tail_rows" and not deleted:     # the delete commits between the tail's two reads
            assert a.test_client().delete(f"/mcp/units/{doomed}").status_code == 200
            deleted.append(doomed)
        return real_sql(name)
    monkeypatch.setattr(tail_module, "sql", sql)
    assert cids(search(b, "petrel")) == [kept]
    assert deleted == [doomed]          # (the race happened: the tail held the re-pushed unit)
    monkeypatch.undo()
    assert cids(search(b, "petrel")) == [kept] and index_docs(b) == 2
    drain(b)
    assert cids(search(b, "petrel")) == [kept] and index_docs(b) == 1


def test_the_tail_statement_is_sent_before_the_engine_searches_and_read_after(nodes, monkeypatch):
    """A default search sends node_tail, lets tantivy read the pool while PostgreSQL answers, then reads the
    answer: a unit acknowledged on the other node just before is in it, and no connection stays out."""
    from service.readindex import threaded
    from service.store.postgresql import connections
    a, b = nodes()
    push(a, "kittiwake one")
    drain(a)
    drain(b)
    order: list[str] = []
    real_send, real_rows, real_pool = connections.Db.send, connections.Sent.rows, threaded.Engine.pool

    def send(db, name, args):
        order.append(name)
        return real_send(db, name, args)

    def rows(sent):
        got = real_rows(sent)
        order.append("answer" if got else "no answer")
        return got

    def pool(engine, want):
        order.append("pool")
        return real_pool(engine, want)
    monkeypatch.setattr(connections.Db, "send", send)
    monkeypatch.setattr(connections.Sent, "rows", rows)
    monkeypatch.setattr(threaded.Engine, "pool", pool)
    [new] = push(a, "kittiwake two")          # acknowledged on a: b's next search must see it
    assert new in cids(search(b, "kittiwake"))
    assert order == ["node_tail", "pool", "answer"]
    assert all_given_back(app_state(b).store.db.search_pool)


def test_while_the_tenant_is_unchanged_a_search_asks_only_its_version(nodes, monkeypatch):
    """node_tail's answer is kept with the tenant's version it was read at: while no push, delete, forget or
    index commit of the tenant moves the version, a search asks for the version alone; after one on any node,
    the next search reads node_tail again and sees it."""
    from service.store.postgresql import connections, tail as tail_module
    a, b = nodes()
    kept, doomed = push(a, "skua one", "skua two")
    drain(a)
    drain(b)
    asked: list[str] = []
    real_send, real_sql = connections.Db.send, tail_module.sql

    def send(db, name, args):
        asked.append(name)
        return real_send(db, name, args)

    def sql(name):
        asked.append(name)
        return real_sql(name)
    monkeypatch.setattr(connections.Db, "send", send)
    monkeypatch.setattr(tail_module, "sql", sql)

    def searched(query):
        asked.clear()
        found = cids(search(b, query))
        return found, list(asked)
    found, statements = searched("skua")
    assert sorted(found) == sorted([kept, doomed]) and statements == ["node_tail"]
    found, statements = searched("skua")
    assert sorted(found) == sorted([kept, doomed]) and statements == ["tenant_version"]
    [new] = push(a, "skua three")                           # on the other node
    found, statements = searched("skua")
    assert new in found and statements == ["tenant_version", "node_tail", "node_tail_rows", "node_tail_texts"]
    assert b.test_client().delete(f"/mcp/units/{doomed}").status_code == 200   # on this node
    found, statements = searched("skua")
    assert doomed not in found and new in found and statements[:2] == ["tenant_version", "node_tail"]
    drain(a)                                                # an index commit: the queue's oldest moves
    assert searched("skua")[1][:2] == ["tenant_version", "node_tail"]
    assert searched("skua")[1] in (["tenant_version"], ["tenant_version", "node_tail_rows"])


def all_given_back(pool, timeout: float = 5.0) -> bool:
    """Whether every connection of the pool is back in it (a closed one replaced), waiting for the pool's
    own replacement of one at most ``timeout``."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        stats = pool.get_stats()
        if stats["pool_available"] == stats["pool_size"] or time.monotonic() > deadline:
            return stats["pool_available"] == stats["pool_size"]
        time.sleep(0.05)


def test_a_tail_answer_not_plainly_read_is_read_again(nodes, pg_urls, monkeypatch):
    """The sent statement's connection broken before its answer is read (the server ended it), or its
    prepared statement gone from this process's memory: the search answers the same, read again the ordinary
    way or prepared again, and the broken connection is not given out again."""
    from service.store.postgresql import connections
    a, b = nodes()
    push(a, "fulmar one")
    drain(a)
    drain(b)
    db = app_state(b).store.db
    real_rows, ended = connections.Sent.rows, []

    def rows(sent):
        if not ended:
            with psycopg.connect(pg_urls[0], autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(%s)", (sent.conn.info.backend_pid,))
            ended.append(sent.conn)
        return real_rows(sent)
    monkeypatch.setattr(connections.Sent, "rows", rows)
    [new] = push(a, "fulmar two")
    assert new in cids(search(b, "fulmar")) and ended and ended[0].closed
    monkeypatch.undo()
    db._prepared.clear()                     # (prepared on every connection, forgotten here: 42P05, used)
    sent = db.send("node_tail", app_state(b).store.searcher.tail.args("default", {"low": 0, "n": 0}, 0))
    assert sent is not None and sent.rows()
    assert len(cids(search(b, "fulmar"))) == 2
    assert all_given_back(db.search_pool)


def test_a_search_that_fails_before_reading_its_tail_gives_its_connection_back(nodes, monkeypatch):
    from service.readindex import threaded
    a, b = nodes()
    push(a, "gannet one")
    drain(b)

    def broken(engine, want):
        raise RuntimeError("the engine failed")
    monkeypatch.setattr(threaded.Engine, "pool", broken)
    db = app_state(b).store.db
    for _ in range(db.search_pool.max_size + 2):       # (a connection kept by each would exhaust the pool)
        assert b.test_client().post("/mcp/search", json={"query": "gannet"}).status_code == 500
    monkeypatch.undo()
    assert all_given_back(db.search_pool)
    assert len(cids(search(b, "gannet"))) == 1


def test_a_missing_or_damaged_index_is_built_again_and_the_tables_answer_meanwhile(nodes):
    a, b = nodes()
    pushed = push(a, *[f"cormorant {i}" for i in range(30)])
    drain(a)
    drain(b)
    store = app_state(b).store
    path = store.root / "tenants" / "default" / "replica" / "index"
    app_state(b).maintenance.step_down()      # the leader lets go of its writer
    for f in path.glob("*.store"):
        f.write_bytes(b"damaged")
    (path / "format.json").write_text(json.dumps({"format": 0}))   # another version's index
    before = from_index(b)
    assert sorted(cids(search(b, "cormorant"))) == sorted(pushed) and from_index(b) == before
    drain(b)
    assert index_docs(b) == 30 and sorted(cids(search(b, "cormorant"))) == sorted(pushed)
    assert from_index(b) > before
    app_state(b).maintenance.step_down()
    shutil.rmtree(path)                                   # gone altogether
    drain(b)
    assert index_docs(b) == 30


def test_without_a_standby_the_index_is_fed_from_the_primary(nodes):
    a, b = nodes(store_replica=None)
    pushed = push(a, "gannet one", "gannet two", "gannet three")
    drain(a)
    drain(b)
    assert index_docs(a) == index_docs(b) == 3
    before = from_index(b)
    assert sorted(cids(search(b, "gannet"))) == sorted(pushed) and from_index(b) == before + 1


@pytest.mark.timeout(120)
def test_a_unit_held_in_the_queue_neither_stalls_a_pass_nor_is_skipped(nodes, pg_urls, monkeypatch):
    """Pages of units past one still queued (another node's indexer holds it): the pass reads on past them
    and ends; the watermark stays below the held unit, which is sent once indexed."""
    from service.store.postgresql import readsync
    monkeypatch.setattr(readsync, "PAGE", 3)
    a, b = nodes()
    [held] = push(a, "albatross held back")
    with psycopg.connect(pg_urls[0]) as other:           # an indexer elsewhere holds its queue row
        other.execute("SELECT 1 FROM pending WHERE cid = %s FOR UPDATE", (held,))
        later = push(a, *[f"albatross later {i}" for i in range(10)])
        drain(b)
        assert index_docs(b) == 10
        assert sorted(cids(search(b, "albatross"))) == sorted(later + [held])     # the held one from the tail
    drain(b)
    assert index_docs(b) == 11


def test_a_node_that_missed_pruned_changes_builds_its_index_again(nodes, pg_urls):
    a, b = nodes()
    first, second = push(a, "petrel one", "petrel two")
    drain(a)
    drain(b)
    assert a.test_client().delete(f"/mcp/units/{first}").status_code == 200
    with psycopg.connect(pg_urls[0]) as c:                  # the janitor pruned the log before b read it
        c.execute("DELETE FROM live_events")
    drain(b)
    assert index_docs(b) == 1 and cids(search(b, "petrel")) == [second]


def test_expired_units_leave_the_index_at_the_janitors_pass(clock, nodes):
    a, _ = nodes()
    [short] = push(a, "skua brief", ttl=60)
    [long_] = push(a, "skua lasting")
    drain(a)
    assert index_docs(a) == 2
    clock.advance(61)
    assert cids(search(a, "skua")) == [long_]               # filtered at once
    app_state(a).maintenance.run_once(force_janitor=True)
    assert index_docs(a) == 1
    assert short not in cids(search(a, "skua", consistency="strong"))


def test_readiness_and_metrics_show_each_nodes_lag(nodes):
    a, b = nodes(read_your_writes_ms=0)
    push(a, *[f"tern {i}" for i in range(5)])
    drain(a)
    ready = b.test_client().get("/readyz").get_json()
    assert ready["read_index"]["behind_units"] == 5 and ready["index_pending"] == 0   # no index yet: the tables answer
    assert ready["read_index"]["units"] == 5                    # the old name, kept for monitors that read it
    drain(b)
    ready = b.test_client().get("/readyz").get_json()
    assert ready["read_index"] == {"behind_units": 0, "lag_ms": 0, "units": 0} and ready["index_pending"] == 0
    push(a, "tern late")
    metrics = b.test_client().get("/metrics").get_data(as_text=True)
    assert 'context_read_index_behind_units{tenant="default"} 1.0' in metrics
    assert 'context_index_queue_depth{tenant="default"} 1.0' in metrics
    assert search(b, "tern")["freshness"]["index_pending"] == 1   # (read-your-writes off: not read)


def generic_plan(conn, name: str, args: dict, types: dict) -> str:
    """The plan PostgreSQL keeps for a named statement on the search pool's connections (prepared, generic;
    in the form ``Db.send`` prepares it)."""
    import psycopg.sql

    from service.store.postgresql.connections import prepared_form
    _, names, text = prepared_form(name)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE p_{name}({', '.join(types[n] for n in names)}) AS {text}")
    call = psycopg.sql.SQL("EXECUTE p_{}({})").format(psycopg.sql.SQL(name), psycopg.sql.SQL(", ").join(
        psycopg.sql.Literal(args[n]) for n in names))      # (typed by the PREPARE)
    return "\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + call))


def test_the_tail_reads_plan_one_lookup_per_unit_whatever_the_tables_hold(nodes, pg_urls):
    """A default search's reads besides the node index run as generic plans (planned once per connection).
    Their cost must follow the tail, not the table: each tail unit looked up in the units table on its own
    (a nested loop, never a hash of every day's rows, which at 1M units made a default search ~150 ms) and
    the catalog read by seq (never by the expiry index, which holds every unit)."""
    import time
    a, _ = nodes()
    now = int(time.time())
    for day in range(6):
        push(a, *[f"plan probe {day} {i} gannet" for i in range(100)], timestamp=now - day * 86_400)
    drain(a)
    with psycopg.connect(pg_urls[0], autocommit=True) as c:
        c.execute("ANALYZE")
        last = c.execute("SELECT last_seq FROM tenants WHERE tenant = 'default'").fetchone()[0]
        cids = [r[0] for r in c.execute("SELECT cid FROM catalog WHERE tenant = 'default' AND seq > %s",
                                        (last - 5,))]
        seqs, days = zip(*c.execute("SELECT seq, day::text FROM catalog WHERE tenant = 'default' AND cid = ANY(%s) "
                                    "ORDER BY seq", (cids,)).fetchall())
        args = {"tenant": "default", "low": last - 5, "now": now, "limit": 1000, "after": 0, "changes": 100,
                "cids": cids, "bytes": 1 << 20, "seqs": list(seqs), "days": list(days)}
        types = {"tenant": "text", "low": "bigint", "now": "bigint", "limit": "bigint", "after": "bigint",
                 "changes": "bigint", "cids": "text[]", "bytes": "bigint", "seqs": "bigint[]", "days": "text[]"}
        # (node_tail reads no units row: where the tail is, from the catalog's seq index)
        plan = generic_plan(c, "node_tail", args, types)
        assert " on units" not in plan.lower() and "catalog_expires" not in plan and "Hash Join" not in plan, plan
        for name in ("node_tail_rows", "node_tail_texts", "node_behind"):
            plan = generic_plan(c, name, args, types)
            assert "Hash Join" not in plan and "Merge Join" not in plan and "Nested Loop" in plan, plan
            assert "catalog_expires" not in plan, plan
    # ... and never compiled: a generic plan's estimate grows with the tables, and past jit_above_cost
    # PostgreSQL compiled node_tail at every search (175 ms at 1M units, for 0.2 ms of execution)
    with app_state(a).store.db.search_pool.connection() as conn:
        row = conn.execute("SELECT current_setting('jit') AS jit, current_setting('plan_cache_mode') AS mode"
                           ).fetchone()
        assert (row["jit"], row["mode"]) == ("off", "force_generic_plan")
