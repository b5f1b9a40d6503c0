"""Global BM25 across day shards, replicas and the janitor (docs/design.md §5 and §6)."""
import json
import os
import random
import re
import sqlite3
import time

import pytest
import tantivy

from conftest import drain, make_unit
from service.state import app_state

# day files and their read index are the SQLite backend's (PostgreSQL: tests/test_postgresql.py):
# CONTEXT_TEST_BACKEND=postgresql runs these on SQLite
pytestmark = pytest.mark.sqlite_only

WORDS = ("order shipped refund invoice payment customer address warehouse delay carrier parcel label "
         "error timeout retry database index query latency cache token budget context agent tool model "
         "订单 发货 退款 发票 支付 客户 地址 仓库 延迟 快递 包裹 标签 错误 超时 重试 数据库 索引 查询 缓存").split()


def corpus(n=600, seed=7, *, longest=40, alpha=1.2, zipf_share=0.5, most_terms=4, n_queries=50):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        # Zipf-ish word choice, varied lengths, so idf and length normalisation both matter.
        length = rng.randint(3, longest)
        words = [WORDS[min(int(rng.paretovariate(alpha)) - 1, len(WORDS) - 1)] if rng.random() < zipf_share
                 else rng.choice(WORDS) for _ in range(length)]
        docs.append(" ".join(words) + f" doc{i}")
    queries = [" ".join(rng.sample(WORDS, rng.randint(1, most_terms))) for _ in range(n_queries)]
    return docs, queries


def build(make_app, tmp_path, name, docs, days):
    app = make_app(data_dir=tmp_path / name)
    now = int(time.time())
    units = [make_unit(text, timestamp=now - (i % days) * 86_400, ttl=30 * 86_400, source="equiv")
             for i, text in enumerate(docs)]
    rv = app.test_client().post("/mcp/push", json={"units": units})
    assert all(r["status"] == "ok" for r in rv.get_json()["results"])
    drain(app)
    return app


def test_five_day_shards_rank_exactly_like_one_shard(make_app, tmp_path):
    docs, queries = corpus()
    one = build(make_app, tmp_path, "one", docs, days=1)
    five = build(make_app, tmp_path, "five", docs, days=5)
    c1, c5 = one.test_client(), five.test_client()
    compared = 0
    for q in queries:
        r1 = c1.post("/mcp/search", json={"query": q, "top_k": 20}).get_json()
        r5 = c5.post("/mcp/search", json={"query": q, "top_k": 20}).get_json()
        assert r1["shards_searched"] == 1 and r5["shards_searched"] == 5
        # Same scores in the same order, and the same documents wherever the score is not tied at
        # the cut (CIDs, the tie-break, differ between the two builds because timestamps differ).
        s1 = [r["bm25_score"] for r in r1["results"]]
        assert s1 == [r["bm25_score"] for r in r5["results"]], q
        cut = s1[-1] if len(s1) == 20 else -1
        assert sorted((r["bm25_score"], r["content"]) for r in r1["results"] if r["bm25_score"] > cut) == \
               sorted((r["bm25_score"], r["content"]) for r in r5["results"] if r["bm25_score"] > cut), q
        compared += len(s1)
    assert compared > 500


@pytest.mark.parametrize("consistency", ["replica", "strong"])
def test_ranking_agrees_with_independent_bm25(make_app, tmp_path, consistency):
    """Scores equal a from-scratch BM25 (Lucene idf, k1=1.2, b=0.75, exact lengths) over the same
    tokens, on the primaries (strong) and from the read index (default searches), whose candidates
    are scored again with exact lengths (lengths above 40 tokens make its own encoding inexact)."""
    import math
    from service.readindex.searcher import encoded_length
    from service.tokenize import tokenizer_for
    docs, queries = corpus(300, seed=3, longest=120)
    app = build(make_app, tmp_path, "ref", docs, days=3)
    try:
        tok = tokenizer_for(app.config["CONTEXT"])
        toks = [tok.tokens(d) for d in docs]
        n = len(toks)
        avgdl = sum(map(len, toks)) / n
        assert any(encoded_length(len(t)) != len(t) for t in toks)
        for q in queries[:20]:
            terms = tok.query_terms(q)
            scores = []
            for i, t in enumerate(toks):
                s = 0.0
                for term in terms:
                    tf = t.count(term)
                    if tf:
                        df = sum(1 for x in toks if term in x)
                        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                        s += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(t) / avgdl))
                if s > 0:
                    scores.append((round(s, 6), docs[i]))
            scores.sort(key=lambda x: -x[0])
            got = app.test_client().post("/mcp/search", json={"query": q, "top_k": 10, "consistency": consistency}
                                         ).get_json()["results"]
            assert [r["bm25_score"] for r in got] == pytest.approx([s for s, _ in scores[:10]], abs=1e-5)
    finally:
        app_state(app).shutdown()


def test_only_live_shards_are_searched(clock, client):
    now = int(time.time())
    client.post("/mcp/push", json=make_unit("ancient lemur", timestamp=now - 3 * 86_400, ttl=3 * 86_400 + 2))
    client.post("/mcp/push", json=make_unit("recent lemur"))
    body = client.post("/mcp/search", json={"query": "lemur", "consistency": "strong"}).get_json()
    assert body["shards_searched"] == 2
    clock.advance(now + 2.2 - time.time())
    body = client.post("/mcp/search", json={"query": "lemur", "consistency": "strong"}).get_json()
    assert body["shards_searched"] == 1 and len(body["results"]) == 1


def test_janitor_purges_expired_units_and_unlinks_dead_days(clock, client, app):
    now = int(time.time())
    old_day = now - 2 * 86_400
    dead = client.post("/mcp/push", json=make_unit("doomed okapi", timestamp=old_day, ttl=2 * 86_400 + 2)).get_json()
    short = client.post("/mcp/push", json=make_unit("short okapi", timestamp=now - 10, ttl=12)).get_json()
    keep = client.post("/mcp/push", json=make_unit("lasting okapi", timestamp=now - 10, ttl=3600)).get_json()
    maint = app_state(app).maintenance
    maint.run_once()
    tenant_dir = app.config["CONTEXT"].data_path / "tenants" / "default"
    primaries = sorted(p.name for p in (tenant_dir / "primary").glob("*.db"))
    assert len(primaries) == 2
    view = app_state(app).store.searcher.view(app_state(app).store.tenant("default"))
    indexed_days = dict(view.searcher.terms_with_prefix("day", ""))
    assert sorted(indexed_days) == [p[:10] for p in primaries] and view.searcher.num_docs == 3
    clock.advance(now + 2.5 - time.time())
    result = maint.janitor.run(app_state(app).store.tenant("default"))
    assert result == {"purged": 1, "unlinked": 1, "unlinked_days": [primaries[0][:10]]}
    # The dead day is gone from disk (primary and WAL files) and from the catalog ...
    assert sorted(p.name for p in (tenant_dir / "primary").glob("*.db*")) == [primaries[1]] + \
        [x for x in sorted(os.listdir(tenant_dir / "primary")) if x.startswith(primaries[1]) and x != primaries[1]]
    # ... and, after the leader's next pass, from the read index, with the purged unit.
    maint.run_once()
    view = app_state(app).store.searcher.view(app_state(app).store.tenant("default"))
    assert view.searcher.num_docs == 1
    assert [d for d, _ in view.searcher.terms_with_prefix("day", "", filter_query=tantivy.Query.all_query())] \
        == [primaries[1][:10]]
    body = client.post("/mcp/search", json={"query": "okapi"}).get_json()
    assert [r["cid"] for r in body["results"]] == [keep["cid"]]
    cat = sqlite3.connect(tenant_dir / "catalog.db")
    assert {r[0] for r in cat.execute("SELECT cid FROM catalog")} == {keep["cid"]}
    assert cat.execute("SELECT count(*) FROM days").fetchone()[0] == 1
    cat.close()
    shard = sqlite3.connect(tenant_dir / "primary" / primaries[1])
    assert shard.execute("SELECT count(*) FROM units_fts").fetchone()[0] == 1
    assert dict(shard.execute("SELECT key, value FROM meta"))["ndocs"] == 1
    shard.close()
    body = client.post("/mcp/search", json={"query": "okapi", "consistency": "strong"}).get_json()
    assert [r["cid"] for r in body["results"]] == [keep["cid"]]
    for gone in (dead, short):
        assert client.get(f"/mcp/units/{gone['cid']}").status_code == 404
    # A new unit for the unlinked day re-creates its shard.
    rv = client.post("/mcp/push", json=make_unit("reborn okapi", timestamp=old_day, ttl=3 * 86_400))
    assert rv.status_code == 200
    assert client.get(f"/mcp/units/{rv.get_json()['cid']}").status_code == 200
    assert (tenant_dir / "primary" / primaries[0]).exists()


def test_read_index_lag_and_damaged_index_rebuilt(client, app):
    maint = app_state(app).maintenance
    client.post("/mcp/push", json=make_unit("replica tapir"))
    # Not indexed yet, and no read index yet: default reads use the primaries and, reading your
    # writes (issue 14), the pending unit too.
    assert len(client.post("/mcp/search", json={"query": "tapir"}).get_json()["results"]) == 1
    maint.run_once()
    index = app.config["CONTEXT"].data_path / "tenants" / "default" / "replica" / "index"
    assert (index / "meta.json").exists()
    body = client.post("/mcp/search", json={"query": "tapir"}).get_json()
    assert len(body["results"]) == 1 and body["freshness"] == {"replica_lag_ms": 0, "index_pending": 0}
    # A unit the read index does not hold yet is read from the primaries (with read-your-writes off
    # it shows as lag and pending: tests/test_read_your_writes.py).
    client.post("/mcp/push", json=make_unit("second tapir"))
    assert len(client.post("/mcp/search", json={"query": "tapir", "consistency": "strong"}).get_json()["results"]) == 2
    body = client.post("/mcp/search", json={"query": "tapir"}).get_json()
    assert len(body["results"]) == 2 and body["freshness"] == {"replica_lag_ms": 0, "index_pending": 0}
    # Damage the index behind a new leader's back: searches still answer, and the leader rebuilds it.
    maint.stop()
    (index / "meta.json").write_text("this is not an index")
    body = client.post("/mcp/search", json={"query": "tapir"}).get_json()
    assert len(body["results"]) == 2      # this process's reader keeps the last good commit (+ the tail)
    from service.store.sqlite.maintenance import Maintenance
    fresh = Maintenance(app_state(app).store)
    try:
        fresh.run_once()
        body = client.post("/mcp/search", json={"query": "tapir"}).get_json()
        assert len(body["results"]) == 2 and body["freshness"] == {"replica_lag_ms": 0, "index_pending": 0}
        assert json.loads((index / "meta.json").read_text())["segments"]
    finally:
        fresh.stop()


def test_metrics_exposes_latency_queue_lag_and_units(client, app):
    client.post("/mcp/push", json=make_unit("metric unit"))
    client.post("/mcp/search", json={"query": "metric"})
    text = client.get("/metrics").get_data(as_text=True)
    assert 'context_request_seconds_bucket{le="0.005",method="POST",route="/mcp/push",status="200"}' in text or \
        'route="/mcp/push"' in text
    assert 'context_index_queue_depth{tenant="default"} 1.0' in text
    assert 'context_units_stored{tenant="default"} 1.0' in text
    assert "context_replica_lag_seconds" in text
    drain(app)
    text = client.get("/metrics").get_data(as_text=True)
    assert 'context_index_queue_depth{tenant="default"} 0.0' in text
    assert "context_index_lag_seconds_count" in text


def test_metrics_count_indexed_purged_and_unlinked(clock, client, app):
    def totals():
        text = client.get("/metrics").get_data(as_text=True)
        return {name: float(re.search(rf"^context_{name}_total (\S+)$", text, flags=re.M).group(1))
                for name in ("units_indexed", "units_purged", "days_unlinked")}
    before = totals()
    now = int(time.time())
    client.post("/mcp/push", json=make_unit("doomed gnu", timestamp=now - 2 * 86_400, ttl=2 * 86_400 + 2))
    client.post("/mcp/push", json=make_unit("short gnu", timestamp=now - 10, ttl=12))
    client.post("/mcp/push", json=make_unit("lasting gnu"))
    drain(app)
    clock.advance(now + 2.5 - time.time())
    app_state(app).maintenance.run_once(force_janitor=True)
    after = totals()
    assert {k: after[k] - before[k] for k in after} == {"units_indexed": 3, "units_purged": 1, "days_unlinked": 1}


def _open_new_shard(path, barrier, results):
    from service.config import Config
    from service.store.sqlite.connections import Db
    barrier.wait()
    try:
        Db(path, "shard_schema.sql", Config()).write(lambda c: c.execute("INSERT INTO meta(key, value) VALUES ('x', 1) "
                                                                         "ON CONFLICT(key) DO NOTHING"))
        results.put("ok")
    except Exception as e:   # noqa: BLE001 - reported below
        results.put(repr(e))


def test_processes_creating_the_same_new_shard_at_once_all_succeed(tmp_path):
    """A push in one worker and the maintenance leader in another may create a day file together:
    switching it to WAL or running its schema met the other's lock ("database is locked", a 503)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    failures = []
    for trial in range(12):
        barrier, results = ctx.Barrier(5), ctx.Queue()
        procs = [ctx.Process(target=_open_new_shard, args=(tmp_path / f"{trial}.db", barrier, results))
                 for _ in range(5)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        failures += [r for r in (results.get(timeout=10) for _ in procs) if r != "ok"]
    assert failures == []
