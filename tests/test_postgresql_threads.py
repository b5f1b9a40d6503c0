"""Threads on PostgreSQL (docs/design.md §3 "Threads", §5.2): the same units pushed to both stores get the same
threads and places and the same thread-aware default answers, and a database made before threads gets them at
its upgrade by the push's rules (lineage only, as SQLite's catalog migration)."""
from __future__ import annotations

import os
import random
import sqlite3
import time
from collections import Counter, defaultdict

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from conftest import ROOT, drain, make_unit, new_app
from service.store.postgresql.rows import SCHEMA_VERSION
from service.units import compute_cid
from service.state import app_state

WORDS = ("order shipped refund invoice payment customer address warehouse delay carrier parcel label "
         "error timeout retry database index query latency cache token budget context agent tool model "
         "订单 发货 退款 发票 支付 客户 地址 仓库 延迟 快递 包裹 标签 错误 超时 重试 数据库 索引 查询 缓存").split()


def pushed(app, units):
    rv = app.test_client().post("/mcp/push", json={"units": units})
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()["results"]


def search(app, **body):
    rv = app.test_client().post("/mcp/search", json=body)
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()


def cid_of(u: dict) -> str:
    return compute_cid(u["content"], u["timestamp"], u["source"])


def conversations(n=48, seed=3):
    """Sessions of turns, each about a few words of its own: a third pushed as a client that knows its
    sessions does (a root, turns as its children), a third with metadata.session, a third flat (one source,
    a minute apart: one thread each unless CONTEXT_THREAD_GAP_S joins them). Two rounds of pushes, each
    session's later turns in the second (their threads' places then come from the catalog), the second also
    re-pushing a few units of the first with another ttl (a duplicate keeps its thread and place)."""
    rng = random.Random(seed)
    now = int(time.time())
    rounds: list[list[dict]] = [[], []]
    for s in range(n):
        topic = rng.sample(WORDS, 3)
        start = now - (n - s) * 3 * 3600
        kind = s % 3
        source = "flat_v1" if kind == 2 else f"chat_{s % 4}_v1"
        turns = []
        for j in range(rng.randint(3, 10)):
            words = [rng.choice(topic) if rng.random() < 0.3 else rng.choice(WORDS) for _ in range(rng.randint(4, 30))]
            turns.append(make_unit(" ".join(words) + f" s{s}t{j}", timestamp=start + 60 * (j + 1), source=source,
                                   ttl=30 * 86_400, type="user_input" if j % 2 else "tool_output"))
        if kind == 0:
            root = make_unit(f"Conversation {s} about {' '.join(topic[:1])}", timestamp=start, source=source,
                             type="system_notice", ttl=30 * 86_400)
            for t in turns:
                t["parent_cid"] = cid_of(root)
            turns.insert(0, root)
        elif kind == 1:
            for t in turns:
                t["metadata"] = {"session": f"session-{s}"}
        half = len(turns) // 2
        rounds[0] += turns[:half]
        rounds[1] += turns[half:]
    rounds[1] += [dict(u, ttl=u["ttl"] + 60) for u in rounds[0][::17]]
    queries = [" ".join(rng.sample(WORDS, rng.randint(1, 4))) for _ in range(40)]
    return rounds, queries


def pg_threads(url: str, table: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(url) as c:
        return {cid: (thread, tpos) for cid, thread, tpos in
                c.execute(f"SELECT cid, thread, tpos FROM {table} WHERE tenant = 'default'")}


def sqlite_threads(data_dir) -> dict[str, tuple[str, int]]:
    with sqlite3.connect(data_dir / "tenants" / "default" / "catalog.db") as c:
        return {cid: (thread, tpos) for cid, thread, tpos in c.execute("SELECT cid, thread, tpos FROM catalog")}


def views_hold(app, n: int, timeout: float = 30.0) -> None:
    """Wait until the app's process has loaded a view of the read index holding all ``n`` units."""
    store = app_state(app).store
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = (store.searcher.view(store.tenant("default")) if getattr(store, "backend", "sqlite") == "sqlite"
                else store.readers.view("default"))
        if view is not None and view.ndocs == view.searcher.num_docs == n:
            return
        time.sleep(0.02)
    raise AssertionError(f"the read index of {type(store).__module__} did not come to hold {n} units")


def places_are_dense(threads: dict[str, tuple[str, int]]) -> bool:
    """Each thread's places are 0, 1, ... with none taken twice."""
    by_thread = defaultdict(list)
    for thread, tpos in threads.values():
        by_thread[thread].append(tpos)
    return all(sorted(places) == list(range(len(places))) for places in by_thread.values())


@pytest.mark.parametrize("pending,gap", [(False, 0), (True, 0), (False, 300)], ids=["indexed", "pending", "gap"])
def test_threaded_units_get_the_same_threads_and_answers_on_sqlite_and_postgresql(tmp_path, pg_urls, pending, gap):
    """The same conversations pushed to both stores, in batches that continue threads stored before: every unit
    has the same thread and place on both (PostgreSQL's units rows as its catalog), each thread's places dense;
    and default searches (thread-aware, docs/design.md §6) give the same top 10 in the same order with the same
    scores, ties included, and the same thread evidence in explain. ``pending``: the second round acked but not
    indexed (the read index lacks it: read-your-writes' tail is ranked with it); ``gap``: CONTEXT_THREAD_GAP_S
    300 on both (a source's units a minute apart join one thread, found through PostgreSQL's catalog_source_ts)."""
    rounds, queries = conversations()
    # (each drain commits the read index: a debounced commit left a run-dependent part of the units to the
    # tail, scored with the statistics of what each index held then)
    lite = new_app(tmp_path / "lite", read_your_writes_ms=60_000, thread_gap_s=gap, replica_debounce_ms=0)
    pg = new_app(tmp_path / "pg", store=pg_urls[0], store_replica=pg_urls[1], read_your_writes_ms=60_000,
                 thread_gap_s=gap, replica_debounce_ms=0)
    try:
        for i, batch in enumerate(rounds):
            for start in range(0, len(batch), 40):
                part = batch[start:start + 40]
                assert pushed(lite, part) == pushed(pg, part)
            if i == 0 or not pending:
                drain(lite)
                drain(pg)
        threads = pg_threads(pg_urls[0], "catalog")
        assert threads == pg_threads(pg_urls[0], "units") == sqlite_threads(tmp_path / "lite")
        if not pending:
            # The statistics count documents deleted but not yet merged away (docs/design.md §6.1): the second
            # round replaced some (a duplicate's ttl, places), and when tantivy's background merges drop them
            # differs between two writers. The same answers are owed to indexes holding the same documents: both
            # built again from their stores, and read only once each process's view holds every unit (a reload
            # that meets a merge's files being replaced keeps the previous view until a later search).
            app_state(lite).maintenance.read_sync("default").rebuild()
            app_state(pg).maintenance.read_sync("default").rebuild()
            drain(lite)
            drain(pg)
            views_hold(lite, len(threads))
            views_hold(pg, len(threads))
        assert places_are_dense(threads)
        joined = Counter(thread for thread, _ in threads.values())
        # roots with their turns, sessions; with the gap the flat turns too: threads of more than one unit
        assert sum(1 for n in joined.values() if n > 1) >= (48 if gap else 32)
        for cid in list(threads)[::25]:
            got = pg.test_client().get(f"/mcp/units/{cid}").get_json()
            assert got["thread"] == lite.test_client().get(f"/mcp/units/{cid}").get_json()["thread"] == threads[cid][0]

        reordered = 0
        for q in queries:
            a = search(lite, query=q, top_k=10)["results"]
            b = search(pg, query=q, top_k=10)["results"]
            assert [(r["cid"], r["thread"], r["bm25_score"]) for r in a] == \
                   [(r["cid"], r["thread"], r["bm25_score"]) for r in b], q
            assert [r["score"] for r in a] == pytest.approx([r["score"] for r in b], abs=2e-6), q
            reordered += [r["bm25_score"] for r in a] != sorted((r["bm25_score"] for r in a), reverse=True)
        assert reordered >= 10         # threads ranked these answers, not BM25 alone
        for q in queries[:5]:
            a = search(lite, query=q, top_k=10, explain=True)["results"]
            b = search(pg, query=q, top_k=10, explain=True)["results"]
            assert [r["explain"]["threads"] for r in a] == [r["explain"]["threads"] for r in b], q
        reads = app_state(pg).store.searcher.reads
        assert reads["index"] > 0 and reads["primary"] == reads["standby"] == 0   # the node's read index answered
    finally:
        app_state(lite).shutdown()
        app_state(pg).shutdown()


def test_a_push_reads_its_threads_places_in_one_round_trip(tmp_path, pg_urls, monkeypatch):
    """A batch of new units reads the last places of the threads it joins with its catalog rows (one round
    trip), not one statement per unit: 200 new units, half of them children of stored roots, run
    catalog_thread_last for none of them; the places they take continue the stored ones."""
    from service.store.postgresql import threads as pg_threads_module
    asked = []
    real = pg_threads_module.CatalogThreads.last_pos

    def counted(self, thread):
        if thread not in self.last:
            asked.append(thread)
        return real(self, thread)
    monkeypatch.setattr(pg_threads_module.CatalogThreads, "last_pos", counted)
    now = int(time.time())
    roots = [make_unit(f"root {i}", timestamp=now - 1000 + i) for i in range(10)]
    pg = new_app(tmp_path / "pg", store=pg_urls[0])
    try:
        pushed(pg, roots)
        kids = [make_unit(f"first child of {i}", timestamp=now - 500 + i, parent_cid=cid_of(r))
                for i, r in enumerate(roots)]
        pushed(pg, kids)
        batch = [make_unit(f"child {i} of {i % 10}", timestamp=now - 100 + i, parent_cid=cid_of(roots[i % 10]))
                 for i in range(100)] + [make_unit(f"alone {i}", timestamp=now - 100 + i) for i in range(100)]
        assert {r["status"] for r in pushed(pg, batch)} == {"ok"}
        assert asked == []
        threads = pg_threads(pg_urls[0], "catalog")
        assert places_are_dense(threads)
        for i, r in enumerate(roots):
            assert threads[cid_of(r)] == (cid_of(r), 0) and threads[cid_of(kids[i])] == (cid_of(r), 1)
        assert sorted(threads[cid_of(u)][1] for u in batch[:100] if u["parent_cid"] == cid_of(roots[3])) == \
               list(range(2, 12))
        assert all(threads[cid_of(u)] == (cid_of(u), 0) for u in batch[100:])
    finally:
        app_state(pg).shutdown()


# --- the upgrade of a database made before threads (schema version 3) ---------------------------------
def _write_as_version_3(conn, config, tenant: str, units: list[dict], indexed: int) -> None:
    """Store units in a version-3 database as version 3's push and indexer left them (no threads): catalog,
    unit (parents and metadata included) and day rows; the first ``indexed`` with their term frequencies
    and statistics, the rest still queued."""
    from service.store.postgresql.rows import next_day, partition_name
    from service.tokenize import tokenizer_for
    from service.units import validate_unit
    tokens = tokenizer_for(config).tokens
    now = int(time.time())
    dfs: Counter = Counter()
    for seq, raw in enumerate(units, 1):
        u = validate_unit(raw, config, now)
        row = {"tenant": tenant, "cid": u.cid, "seq": seq, "day": u.day, "timestamp": u.timestamp,
               "source": u.source, "digest": u.digest, "expires_at": u.expires_at, "type": u.type, "ttl": u.ttl,
               "content": u.content, "metadata": u.metadata_json(), "parent_cid": u.parent_cid,
               "pushed_ms": now * 1000 + seq}
        conn.execute(pgsql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF units FOR VALUES FROM ({}) TO ({})").format(
            pgsql.Identifier(partition_name(u.day)), pgsql.Literal(u.day), pgsql.Literal(next_day(u.day))))
        conn.execute("INSERT INTO catalog(tenant, cid, seq, day, timestamp, source, digest, expires_at, parent_cid) "
                     "VALUES (%(tenant)s, %(cid)s, %(seq)s, %(day)s, %(timestamp)s, %(source)s, %(digest)s, "
                     "%(expires_at)s, %(parent_cid)s)", row)
        conn.execute("INSERT INTO units(tenant, day, cid, seq, type, source, timestamp, ttl, expires_at, content, "
                     "metadata, parent_cid, pushed_ms) VALUES (%(tenant)s, %(day)s, %(cid)s, %(seq)s, %(type)s, "
                     "%(source)s, %(timestamp)s, %(ttl)s, %(expires_at)s, %(content)s, %(metadata)s, %(parent_cid)s, "
                     "%(pushed_ms)s)", row)
        conn.execute("INSERT INTO tenant_days VALUES (%(tenant)s, %(day)s, %(expires_at)s, %(expires_at)s) ON CONFLICT "
                     "(tenant, day) DO UPDATE SET min_expires_at = least(tenant_days.min_expires_at, "
                     "excluded.min_expires_at), max_expires_at = greatest(tenant_days.max_expires_at, "
                     "excluded.max_expires_at)", row)
        if seq > indexed:
            conn.execute("INSERT INTO pending(tenant, cid, day, seq, pushed_ms, type, source, timestamp, expires_at, "
                         "parent_cid) VALUES (%(tenant)s, %(cid)s, %(day)s, %(seq)s, %(pushed_ms)s, %(type)s, "
                         "%(source)s, %(timestamp)s, %(expires_at)s, %(parent_cid)s)", row)
            continue
        tfs = Counter(tokens(u.content))
        conn.execute("INSERT INTO unit_terms(tenant, cid, day, seq, type, source, timestamp, expires_at, parent_cid, "
                     "ntok, tfs) VALUES (%(tenant)s, %(cid)s, %(day)s, %(seq)s, %(type)s, %(source)s, %(timestamp)s, "
                     "%(expires_at)s, %(parent_cid)s, %(ntok)s, %(tfs)s)",
                     {**row, "ntok": sum(tfs.values()), "tfs": Jsonb(dict(tfs))})
        conn.execute("INSERT INTO day_stats VALUES (%s, %s, 1, %s) ON CONFLICT (tenant, day) DO UPDATE SET "
                     "ndocs = day_stats.ndocs + 1, ntokens = day_stats.ntokens + excluded.ntokens",
                     (tenant, u.day, sum(tfs.values())))
        dfs.update(tfs.keys())
    for term, df in sorted(dfs.items()):
        conn.execute("INSERT INTO term_df(tenant, term, df) VALUES (%s, %s, %s)", (tenant, term, df))
    conn.execute("INSERT INTO tenants(tenant, last_seq, version) VALUES (%s, %s, 1)", (tenant, len(units)))


def lineage_threads(units: list[dict]) -> dict[str, tuple[str, int]]:
    """What the upgrade must assign (docs/design.md §3, lineage only): in acknowledgement order, a unit whose
    parent came before it joins its parent's thread at the next place; any other starts its own."""
    out, ends = {}, Counter()
    for u in units:
        parent = out.get(u.get("parent_cid"))
        thread = parent[0] if parent else cid_of(u)
        out[cid_of(u)] = (thread, ends[thread])
        ends[thread] += 1
    return out


def test_a_database_made_before_threads_gets_them_at_start(tmp_path, pg_cluster):
    """A database made by schema version 3 (tests/pg_schema_v3.sql, as main released it), with two tenants'
    indexed and queued units: the first node that starts on it gives every unit its thread and place by the
    push's rules over lineage (a child whose parent was deleted, or acknowledged after it, starts its own; a
    unit's metadata.session is not read, as SQLite's catalog migration cannot), in each tenant's seq order,
    and the units rows as the catalog; the same as a SQLite store gives those units pushed fresh. Searches then
    answer threads; a new child continues its migrated thread; a second node changes nothing."""
    name = f"upgrade_v3_{os.getpid()}"
    with psycopg.connect(pg_cluster.primary_url, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        c.execute(f"CREATE SCHEMA {name}")
    url = pg_cluster.url(pg_cluster.primary_port, options=f"-csearch_path%3D{name}%2Cpublic")
    now = int(time.time())
    rng = random.Random(7)
    units = []
    for s in range(12):
        root = make_unit(f"session {s} opens about {rng.choice(WORDS)}", timestamp=now - 86_400 * (s % 3) - 5000 + s,
                         ttl=30 * 86_400)
        units.append(root)
        for j in range(rng.randint(2, 6)):
            units.append(make_unit(" ".join(rng.sample(WORDS, 6)) + f" s{s}t{j}", timestamp=root["timestamp"] + j + 1,
                                   ttl=30 * 86_400, parent_cid=cid_of(root)))
        units.append(make_unit(f"a note of its own {s} {rng.choice(WORDS)}", timestamp=root["timestamp"] + 100,
                               ttl=30 * 86_400, metadata={"session": "one-session"}))
    # a grandchild: its parent's thread (the root's)
    units.append(make_unit("grandchild order refund", timestamp=now - 10, ttl=30 * 86_400, parent_cid=cid_of(units[1])))
    orphan = make_unit("orphan whose parent was deleted", timestamp=now - 9, ttl=30 * 86_400, parent_cid="0" * 12)
    # a child stored before its parent (the parent deleted and pushed again since)
    late_parent = make_unit("a parent pushed again later", timestamp=now - 8, ttl=30 * 86_400)
    early_child = make_unit("its child, stored first", timestamp=now - 7, ttl=30 * 86_400, parent_cid=cid_of(late_parent))
    written = units + [orphan, early_child, late_parent]
    other = written[:20]            # a second tenant: its own seqs and places
    lite = new_app(tmp_path / "lite")
    try:
        with psycopg.connect(url) as c:
            c.execute((ROOT / "tests" / "pg_schema_v3.sql").read_text(encoding="utf-8"))
            _write_as_version_3(c, lite.config["CONTEXT"], "default", written, indexed=len(written) - 15)
            _write_as_version_3(c, lite.config["CONTEXT"], "other", other, indexed=len(other))
        pg = new_app(tmp_path / "pg", store=url)
        try:
            expected = lineage_threads(written)
            assert expected[cid_of(orphan)] == (cid_of(orphan), 0)
            assert expected[cid_of(early_child)] == (cid_of(early_child), 0)
            assert expected[cid_of(units[-1])] == (cid_of(units[0]), len([u for u in units[:7]
                                                                           if u.get("parent_cid") == cid_of(units[0])]) + 1)
            with psycopg.connect(url) as c:
                assert c.execute("SELECT value FROM cms_meta WHERE key = 'schema_version'").fetchone()[0] == SCHEMA_VERSION
                for tenant, want in (("default", expected), ("other", lineage_threads(other))):
                    for table in ("catalog", "units"):
                        got = {cid: (thread, tpos) for cid, thread, tpos in c.execute(
                            f"SELECT cid, thread, tpos FROM {table} WHERE tenant = %s", (tenant,))}
                        assert got == want, (tenant, table)
            # the same units pushed fresh to SQLite (in the same order; it refuses the orphan; without the
            # session metadata the upgrade cannot read) get the same threads
            fresh = [{k: v for k, v in u.items() if k != "metadata"} for u in written if u is not orphan]
            results = pushed(lite, fresh)
            refused = [r["index"] for r in results if r.get("status") != "ok"]
            assert [fresh[i]["content"] for i in refused] == [early_child["content"]]   # (its parent came later)
            for u in fresh:
                if u["content"] != early_child["content"]:
                    assert lite.test_client().get(f"/mcp/units/{cid_of(u)}").get_json()["thread"] == expected[cid_of(u)][0]
            drain(pg)
            got = search(pg, query="grandchild order refund", top_k=3)["results"]
            assert got[0]["cid"] == cid_of(units[-1]) and got[0]["thread"] == cid_of(units[0])
            assert app_state(pg).store.searcher.reads["index"] > 0
            child = pushed(pg, [make_unit("a new child after the upgrade", timestamp=now - 1, parent_cid=cid_of(units[0]))])
            with psycopg.connect(url) as c:
                last = c.execute("SELECT thread, tpos FROM catalog WHERE tenant = 'default' AND cid = %s",
                                 (child[0]["cid"],)).fetchone()
            assert last == (cid_of(units[0]), expected[cid_of(units[-1])][1] + 1)
            again = new_app(tmp_path / "pg2", store=url)
            app_state(again).shutdown()
            with psycopg.connect(url) as c:
                assert c.execute("SELECT count(*) FROM catalog WHERE thread IS NULL").fetchone()[0] == 0
                assert c.execute("SELECT tpos FROM catalog WHERE cid = %s", (child[0]["cid"],)).fetchone()[0] == last[1]
        finally:
            app_state(pg).shutdown()
    finally:
        app_state(lite).shutdown()
        with psycopg.connect(pg_cluster.primary_url, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def test_the_gap_index_is_made_only_when_the_gap_is_on(tmp_path, pg_urls):
    """catalog_source_ts (a source's units by time) costs every push a write: made only by a node that starts
    with CONTEXT_THREAD_GAP_S > 0, and then a unit joins its source's previous unit's thread through it."""
    def present():
        with psycopg.connect(pg_urls[0]) as c:
            return c.execute("SELECT to_regclass('catalog_source_ts') IS NOT NULL").fetchone()[0]
    with psycopg.connect(pg_urls[0], autocommit=True) as c:
        c.execute("DROP INDEX IF EXISTS catalog_source_ts")
    now = int(time.time())
    off = new_app(tmp_path / "off", store=pg_urls[0])
    app_state(off).shutdown()
    assert not present()
    on = new_app(tmp_path / "on", store=pg_urls[0], thread_gap_s=120)
    try:
        assert present()
        first = pushed(on, [make_unit("first note", source="notes_v1", timestamp=now - 100)])[0]["cid"]
        near = pushed(on, [make_unit("a minute later", source="notes_v1", timestamp=now - 40)])[0]["cid"]
        apart = pushed(on, [make_unit("an hour before", source="notes_v1", timestamp=now - 3700)])[0]["cid"]
        other = pushed(on, [make_unit("another source", source="other_v1", timestamp=now - 30)])[0]["cid"]
        threads = pg_threads(pg_urls[0], "catalog")
        assert threads[first] == (first, 0) and threads[near] == (first, 1)
        assert threads[apart] == (apart, 0) and threads[other] == (other, 0)
    finally:
        app_state(on).shutdown()
        with psycopg.connect(pg_urls[0], autocommit=True) as c:
            c.execute("DROP INDEX IF EXISTS catalog_source_ts")
