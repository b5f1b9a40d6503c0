"""Impact lists in past-day replicas (service/impacts.py): the same exact BM25 top k as scoring
every match, kept up to date through deletes, expiry, day changes and parameter changes."""
import sqlite3
import time

import pytest

from conftest import make_unit
from test_shards import corpus

DAY = 86_400


def docs_and_queries(n, seed):
    # Longer units, more skewed words and longer queries than test_shards: deeper impact lists.
    return corpus(n, seed, longest=60, alpha=1.1, zipf_share=0.6, most_terms=5, n_queries=60)


def open_app(data_dir, **config):
    from service import create_app
    return create_app({"data_dir": str(data_dir), "background": False, **config})


def settle(app):
    maint = app.extensions["context_maintenance"]
    while maint.run_once():
        pass
    time.sleep(0.25)          # past the replica debounce (set low below): one more pass copies
    maint.run_once()


@pytest.fixture
def two_apps(tmp_path):
    """The same data read with impact lists (fast) and by scoring every FTS5 match (exact)."""
    fast = open_app(tmp_path / "d", impact_min_docs=50, impact_quiet_s=0, replica_debounce_ms=100)
    exact = open_app(tmp_path / "d", impact_min_docs=0, exact_match_limit=10**9, replica_debounce_ms=100)
    yield fast, exact
    fast.extensions["context_shutdown"]()
    exact.extensions["context_shutdown"]()


def push(app, docs, *, now, days=(1, 2, 3), ttl=30 * DAY):
    units = [make_unit(text, timestamp=now - days[i % len(days)] * DAY - i, ttl=ttl, source="impacts")
             for i, text in enumerate(docs)]
    rv = app.test_client().post("/mcp/push", json={"units": units})
    assert all(r["status"] == "ok" for r in rv.get_json()["results"])
    return [r["cid"] for r in rv.get_json()["results"]]


def ranked(app, body):
    rv = app.test_client().post("/mcp/search", json=body)
    assert rv.status_code == 200, rv.get_json()
    return [(r["bm25_score"], r["cid"]) for r in rv.get_json()["results"]]


def lists_used(monkeypatch):
    import service.impacts as impacts
    calls = {"first": 0, "second": 0}
    first, second = impacts.first_pass, impacts.read_down_to

    def counting_first(*a, **k):
        calls["first"] += 1
        return first(*a, **k)

    def counting_second(*a, **k):
        calls["second"] += 1
        return second(*a, **k)
    monkeypatch.setattr(impacts, "first_pass", counting_first)
    monkeypatch.setattr(impacts, "read_down_to", counting_second)
    return calls


def test_past_day_replicas_get_impact_lists_and_today_does_not(two_apps):
    from service import impacts
    fast, _ = two_apps
    now = int(time.time())
    docs, _ = docs_and_queries(400, 1)
    push(fast, docs, now=now, days=(0, 1, 2))
    settle(fast)
    t = fast.extensions["context_store"].tenant("default")
    today = time.strftime("%Y-%m-%d", time.gmtime(now))
    found = {}
    for day in fast.extensions["context_store"].live_days(t):
        conn = sqlite3.connect(f"file:{t.replica_path(day)}?mode=ro", uri=True)
        try:
            found[day] = impacts.info(conn) is not None
            if found[day]:
                # Every posting of the file is listed, with the tf FTS5 holds.
                conn.execute("CREATE VIRTUAL TABLE temp.inst USING fts5vocab(main, units_fts, instance)")
                postings = conn.execute("SELECT term, doc, count(*) FROM temp.inst GROUP BY term, doc").fetchall()
                listed = conn.execute("SELECT t.term, i.doc, i.tf FROM impacts i "
                                      "JOIN impact_terms t ON t.tid = i.tid").fetchall()
                assert sorted(listed) == sorted(postings) and len(postings) > 1000
        finally:
            conn.close()
    assert len(found) == 3
    assert found.pop(today) is False
    assert all(found.values())


@pytest.mark.parametrize("whole_list", [120, 0])
def test_lists_give_the_exact_top_k(two_apps, monkeypatch, whole_list):
    import service.search as search
    fast, exact = two_apps
    now = int(time.time())
    docs, queries = docs_and_queries(900, 2)
    push(fast, docs, now=now, days=(1, 2, 3, 0))     # three past days with lists, today without
    settle(fast)
    # 0: pass 1 reads only the best units of every list, so pass 2 must read deeper.
    monkeypatch.setattr(search, "IMPACT_WHOLE_LIST", whole_list)
    calls = lists_used(monkeypatch)
    compared = 0
    for i, q in enumerate(queries):
        for body in ({"query": q, "top_k": 10}, {"query": q, "top_k": 1 + i % 7},
                     {"query": q, "top_k": 25, "min_score": 0.4}):
            want = ranked(exact, body)
            assert ranked(fast, body) == want, body
            compared += len(want)
    assert compared > 1500
    assert calls["first"] > 0
    if whole_list == 0:
        assert calls["second"] > 0       # the lists were read deeper than their first rows


def test_expired_and_deleted_units_never_come_back_through_lists(two_apps, monkeypatch):
    fast, exact = two_apps
    now = int(time.time())
    docs, queries = docs_and_queries(600, 3)
    cids = push(fast, docs, now=now)
    # Units that expire in a moment stay in the replica (the janitor has not run) with high impacts.
    short = push(fast, ["refund refund refund invoice"] * 3, now=now, days=(1,), ttl=DAY + 12)
    settle(fast)
    assert {c for _, c in ranked(fast, {"query": "refund invoice", "top_k": 50})} >= set(short)
    time.sleep(max(0.0, now + 13 - time.time()))
    calls = lists_used(monkeypatch)
    got = ranked(fast, {"query": "refund invoice", "top_k": 50})
    assert not set(short) & {c for _, c in got}
    assert got == ranked(exact, {"query": "refund invoice", "top_k": 50})
    assert calls["first"] > 0
    # Deleting a past-day unit re-copies its replica with fresh lists.
    top = ranked(fast, {"query": queries[0], "top_k": 3})[0][1]
    assert fast.test_client().delete(f"/mcp/units/{top}").status_code == 200
    settle(fast)
    after = ranked(fast, {"query": queries[0], "top_k": 3})
    assert top not in {c for _, c in after}
    assert after == ranked(exact, {"query": queries[0], "top_k": 3})
    assert set(cids) > {c for _, c in after}


def test_older_replicas_and_changed_parameters_get_lists_rebuilt(tmp_path):
    from service import impacts
    now = int(time.time())
    docs, queries = docs_and_queries(300, 4)
    plain = open_app(tmp_path / "d", impact_min_docs=0, replica_debounce_ms=100)
    push(plain, docs, now=now)
    settle(plain)
    plain.extensions["context_shutdown"]()

    def lists_params(app):
        t = app.extensions["context_store"].tenant("default")
        out = []
        for day in app.extensions["context_store"].live_days(t):
            conn = sqlite3.connect(f"file:{t.replica_path(day)}?mode=ro", uri=True)
            try:
                out.append(impacts.info(conn))
            finally:
                conn.close()
        return out

    app = open_app(tmp_path / "d", impact_min_docs=50, impact_quiet_s=0, replica_debounce_ms=100)
    try:
        assert lists_params(app) == [None, None, None]      # replicas from before impact lists
        app.extensions["context_maintenance"].run_once()
        assert all(p is not None and p["k1"] == 1.2 for p in lists_params(app))
    finally:
        app.extensions["context_shutdown"]()
    tuned = open_app(tmp_path / "d", impact_min_docs=50, impact_quiet_s=0, bm25_k1=0.9, replica_debounce_ms=100)
    try:
        # Lists built for another k1 are not used; the leader rebuilds them.
        before = ranked(tuned, {"query": queries[1], "top_k": 10})
        tuned.extensions["context_maintenance"].run_once()
        assert all(p["k1"] == 0.9 for p in lists_params(tuned))
        assert ranked(tuned, {"query": queries[1], "top_k": 10}) == before
        t = tuned.extensions["context_store"].tenant("default")
        first_day = tuned.extensions["context_store"].live_days(t)[0]
    finally:
        tuned.extensions["context_shutdown"]()
    # Lists of another format (an older release) are not read, and are rebuilt.
    conn = sqlite3.connect(str(t.replica_path(first_day)))
    conn.execute("UPDATE impact_meta SET format = format - 1")
    conn.commit()
    conn.close()
    again = open_app(tmp_path / "d", impact_min_docs=50, impact_quiet_s=0, bm25_k1=0.9, replica_debounce_ms=100)
    try:
        assert lists_params(again)[0]["format"] == impacts.FORMAT - 1
        assert ranked(again, {"query": queries[1], "top_k": 10}) == before
        again.extensions["context_maintenance"].run_once()
        assert [p["format"] for p in lists_params(again)] == [impacts.FORMAT] * 3
    finally:
        again.extensions["context_shutdown"]()


def test_too_deep_lists_fall_back_to_fts5_and_stay_exact(tmp_path, monkeypatch):
    import service.search as search
    fast = open_app(tmp_path / "d", impact_min_docs=50, impact_quiet_s=0, exact_match_limit=10**9, replica_debounce_ms=100)
    exact = open_app(tmp_path / "d", impact_min_docs=0, exact_match_limit=10**9, replica_debounce_ms=100)
    try:
        docs, queries = docs_and_queries(500, 5)
        push(fast, docs, now=int(time.time()))
        settle(fast)
        calls = lists_used(monkeypatch)
        monkeypatch.setattr(search, "IMPACT_MAX_READ", 3)     # every deeper read is "too many"
        monkeypatch.setattr(search, "IMPACT_WHOLE_LIST", 0)   # and pass 1 leaves every list unfinished
        for q in queries[:20]:
            body = {"query": q, "top_k": 10}
            assert ranked(fast, body) == ranked(exact, body), q
        assert calls["second"] > 0
    finally:
        fast.extensions["context_shutdown"]()
        exact.extensions["context_shutdown"]()


def test_a_day_still_changing_gets_lists_only_once_quiet(tmp_path):
    """Backfilling an old day must not rebuild its lists on every refresh (index lag): the copy
    goes without lists while changes arrive, and gets them once the day has been quiet a while."""
    from service import impacts
    app = open_app(tmp_path / "d", impact_min_docs=50, impact_quiet_s=3, replica_debounce_ms=100)
    try:
        docs, queries = docs_and_queries(300, 6)
        push(app, docs, now=int(time.time()), days=(2,))
        settle(app)
        t = app.extensions["context_store"].tenant("default")
        day = app.extensions["context_store"].live_days(t)[0]

        def has_lists():
            conn = sqlite3.connect(f"file:{t.replica_path(day)}?mode=ro", uri=True)
            try:
                return impacts.info(conn) is not None
            finally:
                conn.close()
        assert not has_lists()
        found = ranked(app, {"query": queries[0], "top_k": 5})
        time.sleep(3.2)
        app.extensions["context_maintenance"].run_once()
        assert has_lists()
        assert ranked(app, {"query": queries[0], "top_k": 5}) == found
        # Any other change (a delete, the janitor's purge) also makes the day unquiet for a while:
        # the copy reflects it at once, without lists, and gets them back later.
        assert app.test_client().delete(f"/mcp/units/{found[0][1]}").status_code == 200
        time.sleep(0.15)
        app.extensions["context_maintenance"].run_once()
        assert not has_lists()
        assert found[0][1] not in {c for _, c in ranked(app, {"query": queries[0], "top_k": 5})}
        time.sleep(3.2)
        app.extensions["context_maintenance"].run_once()
        assert has_lists()
        exact = open_app(tmp_path / "d", impact_min_docs=0, exact_match_limit=10**9)
        try:
            after = ranked(app, {"query": queries[0], "top_k": 5})
            assert found[0][1] not in {c for _, c in after}
            assert after == ranked(exact, {"query": queries[0], "top_k": 5})
        finally:
            exact.extensions["context_shutdown"]()
    finally:
        app.extensions["context_shutdown"]()
