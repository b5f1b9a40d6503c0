"""Dify External Knowledge API (POST /retrieval): contract tests sending what Dify sends.

Dify's side (api/services/external_knowledge_service.py): registration posts to
``{endpoint}/retrieval`` with only ``Authorization: Bearer <key>`` and no body, and fails on
403/404/502; retrieval posts ``data=json.dumps(request_params)`` with ``Content-Type:
application/json``, where ``top_k`` may be None and ``metadata_condition`` is
``MetadataCondition.model_dump()`` or None.
"""
import json
import re
import time

import pytest
import requests

from conftest import close_app, make_unit, new_app
from service.state import app_state

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")

KEYS = "difykey-0123456789abcdef:acme:search+push;pushonly-0123456789abcdef:acme:push;betakey-0123456789abcdef:beta:search+push"
NOW = int(time.time())
QUERY = "ORD-7890 order"


def dify_request(query=QUERY, *, knowledge_id="acme", top_k=None, score_threshold=0.0, metadata_condition=None):
    """Exactly Dify's request_params, key order included."""
    return {"retrieval_setting": {"top_k": top_k, "score_threshold": score_threshold}, "query": query,
            "knowledge_id": knowledge_id, "metadata_condition": metadata_condition}


def auth(key="difykey-0123456789abcdef"):
    return {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, module_store_config):
    app = new_app(tmp_path_factory.mktemp("dify") / "data", api_keys=KEYS, **module_store_config)
    client = app.test_client()
    units = {
        "u1": make_unit("订单 ORD-7890 已发货 order shipped", type="tool_output", source="curl_tool_v2.1_prod",
                        timestamp=NOW - 100, metadata={"http_status": 200, "region": "eu",
                                                       "tags": ["orders", "shipping"], "created": "2024-05-01"}),
        "u2": make_unit("customer asks: order ORD-7890 status?", type="user_input", source="chat_ui_1.0_prod",
                        timestamp=NOW - 50, metadata={"http_status": 404, "region": "us"}),
    }
    cids = {}
    for name, unit in units.items():
        rv = client.post("/mcp/push", json=unit, headers=auth())
        assert rv.status_code == 200, rv.get_json()
        cids[name] = rv.get_json()["cid"]
    rv = client.post("/mcp/push", headers=auth(), json=make_unit(
        "ORD-7890 reasoning about the order", type="model_thinking", source="agent_v3_dev", timestamp=NOW - 10,
        parent_cid=cids["u2"]))
    cids["u3"] = rv.get_json()["cid"]
    rv = client.post("/mcp/push", headers=auth("betakey-0123456789abcdef"), json=make_unit("ORD-7890 order beta secret"))
    assert rv.status_code == 200
    # Index now (read-your-writes); without background threads there is no replica, reads use the primary.
    for key in ("difykey-0123456789abcdef", "betakey-0123456789abcdef"):
        rv = client.post("/mcp/search", headers=auth(key), json={"query": QUERY, "consistency": "strong"})
        assert rv.status_code == 200
    yield client, cids
    close_app(app)
    app_state(app).shutdown()


def post(client, body, headers=None, path="/retrieval"):
    """Send a pre-serialized body, as Dify does."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(path, data=data, headers=auth() if headers is None else headers)


def test_exact_dify_request_returns_records(seeded):
    client, cids = seeded
    rv = post(client, dify_request())
    assert rv.status_code == 200
    body = rv.get_json()
    assert set(body) == {"records"}
    records = body["records"]
    assert {r["metadata"]["cid"] for r in records} == set(cids.values())     # never tenant beta's unit
    scores = [r["score"] for r in records]
    assert scores == sorted(scores, reverse=True)
    for r in records:
        assert set(r) == {"content", "score", "title", "metadata"}
        assert isinstance(r["content"], str) and "ORD-7890" in r["content"]
        assert isinstance(r["score"], float) and 0 < r["score"] <= 1
        assert isinstance(r["title"], str) and r["metadata"]["cid"] in r["title"]
        meta = r["metadata"]
        assert isinstance(meta, dict)
        for key in ("cid", "type", "source", "timestamp", "ttl", "expires_at", "parent_cid"):
            assert key in meta
    by_cid = {r["metadata"]["cid"]: r for r in records}
    u1 = by_cid[cids["u1"]]["metadata"]
    assert (u1["type"], u1["source"], u1["timestamp"], u1["http_status"]) == (
        "tool_output", "curl_tool_v2.1_prod", NOW - 100, 200)
    assert by_cid[cids["u3"]]["metadata"]["parent_cid"] == cids["u2"]


def test_registration_probe_without_body(seeded):
    client, _ = seeded
    rv = client.post("/retrieval", headers={"Authorization": "Bearer difykey-0123456789abcdef"})
    assert rv.status_code == 200
    assert rv.get_json() == {"records": []}


@pytest.mark.parametrize("knowledge_id", ["", "acme"])
def test_empty_or_own_knowledge_id_is_the_keys_tenant(seeded, knowledge_id):
    client, cids = seeded
    rv = post(client, dify_request(knowledge_id=knowledge_id))
    assert rv.status_code == 200
    assert {r["metadata"]["cid"] for r in rv.get_json()["records"]} == set(cids.values())


@pytest.mark.parametrize("knowledge_id", ["beta", "nope", "../beta", "ACME", "default"])
def test_other_or_unknown_knowledge_id_is_2001_without_leaking(seeded, knowledge_id):
    client, _ = seeded
    rv = post(client, dify_request(knowledge_id=knowledge_id))
    assert rv.status_code == 404
    assert rv.get_json() == {"error_code": 2001, "error_msg": "The knowledge base does not exist."}


def test_metadata_condition_absent(seeded):
    client, cids = seeded
    body = dify_request()
    del body["metadata_condition"]
    rv = post(client, body)
    assert rv.status_code == 200
    assert len(rv.get_json()["records"]) == 3


def test_top_k_and_score_threshold(seeded):
    client, _ = seeded
    rv = post(client, dify_request(top_k=2))
    assert len(rv.get_json()["records"]) == 2
    all_scores = sorted((r["score"] for r in post(client, dify_request()).get_json()["records"]), reverse=True)
    cut = (all_scores[0] + all_scores[-1]) / 2
    rv = post(client, dify_request(score_threshold=cut))
    kept = [r["score"] for r in rv.get_json()["records"]]
    assert kept and all(s >= cut for s in kept) and len(kept) < len(all_scores)
    # the best match of a query the store answers fully scores 1 (docs/consistency-and-scores.md)
    assert [r["score"] for r in post(client, dify_request(score_threshold=1.0)).get_json()["records"]] == [1.0]


def cond(name, op, value=None, logical="and", more=()):
    conditions = [{"name": name, "comparison_operator": op, "value": value}, *more]
    return {"logical_operator": logical, "conditions": conditions}


CASES = [
    (cond("type", "is", "tool_output"), {"u1"}),
    (cond("type", "is not", "tool_output"), {"u2", "u3"}),
    (cond("source", "start with", "curl_"), {"u1"}),
    (cond("source", "end with", "_prod"), {"u1", "u2"}),
    (cond("source", "contains", "agent"), {"u3"}),
    (cond("source", "not contains", "agent"), {"u1", "u2"}),
    (cond("type", "in", ["user_input", "model_thinking"]), {"u2", "u3"}),
    (cond("type", "not in", "user_input, model_thinking"), {"u1"}),
    (cond("region", "empty"), {"u3"}),
    (cond("region", "not empty"), {"u1", "u2"}),
    (cond("http_status", "=", 200), {"u1"}),
    (cond("http_status", "≠", 200), {"u2"}),
    (cond("http_status", ">", "200"), {"u2"}),
    (cond("http_status", "<", 404), {"u1"}),
    (cond("http_status", "≥", 200), {"u1", "u2"}),
    (cond("http_status", "≤", 200.0), {"u1"}),
    (cond("http_status", ">=", 404), {"u2"}),
    (cond("timestamp", "before", NOW - 30), {"u1", "u2"}),
    (cond("timestamp", "after", str(NOW - 30)), {"u3"}),
    (cond("created", "before", "2024-06-01"), {"u1"}),
    (cond("created", "after", "2024-06-01T00:00:00Z"), set()),
    (cond("tags", "contains", "orders"), {"u1"}),
    (cond("metadata.region", "is", "us"), {"u2"}),
    (cond("type", "is", "tool_output", "or", [{"name": "source", "comparison_operator": "contains",
                                               "value": "agent"}]), {"u1", "u3"}),
    (cond("source", "end with", "_prod", "and", [{"name": "http_status", "comparison_operator": ">",
                                                  "value": 200}]), {"u2"}),
    ({"logical_operator": None, "conditions": None}, {"u1", "u2", "u3"}),
    ({"logical_operator": "and", "conditions": []}, {"u1", "u2", "u3"}),
]


@pytest.mark.parametrize("condition,expected", CASES, ids=[f"{c['conditions'][0]['name']}{c['conditions'][0]['comparison_operator']}"
                                                           if c["conditions"] else "none" for c, _ in CASES])
def test_metadata_condition_filters(seeded, condition, expected):
    client, cids = seeded
    rv = post(client, dify_request(metadata_condition=condition))
    assert rv.status_code == 200, rv.get_json()
    assert {r["metadata"]["cid"] for r in rv.get_json()["records"]} == {cids[n] for n in expected}


def test_metadata_condition_then_top_k(seeded):
    client, cids = seeded
    rv = post(client, dify_request(top_k=1, metadata_condition=cond("source", "end with", "_prod")))
    records = rv.get_json()["records"]
    assert len(records) == 1 and records[0]["metadata"]["cid"] in {cids["u1"], cids["u2"]}


@pytest.mark.parametrize("data", [
    b"{not json", b"\xff\xfe", b"[]", b'"text"', b"null",
    json.dumps({"knowledge_id": "acme"}),
    json.dumps(dict(dify_request(), query=5)),
    json.dumps(dict(dify_request(), knowledge_id=7)),
    json.dumps(dict(dify_request(), retrieval_setting="top")),
    json.dumps(dify_request(top_k="5")), json.dumps(dify_request(top_k=0)), json.dumps(dify_request(top_k=True)),
    json.dumps(dify_request(top_k=2.5)),
    json.dumps(dify_request(score_threshold=2)), json.dumps(dify_request(score_threshold=-0.1)),
    json.dumps(dify_request(score_threshold="0.5")),
    json.dumps(dify_request(metadata_condition="x")),
    json.dumps(dify_request(metadata_condition={"logical_operator": "xor", "conditions": []})),
    json.dumps(dify_request(metadata_condition={"conditions": "type"})),
    json.dumps(dify_request(metadata_condition={"conditions": ["type"]})),
    json.dumps(dify_request(metadata_condition=cond("type", "like", "x"))),
    json.dumps(dify_request(metadata_condition=cond("", "is", "x"))),
    json.dumps(dify_request(metadata_condition=cond("http_status", ">", "many"))),
    json.dumps(dify_request(metadata_condition=cond("timestamp", "before", "yesterday"))),
    json.dumps(dify_request(metadata_condition=cond("type", "in", {"a": 1}))),
    json.dumps(dify_request(metadata_condition=cond("type", "is", None))),
    # the strict decoder of every door: NaN and Infinity are not JSON
    '{"knowledge_id": "", "query": "x", "retrieval_setting": {"top_k": 5, "score_threshold": NaN}}',
    '{"knowledge_id": "", "query": "x", "retrieval_setting": {"top_k": Infinity, "score_threshold": 0.1}}',
])
def test_bad_bodies_are_400_in_difys_shape(seeded, data):
    client, _ = seeded
    rv = post(client, data)
    assert rv.status_code == 400, rv.get_data()
    body = rv.get_json()
    assert set(body) == {"error_code", "error_msg"}
    assert body["error_code"] == 3001 and body["error_msg"]


def test_empty_query_and_huge_query(seeded):
    client, _ = seeded
    assert post(client, dify_request(query="  ")).get_json() == {"records": []}
    rv = post(client, dify_request(query="ORD-7890 " * 5000))
    assert rv.status_code == 200


@pytest.mark.parametrize("header,code", [
    (None, 1001), ("Basic ZGlmeTprZXk=", 1001), ("Bearer", 1001), ("Bearer a b", 1001), ("difykey-0123456789abcdef", 1001),
    ("Bearer wrongkey", 1002), ("Bearer pushonly-0123456789abcdef", 1002),
])
@pytest.mark.parametrize("with_body", [True, False])
def test_bad_authorization_is_401_never_403(seeded, header, code, with_body):
    client, _ = seeded
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    rv = client.post("/retrieval", data=json.dumps(dify_request()) if with_body else b"", headers=headers)
    assert rv.status_code == 401
    body = rv.get_json()
    assert body["error_code"] == code and isinstance(body["error_msg"], str)


def test_double_slash_path(seeded):
    client, cids = seeded
    rv = client.post("/", data=json.dumps(dify_request()), headers=auth(),
                     environ_overrides={"PATH_INFO": "//retrieval"})
    assert rv.status_code == 200
    assert len(rv.get_json()["records"]) == 3


def test_open_mode_default_tenant(client):
    client.post("/mcp/push", json=make_unit("open ORD-7890 order"))
    client.post("/mcp/search", json={"query": "ORD-7890", "consistency": "strong"})
    for kid in ("", "default"):
        rv = post(client, dify_request(knowledge_id=kid), headers={"Content-Type": "application/json"})
        assert rv.status_code == 200 and len(rv.get_json()["records"]) == 1
    rv = post(client, dify_request(knowledge_id="acme"), headers={"Content-Type": "application/json"})
    assert rv.status_code == 404 and rv.get_json()["error_code"] == 2001


def test_live_gunicorn_as_dify_calls_it(live_server_factory):
    """Registration probe and retrieval over real HTTP: the same requests Dify's httpx makes."""
    server = live_server_factory(workers=1, keys={"difykey-0123456789abcdef": ("acme", ["push", "search"])})
    rv = requests.post(server.url + "/mcp/push", json=make_unit("库存 ORD-4242 restocked"),
                       headers=server.headers("difykey-0123456789abcdef"), timeout=10)
    assert rv.status_code == 200
    cid = rv.json()["cid"]
    probe = requests.post(server.url + "/retrieval", headers={"Authorization": "Bearer difykey-0123456789abcdef"}, timeout=5)
    assert probe.status_code == 200 and probe.json() == {"records": []}
    assert requests.post(server.url + "/retrieval", headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
    params = dify_request("ORD-4242 库存", knowledge_id="acme")
    headers = {"Content-Type": "application/json", "Authorization": "Bearer difykey-0123456789abcdef"}
    deadline = time.monotonic() + 15
    records = []
    while time.monotonic() < deadline:   # default searches read the replica: wait out its lag
        for endpoint in (server.url, server.url + "/"):   # "http://host/" + "/retrieval" = "//retrieval"
            rv = requests.post(f"{endpoint}/retrieval", headers=headers, data=json.dumps(params),
                               allow_redirects=False, timeout=5)
            assert rv.status_code == 200, rv.text
            records = rv.json()["records"]
        if records:
            break
        time.sleep(0.2)
    assert [r["metadata"]["cid"] for r in records] == [cid]


def _session(client) -> tuple[str, list[str], str]:
    """A thread: a root, three turns that match "deploy alpha" around one that does not."""
    now = int(time.time()) - 60
    root = client.post("/mcp/push", json=make_unit("session start", type="system_notice", timestamp=now)).get_json()
    cids = []
    for i, text in enumerate(("deploy step one alpha", "deploy step two alpha", "unrelated beta note",
                              "deploy step three alpha")):
        rv = client.post("/mcp/push", json=make_unit(text, timestamp=now + i + 1, parent_cid=root["cid"]))
        cids.append(rv.get_json()["cid"])
    client.post("/mcp/search", json={"query": "deploy", "consistency": "strong"})
    return root["cid"], [cids[0], cids[1], cids[3]], cids[2]


def test_a_unit_appears_once_across_the_records_and_items(make_app):
    """Each record carries its window: with top_k 3 one unit appeared in all three (issue 51). Now a unit that is
    a record, or in an earlier record's window, is left out of the later windows; Continue's items alike."""
    client = make_app().test_client()
    root, matching, between = _session(client)
    body = dify_request("deploy alpha", knowledge_id="", top_k=3)
    records = post(client, body, headers={"Content-Type": "application/json"}).get_json()["records"]
    assert sorted(r["metadata"]["cid"] for r in records) == sorted(matching)
    shown = [units_in(r["content"]) | {r["metadata"]["cid"]} for r in records]
    assert sum(map(len, shown)) == len(set().union(*shown))          # no unit in two records
    assert between in set().union(*shown) and root in set().union(*shown)    # the windows still bring context
    items = client.post("/adapters/continue", json={"query": "deploy alpha", "options": {"top_k": 3}}).get_json()
    shown = [units_in(i["content"]) for i in items]                  # (an item's header names its own unit)
    assert sum(map(len, shown)) == len(set().union(*shown)) and between in set().union(*shown)


def units_in(text: str) -> set[str]:
    return set(re.findall(r"\[\w+ ([0-9a-f]{12})\]", text))


def test_dify_neighbors_zero_makes_each_record_its_unit_alone(make_app):
    client = make_app(dify_neighbors=0).test_client()
    _, matching, between = _session(client)
    records = post(client, dify_request("deploy alpha", knowledge_id="", top_k=3),
                   headers={"Content-Type": "application/json"}).get_json()["records"]
    assert sorted(r["content"] for r in records) == ["deploy step one alpha", "deploy step three alpha",
                                                     "deploy step two alpha"]
    with pytest.raises(ValueError, match="CONTEXT_DIFY_NEIGHBORS"):
        make_app(dify_neighbors=6)
