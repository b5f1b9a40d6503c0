"""Continue's http context provider: POST /adapters/continue.

Continue (core/context/providers/HttpContextProvider.ts) posts JSON.stringify({query, fullInput,
options, workspacePath}) with its options.headers, and maps each array item to a context item.
"""
import json

import pytest

from conftest import make_unit

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")


def continue_body(query="", full_input="", options=None, workspace=None):
    """What Continue serializes: undefined options/workspacePath are left out by JSON.stringify."""
    body = {"query": query, "fullInput": full_input}
    if options is not None:
        body["options"] = options
    if workspace is not None:
        body["workspacePath"] = workspace
    return json.dumps(body)


@pytest.fixture
def seeded(client):
    cids = []
    for unit in (make_unit("部署 deploy script for ORD service uses gunicorn", source="ci_v1_prod"),
                 make_unit("user asked how to deploy the ORD service", type="user_input", source="chat_v1"),
                 make_unit("unrelated note about lunch", type="system_notice")):
        rv = client.post("/mcp/push", json=unit)
        cids.append(rv.get_json()["cid"])
    client.post("/mcp/search", json={"query": "deploy", "consistency": "strong"})
    return client, cids


def post(client, data, headers=None):
    return client.post("/adapters/continue", data=data, headers={"Content-Type": "application/json", **(headers or {})})


def test_query_returns_context_items(seeded):
    client, cids = seeded
    rv = post(client, continue_body("deploy ORD", "@context deploy ORD please", workspace="/home/me/proj"))
    assert rv.status_code == 200
    items = rv.get_json()
    assert isinstance(items, list) and len(items) == 2
    for it in items:
        assert set(it) == {"name", "description", "content"}
        assert all(isinstance(v, str) and v for v in it.values())
        assert "untrusted" in it["content"]
    assert {it["name"].split()[1] for it in items} == set(cids[:2])
    assert "deploy" in items[0]["content"]


def test_empty_query_searches_full_input(seeded):
    client, cids = seeded
    rv = post(client, continue_body("", "what did we say about lunch?"))
    assert [it["name"] for it in rv.get_json()] == [f"system_notice {cids[2]}"]


def test_nothing_to_search(seeded):
    client, _ = seeded
    assert post(client, continue_body("", "")).get_json() == []
    assert post(client, json.dumps({})).get_json() == []


def test_options_narrow_the_search(seeded):
    client, cids = seeded
    rv = post(client, continue_body("deploy", options={"types": ["user_input"], "title": "mine"}))
    assert [it["name"] for it in rv.get_json()] == [f"user_input {cids[1]}"]
    rv = post(client, continue_body("deploy", options={"top_k": 1}))
    assert len(rv.get_json()) == 1


def test_long_full_input_is_cut_not_rejected(seeded):
    client, _ = seeded
    rv = post(client, continue_body("", "deploy " * 10000))
    assert rv.status_code == 200 and rv.get_json()


@pytest.mark.parametrize("data,field", [
    (b"nope", None), (b"[1]", None), (json.dumps({"query": 3}), "query"),
    (json.dumps({"query": "", "fullInput": ["x"]}), "fullInput"),
    (continue_body("x", options="fast"), "options"), (continue_body("x", options={"top_k": 0}), "top_k"),
    (continue_body("x", options={"types": ["nope"]}), "types"),
])
def test_bad_bodies_are_400_rest_shape(seeded, data, field):
    client, _ = seeded
    rv = post(client, data)
    assert rv.status_code == 400
    body = rv.get_json()
    assert {"error", "code"} <= set(body)
    if field:
        assert body["field"] == field


def test_auth_like_rest(live_server_factory):
    import requests
    server = live_server_factory(workers=1, keys={"ck-0123456789abcdef": ("dev", ["push", "search"]), "po-0123456789abcdef": ("dev", ["push"])})
    url = server.url + "/adapters/continue"
    rv = requests.post(url, data=continue_body("x"), headers={"Content-Type": "application/json"}, timeout=5)
    assert rv.status_code == 401 and rv.json()["code"] == "missing_api_key"
    rv = requests.post(url, data=continue_body("x"),
                       headers={"Content-Type": "application/json", **server.headers("po-0123456789abcdef")}, timeout=5)
    assert rv.status_code == 403 and rv.json()["code"] == "missing_scope"
    requests.post(server.url + "/mcp/push", json=make_unit("continue live ORD-1"), headers=server.headers("ck-0123456789abcdef"),
                  timeout=5)
    requests.post(server.url + "/mcp/search", json={"query": "ORD-1", "consistency": "strong"},
                  headers=server.headers("ck-0123456789abcdef"), timeout=5)
    # Continue sends options.headers as request headers; consistency from options for read-your-writes.
    rv = requests.post(url, data=continue_body("ORD-1", options={"consistency": "strong"}),
                       headers={"Content-Type": "application/json", **server.headers("ck-0123456789abcdef")}, timeout=5)
    assert rv.status_code == 200
    assert len(rv.json()) == 1 and "continue live ORD-1" in rv.json()[0]["content"]
