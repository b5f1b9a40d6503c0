"""Search (docs/design.md §4 and §6): tokens, hostile queries, filters, consistency, ranking."""
import json
import time

import pytest

from conftest import assert_error, drain, make_unit
from service.state import app_state

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")


def push(client, content, **kw):
    rv = client.post("/mcp/push", json=make_unit(content, **kw))
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()["cid"]


def search(client, query, **kw):
    rv = client.post("/mcp/search", json={"query": query, "consistency": "strong", **kw})
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()


def cids(body):
    return [r["cid"] for r in body["results"]]


def test_chinese_compound_found_by_its_parts(client):
    cid = push(client, "新版订单管理系统上线了")
    push(client, "完全无关的内容")
    assert cids(search(client, "订单管理")) == [cid]
    assert cids(search(client, "管理系统")) == [cid]


def test_identifier_found_whole_and_by_part(client):
    cid = push(client, '{"order_id":"ORD-7890","status":"shipped"}')
    push(client, '{"order_id":"ORD-1111","status":"pending"}')
    assert cids(search(client, "ORD-7890"))[0] == cid
    assert cids(search(client, "7890")) == [cid]
    assert cid in cids(search(client, "order_id"))
    assert cid in cids(search(client, "api.v2 shipped"))


def test_english_and_chinese_in_one_unit(client):
    cid = push(client, "部署 deployment 失败: connection refused on port 5432")
    assert cids(search(client, "部署")) == [cid]
    assert cids(search(client, "refused connections")) == [cid]   # stemmed: connections -> connect


@pytest.mark.parametrize("query", ['"', "AND", "NEAR(", "*", "订单 OR", "x" * 10_000, "😀", "\x00", "a" * 16_384,
                                   "NOT", "(", ")", "^", ":", "col:val", '"unterminated', "-", "OR OR OR",
                                   "NEAR(a b, 2)", "\ud800", "{}", "' OR 1=1 --", "\\", "订单\x00管理", "   "])
def test_hostile_queries_never_500(client, query):
    push(client, "订单 AND NEAR things 😀 quoted \"text\"")
    body = json.dumps({"query": query, "consistency": "strong"})  # ASCII-escaped, so a lone surrogate survives
    rv = client.post("/mcp/search", data=body, content_type="application/json")
    assert rv.status_code in (200, 400), rv.get_data(as_text=True)
    if query != "\ud800":  # a lone surrogate cannot be put in a URL at all
        rv = client.get("/mcp/search", query_string={"q": query})
        assert rv.status_code in (200, 400)


def test_query_too_long_is_400(client):
    assert_error(client.post("/mcp/search", json={"query": "x" * 20_000}), 400, "query_too_long", "query")


@pytest.mark.parametrize("body,field", [
    ({}, "query"), ({"query": 5}, "query"), ({"query": "x", "top_k": 0}, "top_k"),
    ({"query": "x", "top_k": 101}, "top_k"), ({"query": "x", "top_k": True}, "top_k"),
    ({"query": "x", "types": ["nope"]}, "types"), ({"query": "x", "types": 3}, "types"),
    ({"query": "x", "min_score": 1.5}, "min_score"), ({"query": "x", "min_score": "high"}, "min_score"),
    ({"query": "x", "operator": "xor"}, "operator"), ({"query": "x", "consistency": "eventual"}, "consistency"),
    ({"query": "x", "after_seq": -1}, "after_seq"), ({"query": "x", "parent_cid": "zz"}, "parent_cid"),
    ({"query": "x", "since": "yesterday"}, "since"), ({"query": "x", "highlight": "yes"}, "highlight"),
    ({"query": "x", "bogus": 1}, "bogus"), ({"query": "x", "source": ""}, "source"),
])
def test_bad_search_parameters_are_400_with_field(client, body, field):
    rv = client.post("/mcp/search", json=body)
    assert rv.status_code == 400
    assert rv.get_json()["field"] == field


def test_get_search_parameters(client):
    cid = push(client, "alpha beta", type="user_input")
    push(client, "alpha gamma", type="tool_output")
    rv = client.get("/mcp/search", query_string={"q": "alpha", "types": "user_input", "consistency": "strong",
                                                 "top_k": "5", "highlight": "true"})
    assert rv.status_code == 200
    assert cids(rv.get_json()) == [cid]
    assert "**alpha**" in rv.get_json()["results"][0]["snippet"]
    assert_error(client.get("/mcp/search", query_string={"q": "a", "top_k": "ten"}), 400, "invalid_field", "top_k")


def test_strong_consistency_finds_a_fresh_push_at_once(client):
    cid = push(client, "freshly pushed zebra")
    body = search(client, "zebra")
    assert cids(body) == [cid]
    assert body["freshness"]["index_pending"] == 0


def test_after_seq_gives_read_your_writes(client):
    rv = client.post("/mcp/push", json=make_unit("quokka sighting")).get_json()
    body = client.post("/mcp/search", json={"query": "quokka", "after_seq": rv["seq"]}).get_json()
    assert cids(body) == [rv["cid"]]


def test_default_search_reads_replica_and_reports_freshness(client, app):
    push(client, "replicated walrus")
    # read-your-writes (issue 14): before any indexing, a default search indexes it and finds it
    body = client.post("/mcp/search", json={"query": "walrus"}).get_json()
    assert len(body["results"]) == 1 and body["freshness"]["index_pending"] == 0
    drain(app)
    body = client.post("/mcp/search", json={"query": "walrus"}).get_json()
    assert len(body["results"]) == 1
    assert body["freshness"] == {"replica_lag_ms": 0, "index_pending": 0}
    assert body["shards_searched"] == 1 and body["took_ms"] >= 0


def test_result_fields_and_scores(client):
    push(client, "the quick brown fox jumps", metadata={"k": 1})
    push(client, "fox fox fox den")
    body = search(client, "fox", explain=True, highlight=True)
    assert len(body["results"]) == 2
    for r in body["results"]:
        for key in ("cid", "type", "source", "timestamp", "ttl", "content", "metadata", "bm25_score", "score",
                    "expires_at", "snippet", "explain"):
            assert key in r
        assert 0 < r["score"] <= 1 and r["bm25_score"] > 0
        term = r["explain"]["terms"][0]
        assert term["term"] == "fox" and term["idf"] > 0
        assert abs(term["score"] - r["bm25_score"]) < 1e-5
        ex = r["explain"]
        best = body["results"][0]["bm25_score"]
        assert ex["best_bm25"] == pytest.approx(best, rel=1e-5)
        assert ex["best_coverage"] == pytest.approx(min(1.0, best / term["idf"]), rel=1e-5)
        assert r["score"] == pytest.approx(r["bm25_score"] / best * ex["best_coverage"] ** 0.5, rel=1e-5)
    scores = [r["bm25_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert body["results"][0]["content"] == "fox fox fox den"


def test_score_scale_exact_match_passes_a_half_threshold(client):
    """Issue 14, item 9: the best match of a query it answers scores 1, so Dify's default threshold
    of 0.5 keeps it; a weak match of the same query scores in proportion; a query the store only
    half answers scores every result lower."""
    exact = push(client, "deploy the payments service to staging")
    weak = push(client, "the staging cluster " + "unrelated words here " * 12)
    push(client, "grocery list: apples pears")
    body = search(client, "deploy payments service staging")
    by_cid = {r["cid"]: r for r in body["results"]}
    assert body["results"][0]["cid"] == exact and by_cid[exact]["score"] == 1.0
    assert 0 < by_cid[weak]["score"] < 0.5
    assert by_cid[weak]["score"] == pytest.approx(by_cid[weak]["bm25_score"] / by_cid[exact]["bm25_score"], rel=1e-5)
    # only "staging" matches anything: the best match covers a fraction of the query's weight
    half = search(client, "staging kubernetes helm rollback", explain=True)["results"]
    assert half and all(r["score"] < 0.75 for r in half)
    assert half[0]["score"] == pytest.approx(half[0]["explain"]["best_coverage"] ** 0.5, rel=1e-5)


def test_packed_context_leaves_out_results_far_below_the_best(client):
    strong = push(client, "invoice 4471 was refunded to the customer on monday")
    faint = push(client, "monday " + "standup notes and other chatter " * 20)
    body = client.post("/mcp/context", json={"query": "invoice 4471 refunded monday",
                                             "consistency": "strong"}).get_json()
    assert [i["cid"] for i in body["items"]] == [strong]
    assert [(d["cid"], d["reason"]) for d in body["dropped"]] == [(faint, "far_below_best")]
    assert faint not in body["context"]


def test_operator_and(client):
    both = push(client, "apple banana")
    push(client, "apple cherry")
    assert set(cids(search(client, "apple banana"))) >= {both}
    assert cids(search(client, "apple banana", operator="and")) == [both]


def test_filters_types_source_time_parent(client):
    now = int(time.time())
    root = push(client, "kiwi root", type="user_input", source="chat_v1_prod", timestamp=now - 100)
    a = push(client, "kiwi tool", type="tool_output", source="curl_v2_prod", timestamp=now - 50, parent_cid=root)
    b = push(client, "kiwi think", type="model_thinking", source="curl_v2_dev", timestamp=now - 10)
    assert cids(search(client, "kiwi", types=["tool_output", "model_thinking"], top_k=10)) != []
    assert set(cids(search(client, "kiwi", types=["tool_output", "model_thinking"]))) == {a, b}
    assert cids(search(client, "kiwi", source="chat_v1_prod")) == [root]
    assert set(cids(search(client, "kiwi", source="curl_*"))) == {a, b}
    assert cids(search(client, "kiwi", source="curl_v2_d*")) == [b]
    assert set(cids(search(client, "kiwi", since=now - 60))) == {a, b}
    assert set(cids(search(client, "kiwi", until=now - 60))) == {root}
    assert cids(search(client, "kiwi", since=now - 60, until=now - 20)) == [a]
    assert cids(search(client, "kiwi", parent_cid=root)) == [a]
    # every kiwi unit holds the term once at about average length: each scores 1, none passes 1.0 + ε, but
    # the root, the head of a's thread, which ranks below its matching turn (docs/design.md §6)
    found = {r["cid"]: r["score"] for r in search(client, "kiwi")["results"]}
    assert found[a] == found[b] == 1.0 and found[root] < 1.0
    assert len(search(client, "kiwi", min_score=1.0)["results"]) == 2
    assert search(client, "kiwi banana", min_score=0.9)["results"] == []
    assert len(search(client, "kiwi", top_k=1)["results"]) == 1


def test_source_prefix_is_not_a_pattern(client):
    push(client, "pattern test", source="a%b_c")
    push(client, "pattern test", source="axbyc")
    assert len(search(client, "pattern", source="a%b_*")["results"]) == 1


def test_expired_units_never_appear(clock, client, app):
    now = int(time.time())
    push(client, "ephemeral narwhal", timestamp=now - 10, ttl=12)
    keep = push(client, "lasting narwhal")
    drain(app)
    assert len(search(client, "narwhal")["results"]) == 2
    clock.advance(now + 2.2 - time.time())
    assert cids(search(client, "narwhal")) == [keep]
    assert cids(client.post("/mcp/search", json={"query": "narwhal"}).get_json()) == [keep]


def test_context_packing_under_budget(client):
    ids = {}
    for t in ("user_input", "tool_output", "model_thinking", "system_notice"):
        ids[t] = push(client, f"budget topic {t} " + "filler words " * 40, type=t)
    full = client.post("/mcp/context", json={"query": "budget topic", "budget_tokens": 5000,
                                             "consistency": "strong"}).get_json()
    assert {i["cid"] for i in full["items"]} == set(ids.values()) and full["dropped"] == []
    assert "untrusted data" in full["context"]
    for t, cid in ids.items():
        assert f"[{t} {cid}]" in full["context"]
    tight = client.post("/mcp/context", json={"query": "budget topic", "budget_tokens": 400,
                                              "consistency": "strong"}).get_json()
    dropped_types = [d["type"] for d in tight["dropped"]]
    assert dropped_types[:2] == ["model_thinking", "system_notice"]
    assert all(d["reason"] == "over_budget" for d in tight["dropped"])
    assert tight["tokens"] <= 400
    assert f"[model_thinking {ids['model_thinking']}]" not in tight["context"]
    short = client.post("/mcp/context", json={"query": "budget topic", "max_chars_per_item": 20,
                                              "consistency": "strong"}).get_json()
    assert all(i["truncated"] for i in short["items"])
    assert_error(client.post("/mcp/context", json={"query": "x", "budget_tokens": 0}), 400, "invalid_field",
                 "budget_tokens")
    assert_error(client.post("/mcp/context", json={"query": "x", "budget_tokens": "lots"}), 400, "invalid_field")


def test_an_item_over_the_budget_does_not_empty_the_context(client):
    """Dropping by score alone dropped the smaller item first and then the larger, best one, which alone was
    still over the budget: nothing answered where the smaller one fit (a hook's 400 tokens, a long tool log)."""
    large = push(client, "budget topic " * 40 + "filler words " * 150, type="tool_output")     # the better match
    small = push(client, "budget topic " + "filler words " * 60, type="tool_output")
    rv = client.post("/mcp/context", json={"query": "budget topic", "budget_tokens": 400,
                                           "consistency": "strong"}).get_json()
    assert [i["cid"] for i in rv["items"]] == [small] and f"[tool_output {small}]" in rv["context"]
    assert [(d["cid"], d["reason"]) for d in rv["dropped"]] == [(large, "over_budget")]
    assert rv["dropped"][0]["tokens"] > 400 >= rv["tokens"]
    roomy = client.post("/mcp/context", json={"query": "budget topic", "budget_tokens": 1000,
                                              "consistency": "strong"}).get_json()
    assert [i["cid"] for i in roomy["items"]] == [large, small] and roomy["dropped"] == []


def test_content_is_data_not_fts_syntax(client):
    cid = push(client, 'NEAR("a" "b") OR * AND "quoted" col:val')
    assert cids(search(client, "NEAR")) == [cid]
    assert cids(search(client, "col:val")) == [cid]


def test_highlight_marks_whole_matching_words(client):
    push(client, "Where is my order ORD-7890? It shipped yesterday. 订单管理系统已上线")
    r = search(client, "ORD-7890 shipping 订单", highlight=True)["results"][0]
    assert "**ORD-7890**" in r["snippet"] and "**shipped**" in r["snippet"] and "**订单**" in r["snippet"]
    assert "**ord**er" not in r["snippet"].lower()
    long_text = "filler " * 200 + "the needle word appears here " + "filler " * 200
    push(client, long_text)
    r = search(client, "needle", highlight=True)["results"][0]
    assert "**needle**" in r["snippet"] and r["snippet"].startswith("…") and len(r["snippet"]) < 260


@pytest.mark.parametrize("qs", ["q=a&since=99999999999999999999", "q=a&until=99999999999999999999",
                                "q=a&since=99999999999999999999&until=99999999999999999999999"])
def test_huge_times_are_not_a_500(client, qs):
    push(client, "a unit")
    rv = client.get("/mcp/search?" + qs)
    assert rv.status_code == 200


@pytest.mark.sqlite_only
def test_strong_search_cpu_is_capped(make_app):
    """Issue 12, finding 9: many common terms on the primary files cost seconds of CPU; past
    CONTEXT_SEARCH_CPU_MS the search stops with a clear 422 (the read index needs no cap)."""
    words = [f"common{i}" for i in range(40)]
    app = make_app(replica_debounce_ms=0, search_cpu_ms=5)
    client = app.test_client()
    units = [make_unit(" ".join(words[j % 40] for j in range(i, i + 60)) + f" unit{i}") for i in range(3000)]
    for start in range(0, len(units), 1000):
        assert client.post("/mcp/push", json={"units": units[start:start + 1000]}).status_code == 200
    drain(app)
    body = {"query": " ".join(words), "top_k": 100}
    rv = client.post("/mcp/search", json=body | {"consistency": "strong"})
    assert_error(rv, 422, "query_too_expensive", "query")
    assert "CPU" in rv.get_json()["error"]
    # the same query on the read index, and a cheap strong one, answer
    assert len(client.post("/mcp/search", json=body).get_json()["results"]) == 100
    assert client.post("/mcp/search", json={"query": "unit7", "consistency": "strong"}).status_code == 200
    app = make_app(search_cpu_ms=0)
    rv = app.test_client().post("/mcp/search", json=body | {"consistency": "strong"})
    assert rv.status_code == 200 and len(rv.get_json()["results"]) == 100


@pytest.mark.parametrize("path", ["/mcp/search", "/mcp/units", "/mcp/export"])
def test_a_source_filter_with_control_characters_is_400(client, path):
    """No source holds a control character (docs/design.md §3), so no filter may: a clear 400 on both
    backends (on PostgreSQL a U+0000 in a filter once reached the database and gave a 500)."""
    client.post("/mcp/push", json=make_unit("parcel on the way", source="ctl_v1"))
    for bad in ("ctl\x00v1", "ctl\nv1*", "\x9f"):
        if path == "/mcp/search":
            rv = client.post(path, json={"query": "parcel", "source": bad, "consistency": "strong"})
        else:
            rv = client.get(path, query_string={"source": bad})
        assert rv.status_code == 400 and rv.get_json()["field"] == "source", rv.get_json()


def test_a_unit_holding_one_enormous_word_is_indexed_and_found_by_its_other_words(app, client):
    """A 300 kB word (a base64 blob) is no token: PostgreSQL's GIN index refused it, and the unit's indexing
    failed for good (every strong search of the tenant 503). Its other words are found on both stores."""
    from service.tokenize import MAX_TOKEN_CHARS
    blob = "QUJD" * 75_000
    cid = push(client, f"upload receipt {blob} ORD-{'7' * 300} done")
    drain(app)
    assert search(client, "upload receipt", consistency="strong")["results"][0]["cid"] == cid
    assert search(client, "upload receipt", consistency="replica")["results"][0]["cid"] == cid
    assert search(client, blob[:MAX_TOKEN_CHARS + 1])["results"] == []
    tokens = app_state(app).store.tokenizer.tokens(f"x {blob} ORD-{'7' * 300}")
    assert max(map(len, tokens)) <= MAX_TOKEN_CHARS and "ord" in tokens
