"""Tenant isolation (issue 7, docs/design.md §9): two tenants with overlapping content and CIDs.

Tenant B holds units tenant A must never see (secret marker words), and both tenants hold some
byte-identical units (same content, timestamp and source, hence the same CID) whose mutable
fields (type, ttl, metadata) differ, so every answer can be traced to the copy it came from.
For every front door (REST, Dify /retrieval, Continue, MCP resources/prompts/tools) tenant A's
key must never see, read, change or learn the existence of B's units: not by searching, not by
guessing a CID, a context:// URI, a parent_cid, a resources/list cursor minted for B, or a
knowledge_id naming B; and B's secret words never appear in anything sent to A, errors included.

Most checks use one in-process app (fast); ``test_live_gunicorn`` repeats the core of it over
HTTP against a real gunicorn with two workers.
"""
from __future__ import annotations

import base64
import json
import re
import time
from types import SimpleNamespace

import pytest
import requests

from conftest import close_app, drain, make_unit, new_app
from service.state import app_state

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")

KEY_A, KEY_B = "keyA-0123456789abcdef", "keyB-0123456789abcdef"
TENANT_A, TENANT_B = "tenant-a", "tenant-b"
API_KEYS = f"{KEY_A}:{TENANT_A}:push+search+admin;{KEY_B}:{TENANT_B}:push+search+admin"
LIVE_KEYS = {KEY_A: (TENANT_A, ["push", "search", "admin"]), KEY_B: (TENANT_B, ["push", "search", "admin"])}
LEGACY, MODERN = "2025-11-25", "2026-07-28"
ERAS = (LEGACY, MODERN)
NOT_FOUND = {LEGACY: -32002, MODERN: -32602}
NOW = int(time.time())

# Words only B's units contain. A's queries use SECRET_QUERY (responses may echo A's own query);
# PAYLOAD words are never sent by A, so they must never appear in anything A receives.
SECRET_QUERY = "zanzibarqx quokkavault"
PAYLOAD = ("obsidianfalcon", "pelicanledger", "marmosetcipher")
COMMON_QUERY = "gunicorn deploy runbook"       # matches A's units and B's units alike
FILLERS = 55                                   # > one resources/list page (50): B gets a nextCursor

SHARED = [  # identical in both tenants: same CID
    dict(content="shared gunicorn deploy runbook for the ORD service", source="wiki_v1_prod", timestamp=NOW - 500),
    dict(content="shared quarterly deploy checklist", source="wiki_v1_prod", timestamp=NOW - 400),
]
A_FIELDS = dict(type="tool_output", ttl=3600, metadata={"owner": "tenant-a"})
B_FIELDS = dict(type="system_notice", ttl=7200, metadata={"owner": "pelicanledger obsidianfalcon"})


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


# --- seeding ----------------------------------------------------------------------------------------
def seed(push, fillers: int = FILLERS) -> SimpleNamespace:
    """Push B's units first, then A's; ``push(key, unit_or_batch) -> (status, json)``."""
    ns = SimpleNamespace(shared=[], b_only=[], a_only=[])
    for s in SHARED:
        status, body = push(KEY_B, make_unit(**s, **B_FIELDS))
        assert status == 200 and body["status"] == "ok", body
        ns.shared.append(body["cid"])
    status, body = push(KEY_B, make_unit(f"{SECRET_QUERY} obsidianfalcon gunicorn deploy runbook notes",
                                          source="vault_v1_prod", timestamp=NOW - 300,
                                          metadata={"note": "pelicanledger"}))
    assert status == 200, body
    ns.b_secret = body["cid"]
    status, body = push(KEY_B, make_unit("quokkavault follow-up marmosetcipher on the deploy runbook",
                                         type="model_thinking", source="vault_v1_prod", timestamp=NOW - 250,
                                         parent_cid=ns.shared[0]))
    assert status == 200, body
    ns.b_child = body["cid"]
    ns.b_only += [ns.b_secret, ns.b_child]
    if fillers:
        batch = [make_unit(f"zanzibarqx filler {i} marmosetcipher", source="vault_v1_prod", timestamp=NOW - 900 + i)
                 for i in range(fillers)]
        status, body = push(KEY_B, {"units": batch})
        assert status == 200 and all(r["status"] == "ok" for r in body["results"]), body
        ns.b_only += [r["cid"] for r in body["results"]]

    a_seqs = []
    for s in SHARED:
        status, body = push(KEY_A, make_unit(**s, **A_FIELDS))
        # "duplicate" here would tell A that another tenant holds this exact unit.
        assert status == 200 and body["status"] == "ok", body
        assert body["cid"] in ns.shared
        a_seqs.append(body["seq"])
    status, body = push(KEY_A, make_unit("alpha team gunicorn deploy notes", source="alpha_v1_prod",
                                         timestamp=NOW - 200))
    assert status == 200, body
    ns.a_only.append(body["cid"])
    a_seqs.append(body["seq"])
    status, body = push(KEY_A, make_unit("alpha follow-up on the shared deploy runbook", type="user_input",
                                         source="alpha_v1_prod", timestamp=NOW - 150, parent_cid=ns.shared[0]))
    assert status == 200, body
    ns.a_child = body["cid"]
    ns.a_only.append(ns.a_child)
    a_seqs.append(body["seq"])
    ns.a_seqs = a_seqs
    ns.a_all = set(ns.shared) | set(ns.a_only)
    return ns


def forbidden_words(sent: str = "") -> list[str]:
    """B-only words A must never receive, except those A itself sent (a query may be echoed)."""
    sent = sent.lower()
    return [w for w in (*PAYLOAD, *SECRET_QUERY.split()) if w not in sent]


def assert_clean(text: str, ns: SimpleNamespace, sent: str = "", *, cids: bool = True) -> None:
    """Nothing of B's reaches A: no B-only CID (unless A named it), no B-only word A did not send."""
    low = text.lower()
    for w in forbidden_words(sent):
        assert w not in low, f"B's secret word {w!r} leaked to A: {text[:2000]}"
    if cids:
        for cid in ns.b_only:
            if cid not in sent:
                assert cid not in text, f"B's CID {cid} leaked to A: {text[:2000]}"


def assert_a_copy(unit: dict) -> None:
    """A result for a shared CID is A's copy (A's type/ttl/metadata), never B's."""
    for k in ("type", "ttl", "metadata"):
        if k in unit:
            assert unit[k] == A_FIELDS[k], (k, unit)


# --- in-process app ---------------------------------------------------------------------------------
def client_push(client):
    def push(key, body):
        rv = client.post("/mcp/push", json=body, headers=auth(key))
        return rv.status_code, rv.get_json()
    return push


@pytest.fixture(scope="module")
def world(tmp_path_factory, module_store_config):
    app = new_app(tmp_path_factory.mktemp("isolation") / "data", api_keys=API_KEYS, **module_store_config)
    client = app.test_client()
    ns = seed(client_push(client))
    # Index and refresh replicas, so default (replica) reads see everything too.
    drain(app)
    ns.app, ns.client = app, client
    ns.b_snapshot = {cid: client.get(f"/mcp/units/{cid}", headers=auth(KEY_B)).get_json()
                     for cid in [*ns.shared, ns.b_secret, ns.b_child]}
    ns.b_lineage = client.get(f"/mcp/units/{ns.shared[0]}/lineage", headers=auth(KEY_B)).get_json()
    assert ns.b_snapshot[ns.b_secret]["cid"] == ns.b_secret
    yield ns
    close_app(app)


@pytest.fixture
def fresh(make_app):
    """A small two-tenant app of its own, for tests that change state (replicas refreshed on every pass)."""
    app = make_app(api_keys=API_KEYS, replica_debounce_ms=0)
    client = app.test_client()
    ns = seed(client_push(client), fillers=0)
    drain(app)
    ns.app, ns.client = app, client
    return ns


def assert_b_unchanged(ns) -> None:
    """B still reads every one of its units exactly as before, and its lineage is intact."""
    c = ns.client
    for cid, before in ns.b_snapshot.items():
        rv = c.get(f"/mcp/units/{cid}", headers=auth(KEY_B))
        assert rv.status_code == 200 and rv.get_json() == before, (cid, rv.get_json())
    lin = c.get(f"/mcp/units/{ns.shared[0]}/lineage", headers=auth(KEY_B)).get_json()
    assert lin == ns.b_lineage


def mcp_message(method: str, params: dict | None, era: str, key: str) -> tuple[dict, dict]:
    """(body, headers) for one JSON-RPC request as a conforming client of ``era`` sends it."""
    params = dict(params or {})
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **auth(key)}
    if era == MODERN:
        params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                           "io.modelcontextprotocol/clientCapabilities": {},
                           "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"}}
        headers.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": method})
        name = params.get("uri") if method == "resources/read" else params.get("name")
        if isinstance(name, str) and method in ("resources/read", "tools/call", "prompts/get"):
            headers["Mcp-Name"] = name if name.isascii() and name.isprintable() else \
                "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
    else:
        headers["MCP-Protocol-Version"] = era
    body = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params:
        body["params"] = params
    return body, headers


def mcp(client, method: str, params: dict | None = None, *, era: str = MODERN, key: str = KEY_A):
    """(http status, JSON-RPC body, raw text) from the in-process app."""
    body, headers = mcp_message(method, params, era, key)
    rv = client.post("/mcp", data=json.dumps(body), headers=headers)
    return rv.status_code, rv.get_json(), rv.get_data(as_text=True)


def rpc_result(status: int, body: dict) -> dict:
    assert status == 200 and "error" not in body, body
    return body["result"]


def rpc_error(status: int, body: dict, code: int) -> dict:
    assert status < 500 and "result" not in body, body
    assert body["error"]["code"] == code, body
    return body["error"]


A_QUERIES = [SECRET_QUERY, COMMON_QUERY, "zanzibarqx", "deploy"]


# --- searches ---------------------------------------------------------------------------------------
def check_units(units: list[dict], ns) -> set[str]:
    cids = {u["cid"] for u in units}
    assert cids <= ns.a_all, f"A got units it does not own: {cids - ns.a_all}"
    for u in units:
        if u["cid"] in ns.shared:
            assert_a_copy(u)
    return cids


@pytest.mark.parametrize("consistency", ["strong", "replica"])
@pytest.mark.parametrize("query", A_QUERIES)
def test_rest_search_post_and_get(world, query, consistency):
    c = world.client
    for extra in ({}, {"highlight": True, "explain": True}, {"operator": "and"}, {"source": "vault*"},
                  {"types": ["system_notice", "model_thinking"]}):
        rv = c.post("/mcp/search", json={"query": query, "top_k": 100, "consistency": consistency, **extra},
                    headers=auth(KEY_A))
        assert rv.status_code == 200, rv.get_json()
        check_units(rv.get_json()["results"], world)
        assert_clean(rv.get_data(as_text=True), world, query)
    rv = c.get("/mcp/search", query_string={"q": query, "top_k": 100, "consistency": consistency,
                                             "highlight": "true"}, headers=auth(KEY_A))
    assert rv.status_code == 200
    check_units(rv.get_json()["results"], world)
    assert_clean(rv.get_data(as_text=True), world, query)


def test_rest_search_finds_a_own_units(world):
    """Positive control: the searches above do return A's units, A's copies of the shared ones."""
    rv = world.client.post("/mcp/search", json={"query": COMMON_QUERY, "top_k": 100}, headers=auth(KEY_A))
    cids = check_units(rv.get_json()["results"], world)
    assert set(world.shared[:1]) | {world.a_only[0]} <= cids
    # ...and B's search does find B's secret (so A's empty answer is isolation, not a broken index).
    rv = world.client.post("/mcp/search", json={"query": SECRET_QUERY, "top_k": 100}, headers=auth(KEY_B))
    assert world.b_secret in {r["cid"] for r in rv.get_json()["results"]}


def test_rest_search_parent_filter_and_fields(world):
    c = world.client
    # Children of the shared CID: A's child only, never B's child of B's copy.
    rv = c.post("/mcp/search", json={"query": "follow-up deploy runbook", "parent_cid": world.shared[0],
                                     "consistency": "strong"}, headers=auth(KEY_A))
    assert {r["cid"] for r in rv.get_json()["results"]} == {world.a_child}
    # Children of a B-only CID: nothing.
    rv = c.post("/mcp/search", json={"query": "deploy", "parent_cid": world.b_secret}, headers=auth(KEY_A))
    assert rv.status_code == 200 and rv.get_json()["results"] == []
    # A body naming B's tenant is refused, not obeyed.
    rv = c.post("/mcp/search", json={"query": SECRET_QUERY, "tenant": TENANT_B}, headers=auth(KEY_A))
    assert rv.status_code == 400
    assert_clean(rv.get_data(as_text=True), world, SECRET_QUERY)


def test_scores_do_not_depend_on_other_tenant(world, make_app):
    """BM25 statistics are per tenant: A's scores equal those of a store that never held B's units."""
    alone = make_app(api_keys=API_KEYS)
    c = alone.test_client()
    push = client_push(c)
    for s in SHARED:
        assert push(KEY_A, make_unit(**s, **A_FIELDS))[0] == 200
    assert push(KEY_A, make_unit("alpha team gunicorn deploy notes", source="alpha_v1_prod",
                                 timestamp=NOW - 200))[0] == 200
    assert push(KEY_A, make_unit("alpha follow-up on the shared deploy runbook", type="user_input",
                                 source="alpha_v1_prod", timestamp=NOW - 150, parent_cid=world.shared[0]))[0] == 200
    body = {"query": COMMON_QUERY, "top_k": 100, "consistency": "strong"}
    want = {r["cid"]: r["bm25_score"] for r in c.post("/mcp/search", json=body, headers=auth(KEY_A)).get_json()["results"]}
    got = {r["cid"]: r["bm25_score"] for r in
           world.client.post("/mcp/search", json=body, headers=auth(KEY_A)).get_json()["results"]}
    assert got.keys() == want.keys()
    for cid in want:
        assert got[cid] == pytest.approx(want[cid], rel=1e-9), cid


def test_sequence_numbers_are_per_tenant(world):
    """A's seqs start at 1 although B pushed first: seq reveals nothing about B's volume."""
    assert world.a_seqs == list(range(1, len(world.a_seqs) + 1))


@pytest.mark.parametrize("query", A_QUERIES)
def test_rest_context_packing(world, query):
    for consistency in ("strong", "replica"):
        rv = world.client.post("/mcp/context", json={"query": query, "budget_tokens": 5000, "top_k": 100,
                                                     "consistency": consistency}, headers=auth(KEY_A))
        assert rv.status_code == 200, rv.get_json()
        body = rv.get_json()
        check_units(body["items"] + body["dropped"], world)
        assert_clean(rv.get_data(as_text=True), world, query)


@pytest.mark.parametrize("knowledge_id", ["", TENANT_A, None])
@pytest.mark.parametrize("query", A_QUERIES)
def test_dify_retrieval_own_knowledge(world, query, knowledge_id):
    body = {"knowledge_id": knowledge_id, "query": query,
            "retrieval_setting": {"top_k": 100, "score_threshold": 0.0}, "metadata_condition": None}
    for path in ("/retrieval", "//retrieval"):
        rv = world.client.post("/retrieval", data=json.dumps(body), environ_overrides={"PATH_INFO": path},
                               headers={"Content-Type": "application/json", **auth(KEY_A)})
        assert rv.status_code == 200, rv.get_json()
        records = rv.get_json()["records"]
        check_units([{"cid": r["metadata"]["cid"], **{k: r["metadata"][k] for k in ("type", "ttl")}}
                     for r in records], world)
        for r in records:
            if r["metadata"]["cid"] in world.shared:
                assert r["metadata"]["owner"] == "tenant-a"
        assert_clean(rv.get_data(as_text=True), world, query)
    if query == COMMON_QUERY:
        assert world.a_only[0] in {r["metadata"]["cid"] for r in records}


@pytest.mark.parametrize("knowledge_id", [TENANT_B, f" {TENANT_B} ", TENANT_B.upper(), "tenant-b/../tenant-a"])
def test_dify_knowledge_id_naming_b_is_unknown(world, knowledge_id):
    body = {"knowledge_id": knowledge_id, "query": SECRET_QUERY,
            "retrieval_setting": {"top_k": 10, "score_threshold": 0.0}}
    rv = world.client.post("/retrieval", data=json.dumps(body),
                           headers={"Content-Type": "application/json", **auth(KEY_A)})
    assert rv.status_code == 404 and rv.get_json()["error_code"] == 2001, rv.get_json()
    assert_clean(rv.get_data(as_text=True), world, SECRET_QUERY)
    # Exactly the answer for a knowledge base that exists nowhere: no existence oracle.
    body["knowledge_id"] = "no-such-tenant"
    other = world.client.post("/retrieval", data=json.dumps(body),
                              headers={"Content-Type": "application/json", **auth(KEY_A)})
    assert (other.status_code, other.get_json()) == (rv.status_code, rv.get_json())


@pytest.mark.parametrize("query", A_QUERIES)
def test_continue_adapter(world, query):
    c = world.client
    bodies = [{"query": query, "fullInput": ""},
              {"query": "", "fullInput": f"please explain {query}"},
              {"query": query, "fullInput": query, "options": {"consistency": "strong", "top_k": 100}},
              {"query": query, "fullInput": "", "options": {"tenant": TENANT_B, "knowledge_id": TENANT_B},
               "tenant": TENANT_B}]
    for body in bodies:
        rv = c.post("/adapters/continue", data=json.dumps(body),
                    headers={"Content-Type": "application/json", **auth(KEY_A)})
        assert rv.status_code == 200, rv.get_json()
        items = rv.get_json()
        cids = {re.fullmatch(r"\w+ ([0-9a-f]{12})", it["name"]).group(1) for it in items}
        assert cids <= world.a_all, cids - world.a_all
        for it in items:
            if any(cid in it["name"] for cid in world.shared):
                assert it["name"].startswith(A_FIELDS["type"]), it
        assert_clean(rv.get_data(as_text=True), world, json.dumps(body))


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("query", A_QUERIES)
def test_mcp_context_search_tool(world, query, era):
    for extra in ({}, {"consistency": "strong", "top_k": 100, "highlight": True}, {"source": "vault*"}):
        result = rpc_result(*mcp(world.client, "tools/call",
                                 {"name": "context_search", "arguments": {"query": query, **extra}}, era=era)[:2])
        assert not result.get("isError"), result
        cids = check_units(result["structuredContent"]["results"], world)
        assert_clean(json.dumps(result, ensure_ascii=False), world, query)
        if query == COMMON_QUERY and not extra:
            assert world.a_only[0] in cids


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("query", A_QUERIES)
def test_mcp_search_resource(world, query, era):
    from urllib.parse import quote
    uri = "context://search/" + quote(query, safe="")
    result = rpc_result(*mcp(world.client, "resources/read", {"uri": uri}, era=era)[:2])
    text = result["contents"][0]["text"]
    cids = set(re.findall(r"context://units/([0-9a-f]{12})", text))
    assert cids <= world.a_all, cids - world.a_all
    assert_clean(json.dumps(result, ensure_ascii=False), world, query)
    for cid in cids & set(world.shared):
        # (a unit answered has its own section; one only beside another in its thread is named in that one's)
        header = f". context://units/{cid}\n"
        if header in text:
            section = text.split(header, 1)[1]
            assert f"- type: {A_FIELDS['type']}" in section.split("\n## ", 1)[0]


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("query", A_QUERIES)
def test_mcp_answer_with_context_prompt(world, query, era):
    for args in ({"question": query}, {"question": query, "types": "system_notice,model_thinking,tool_output"}):
        result = rpc_result(*mcp(world.client, "prompts/get", {"name": "answer-with-context", "arguments": args},
                                 era=era)[:2])
        embedded = [m["content"]["resource"] for m in result["messages"] if m["content"]["type"] == "resource"]
        units = [{"cid": r["uri"].rsplit("/", 1)[1], **r["_meta"]["dev.context-mode/unit"]} for r in embedded]
        check_units(units, world)
        assert_clean(json.dumps(result, ensure_ascii=False), world, query)


# --- resources/list and cursors ---------------------------------------------------------------------
@pytest.mark.parametrize("era", ERAS)
def test_mcp_resources_list_shows_only_own_units(world, era):
    result = rpc_result(*mcp(world.client, "resources/list", era=era)[:2])
    assert "nextCursor" not in result
    listed = {r["uri"].rsplit("/", 1)[1]: r for r in result["resources"]}
    assert set(listed) == world.a_all
    for cid in world.shared:
        assert listed[cid]["_meta"]["dev.context-mode/unit"]["type"] == A_FIELDS["type"]
        assert listed[cid]["title"].startswith(A_FIELDS["type"])
    assert_clean(json.dumps(result), world)


@pytest.mark.parametrize("era", ERAS)
def test_mcp_cursor_minted_for_b_is_rejected_for_a(world, era):
    first = rpc_result(*mcp(world.client, "resources/list", era=era, key=KEY_B)[:2])
    cursor = first["nextCursor"]
    # The cursor is good for B (so rejecting it for A is about the tenant, not a bad cursor)...
    page2 = rpc_result(*mcp(world.client, "resources/list", {"cursor": cursor}, era=era, key=KEY_B)[:2])
    assert page2["resources"] and not {r["uri"] for r in page2["resources"]} & {r["uri"] for r in first["resources"]}
    # ...and invalid for A: -32602 in both revisions, nothing of B's in the error.
    status, body, text = mcp(world.client, "resources/list", {"cursor": cursor}, era=era, key=KEY_A)
    rpc_error(status, body, -32602)
    assert_clean(text, world)


def test_mcp_templates_are_the_same_for_both_tenants(world):
    for era in ERAS:
        a = rpc_result(*mcp(world.client, "resources/templates/list", era=era, key=KEY_A)[:2])
        b = rpc_result(*mcp(world.client, "resources/templates/list", era=era, key=KEY_B)[:2])
        assert a == b
        assert_clean(json.dumps(a), world)


# --- guessing a B-only CID ------------------------------------------------------------------------
def door_rest_get(ns, cid, era):
    rv = ns.client.get(f"/mcp/units/{cid}", headers=auth(KEY_A))
    assert rv.status_code == 404 and rv.get_json()["code"] == "not_found", rv.get_json()
    return rv.get_data(as_text=True)


def door_rest_lineage(ns, cid, era):
    rv = ns.client.get(f"/mcp/units/{cid}/lineage", headers=auth(KEY_A))
    assert rv.status_code == 404 and rv.get_json()["code"] == "not_found", rv.get_json()
    return rv.get_data(as_text=True)


def door_rest_delete(ns, cid, era):
    rv = ns.client.delete(f"/mcp/units/{cid}", headers=auth(KEY_A))
    assert rv.status_code == 404 and rv.get_json()["code"] == "not_found", rv.get_json()
    return rv.get_data(as_text=True)


def door_rest_push_child(ns, cid, era):
    unit = make_unit("alpha child guessing a parent", source="alpha_v1_prod", timestamp=NOW - 100, parent_cid=cid)
    rv = ns.client.post("/mcp/push", json=unit, headers=auth(KEY_A))
    assert rv.status_code == 422 and rv.get_json()["code"] == "parent_not_found", rv.get_json()
    return rv.get_data(as_text=True)


def door_rest_push_batch_child(ns, cid, era):
    unit = make_unit("alpha batch child guessing a parent", source="alpha_v1_prod", timestamp=NOW - 90,
                     parent_cid=cid)
    rv = ns.client.post("/mcp/push", json={"units": [unit]}, headers=auth(KEY_A))
    item = rv.get_json()["results"][0]
    assert rv.status_code == 200 and item["status"] == "error" and item["code"] == "parent_not_found", item
    return rv.get_data(as_text=True)


def door_mcp_read_unit(ns, cid, era):
    status, body, text = mcp(ns.client, "resources/read", {"uri": f"context://units/{cid}"}, era=era)
    rpc_error(status, body, NOT_FOUND[era])
    return text


def door_mcp_review_lineage(ns, cid, era):
    status, body, text = mcp(ns.client, "prompts/get", {"name": "review-lineage", "arguments": {"cid": cid}}, era=era)
    rpc_error(status, body, -32602)
    return text


def door_mcp_push_child(ns, cid, era):
    result = rpc_result(*mcp(ns.client, "tools/call", {"name": "context_push", "arguments": {
        "type": "user_input", "source": "alpha_v1_prod", "content": "alpha mcp child guessing a parent",
        "ttl": 30 * 86_400, "timestamp": NOW - 80, "parent_cid": cid}}, era=era)[:2])
    assert result["isError"] is True and "parent_not_found" in result["content"][0]["text"], result
    return json.dumps(result)


def door_mcp_search_by_parent(ns, cid, era):
    result = rpc_result(*mcp(ns.client, "tools/call", {"name": "context_search", "arguments": {
        "query": "deploy runbook follow-up", "parent_cid": cid, "consistency": "strong"}}, era=era)[:2])
    assert not result.get("isError") and result["structuredContent"]["results"] == [], result
    return json.dumps(result)


GUESS_DOORS = [door_rest_get, door_rest_lineage, door_rest_delete, door_rest_push_child, door_rest_push_batch_child,
               door_mcp_read_unit, door_mcp_review_lineage, door_mcp_push_child, door_mcp_search_by_parent]
UNUSED_CID = "0123456789ab"


def normalise(text: str, cid: str) -> str:
    """An answer with the guessed CID blanked and volatile numbers (timings, ids) dropped."""
    text = text.replace(cid, "<cid>")
    data = json.loads(text)
    result = data.get("result", data)
    if isinstance(result, dict) and isinstance(result.get("structuredContent"), dict):
        result.pop("content", None)       # the same structuredContent, serialized
        for volatile in ("took_ms", "freshness"):
            result["structuredContent"].pop(volatile, None)
    return json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("door", GUESS_DOORS, ids=lambda d: d.__name__[5:])
def test_guessing_b_cid_fails_and_changes_nothing(world, door, era):
    for cid in (world.b_secret, world.b_child, world.b_only[-1]):
        text = door(world, cid, era)
        assert_clean(text, world, cid)
        # The same answer as for a CID nobody has: A cannot even learn that B's unit exists.
        assert normalise(text, cid) == normalise(door(world, UNUSED_CID, era), UNUSED_CID)
    assert_b_unchanged(world)


@pytest.mark.parametrize("era", ERAS)
def test_shared_cid_reads_show_a_copy_and_a_lineage(world, era):
    """Through every read door, the shared CID is A's copy, and its children are A's only."""
    c, shared = world.client, world.shared[0]
    rv = c.get(f"/mcp/units/{shared}", headers=auth(KEY_A))
    assert rv.status_code == 200
    assert_a_copy(rv.get_json())
    lin = c.get(f"/mcp/units/{shared}/lineage", headers=auth(KEY_A)).get_json()
    assert [u["cid"] for u in lin["children"]] == [world.a_child]
    assert_a_copy(lin["unit"])
    assert_clean(json.dumps(lin), world)
    lin = c.get(f"/mcp/units/{world.a_child}/lineage", headers=auth(KEY_A)).get_json()
    assert [u["cid"] for u in lin["ancestors"]] == [shared]
    assert_a_copy(lin["ancestors"][0])

    result = rpc_result(*mcp(c, "resources/read", {"uri": f"context://units/{shared}"}, era=era)[:2])
    meta = result["contents"][0]["_meta"]["dev.context-mode/unit"]
    assert_a_copy(meta)
    assert_clean(json.dumps(result), world)

    result = rpc_result(*mcp(c, "prompts/get", {"name": "review-lineage", "arguments": {"cid": shared}}, era=era)[:2])
    embedded = [m["content"]["resource"] for m in result["messages"] if m["content"]["type"] == "resource"]
    assert [r["uri"] for r in embedded] == [f"context://units/{shared}", f"context://units/{world.a_child}"]
    assert_a_copy(embedded[0]["_meta"]["dev.context-mode/unit"])
    assert_clean(json.dumps(result), world)


# --- changes ----------------------------------------------------------------------------------------
def b_sees(ns, cid: str) -> None:
    c = ns.client
    rv = c.get(f"/mcp/units/{cid}", headers=auth(KEY_B))
    assert rv.status_code == 200 and rv.get_json() == ns.b_snapshot[cid], rv.get_json()
    for consistency in ("strong", "replica"):
        rv = c.post("/mcp/search", json={"query": COMMON_QUERY, "top_k": 100, "consistency": consistency},
                    headers=auth(KEY_B))
        assert cid in {r["cid"] for r in rv.get_json()["results"]}, consistency
    for era in ERAS:
        result = rpc_result(*mcp(c, "resources/read", {"uri": f"context://units/{cid}"}, era=era, key=KEY_B)[:2])
        assert result["contents"][0]["_meta"]["dev.context-mode/unit"]["type"] == ns.b_snapshot[cid]["type"]


def test_deleting_shared_cid_as_a_leaves_b_copy(fresh):
    c, shared = fresh.client, fresh.shared[0]
    fresh.b_snapshot = {shared: c.get(f"/mcp/units/{shared}", headers=auth(KEY_B)).get_json()}
    b_lineage = c.get(f"/mcp/units/{shared}/lineage", headers=auth(KEY_B)).get_json()
    rv = c.delete(f"/mcp/units/{shared}", headers=auth(KEY_A))
    assert rv.status_code == 200 and rv.get_json()["status"] == "deleted"
    assert c.get(f"/mcp/units/{shared}", headers=auth(KEY_A)).status_code == 404
    assert c.delete(f"/mcp/units/{shared}", headers=auth(KEY_A)).status_code == 404
    app_state(fresh.app).maintenance.run_once(force_janitor=True)
    b_sees(fresh, shared)
    assert c.get(f"/mcp/units/{shared}/lineage", headers=auth(KEY_B)).get_json() == b_lineage
    # A's own search no longer has it, and B's copy does not show through for A either.
    for consistency in ("strong", "replica"):
        rv = c.post("/mcp/search", json={"query": COMMON_QUERY, "top_k": 100, "consistency": consistency},
                    headers=auth(KEY_A))
        assert shared not in {r["cid"] for r in rv.get_json()["results"]}, consistency
    for era in ERAS:
        status, body, text = mcp(c, "resources/read", {"uri": f"context://units/{shared}"}, era=era)
        rpc_error(status, body, NOT_FOUND[era])
        assert_clean(text, fresh, shared)
        listed = rpc_result(*mcp(c, "resources/list", era=era)[:2])["resources"]
        assert f"context://units/{shared}" not in {r["uri"] for r in listed}
    # A's child of the shared unit now has no ancestors (B's copy is not A's parent).
    lin = c.get(f"/mcp/units/{fresh.a_child}/lineage", headers=auth(KEY_A)).get_json()
    assert lin["ancestors"] == []


def test_a_pushing_b_exact_unit_is_new_and_leaves_b_copy(fresh):
    """A pushing byte-for-byte what B stored gets "ok" (not "duplicate") and its own copy; B's is untouched."""
    c = fresh.client
    fresh.b_snapshot = {fresh.b_child: c.get(f"/mcp/units/{fresh.b_child}", headers=auth(KEY_B)).get_json()}
    b = fresh.b_snapshot[fresh.b_child]
    mine = make_unit(b["content"], type="tool_output", source=b["source"], timestamp=b["timestamp"], ttl=30 * 86_400,
                     metadata={"owner": "tenant-a"}, cid=b["cid"])
    rv = c.post("/mcp/push", json=mine, headers=auth(KEY_A))
    assert rv.status_code == 200 and rv.get_json()["status"] == "ok" and rv.get_json()["cid"] == b["cid"]
    # Through MCP too (idempotent for A now: "duplicate" of A's own copy).
    args = {k: mine[k] for k in ("type", "source", "content", "ttl", "timestamp", "cid", "metadata")}
    result = rpc_result(*mcp(c, "tools/call", {"name": "context_push", "arguments": args})[:2])
    assert result["structuredContent"]["status"] == "duplicate"
    drain(fresh.app)
    b_sees(fresh, fresh.b_child)
    got = c.get(f"/mcp/units/{b['cid']}", headers=auth(KEY_A)).get_json()
    assert got["type"] == "tool_output" and got["metadata"] == {"owner": "tenant-a"} and got["parent_cid"] is None


def test_mcp_push_stays_in_own_tenant(fresh):
    c = fresh.client
    result = rpc_result(*mcp(c, "tools/call", {"name": "context_push", "arguments": {
        "type": "user_input", "source": "alpha_v1_prod", "content": "alpha lighthousekeeper memo", "ttl": 600}})[:2])
    cid = result["structuredContent"]["cid"]
    assert c.get(f"/mcp/units/{cid}", headers=auth(KEY_A)).status_code == 200
    assert c.get(f"/mcp/units/{cid}", headers=auth(KEY_B)).status_code == 404
    rv = c.post("/mcp/search", json={"query": "lighthousekeeper", "consistency": "strong"}, headers=auth(KEY_B))
    assert rv.get_json()["results"] == []


# --- live gunicorn ----------------------------------------------------------------------------------
def test_live_gunicorn(live_server_factory):
    """The core of the above over real HTTP, two gunicorn workers, background indexer and replicas."""
    srv = live_server_factory(keys=LIVE_KEYS)
    s = requests.Session()

    def push(key, body):
        rv = s.post(srv.url + "/mcp/push", json=body, headers=auth(key), timeout=30)
        return rv.status_code, rv.json()

    def call(method, params=None, *, era=MODERN, key=KEY_A):
        body, headers = mcp_message(method, params, era, key)
        rv = s.post(srv.url + "/mcp", data=json.dumps(body), headers=headers, timeout=30)
        return rv.status_code, rv.json(), rv.text

    ns = seed(push, fillers=51)
    for q in (SECRET_QUERY, COMMON_QUERY):
        rv = s.post(srv.url + "/mcp/search", json={"query": q, "top_k": 100, "consistency": "strong"},
                    headers=auth(KEY_A), timeout=30)
        assert rv.status_code == 200
        check_units(rv.json()["results"], ns)
        assert_clean(rv.text, ns, q)
        rv = s.get(srv.url + "/mcp/search", params={"q": q, "top_k": 100}, headers=auth(KEY_A), timeout=30)
        check_units(rv.json()["results"], ns)
        assert_clean(rv.text, ns, q)
        for era in ERAS:
            result = rpc_result(*call("tools/call", {"name": "context_search", "arguments": {
                "query": q, "top_k": 100, "consistency": "strong"}}, era=era)[:2])
            check_units(result["structuredContent"]["results"], ns)
            assert_clean(json.dumps(result), ns, q)
    rv = s.post(srv.url + "/mcp/search", json={"query": COMMON_QUERY, "consistency": "strong"}, headers=auth(KEY_A),
                timeout=30)
    assert ns.a_only[0] in {r["cid"] for r in rv.json()["results"]}

    b_secret = s.get(srv.url + f"/mcp/units/{ns.b_secret}", headers=auth(KEY_B), timeout=30).json()
    for path in (f"/mcp/units/{ns.b_secret}", f"/mcp/units/{ns.b_secret}/lineage"):
        rv = s.get(srv.url + path, headers=auth(KEY_A), timeout=30)
        assert rv.status_code == 404
        assert_clean(rv.text, ns, ns.b_secret)
    rv = s.delete(srv.url + f"/mcp/units/{ns.b_secret}", headers=auth(KEY_A), timeout=30)
    assert rv.status_code == 404
    status, body = push(KEY_A, make_unit("alpha live child", source="alpha_v1_prod", parent_cid=ns.b_secret))
    assert status == 422 and body["code"] == "parent_not_found"
    for era in ERAS:
        status, body, text = call("resources/read", {"uri": f"context://units/{ns.b_secret}"}, era=era)
        rpc_error(status, body, NOT_FOUND[era])
        assert_clean(text, ns, ns.b_secret)
        first = rpc_result(*call("resources/list", era=era, key=KEY_B)[:2])
        status, body, text = call("resources/list", {"cursor": first["nextCursor"]}, era=era)
        rpc_error(status, body, -32602)
        listed = rpc_result(*call("resources/list", era=era)[:2])
        assert {r["uri"].rsplit("/", 1)[1] for r in listed["resources"]} == ns.a_all
    assert s.get(srv.url + f"/mcp/units/{ns.b_secret}", headers=auth(KEY_B), timeout=30).json() == b_secret

    rv = s.post(srv.url + "/retrieval", json={"knowledge_id": TENANT_B, "query": SECRET_QUERY,
                                              "retrieval_setting": {"top_k": 5, "score_threshold": 0}},
                headers=auth(KEY_A), timeout=30)
    assert rv.status_code == 404 and rv.json()["error_code"] == 2001
    rv = s.post(srv.url + "/adapters/continue", json={"query": SECRET_QUERY, "fullInput": "",
                                                      "options": {"consistency": "strong"}},
                headers=auth(KEY_A), timeout=30)
    assert rv.status_code == 200 and rv.json() == []

    shared = ns.shared[0]
    b_copy = s.get(srv.url + f"/mcp/units/{shared}", headers=auth(KEY_B), timeout=30).json()
    assert b_copy["type"] == B_FIELDS["type"]
    assert s.delete(srv.url + f"/mcp/units/{shared}", headers=auth(KEY_A), timeout=30).status_code == 200
    assert s.get(srv.url + f"/mcp/units/{shared}", headers=auth(KEY_A), timeout=30).status_code == 404
    assert s.get(srv.url + f"/mcp/units/{shared}", headers=auth(KEY_B), timeout=30).json() == b_copy
    rv = s.post(srv.url + "/mcp/search", json={"query": COMMON_QUERY, "top_k": 100, "consistency": "strong"},
                headers=auth(KEY_B), timeout=30)
    assert shared in {r["cid"] for r in rv.json()["results"]}
