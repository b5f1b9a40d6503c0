"""POST /mcp byte by byte with requests against gunicorn: transport rules, revisions, hostile input,
strict resource URIs, cursors, tenants and cache hints."""
from __future__ import annotations

import json
import time

import pytest
import requests

from conftest import lettered_timestamp, store_env
from mcp_support import KEY, KEYS, LEGACY, MODERN, OTHER_KEY, PUSH_ONLY_KEY, post_raw, push, rpc, start_server

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")

NOT_FOUND = {LEGACY: -32002, MODERN: -32602}


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_store_config):
    srv = start_server(tmp_path_factory, "mcp-protocol", keys=KEYS, env=store_env(module_store_config))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def units(server):
    # (a CID with a letter: hostile_uris spells it in upper case)
    mine = push(server, "hello from acme", key=KEY, timestamp=lettered_timestamp("hello from acme"))["cid"]
    theirs = push(server, "hello from globex", key=OTHER_KEY)["cid"]
    return {"mine": mine, "theirs": theirs}


def error_of(rv, code: int) -> dict:
    assert rv.status_code < 500, rv.text
    body = rv.json()
    assert "result" not in body, body
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, body
    return body


# --- transport ------------------------------------------------------------------------------------
def test_dns_rebinding_is_refused(server):
    evil = {"Host": "evil.example.com", "Origin": "http://evil.example.com"}
    rv = rpc(server, "resources/list", era=LEGACY, key=KEY, headers=evil)
    assert rv.status_code == 403 and "result" not in rv.json()
    for origin in ("http://evil.example.com", "null", f"http://127.0.0.1.evil.example.com:{server.port}"):
        rv = rpc(server, "resources/list", era=LEGACY, key=KEY, headers={"Origin": origin})
        assert rv.status_code == 403, origin
    rv = rpc(server, "resources/list", era=LEGACY, key=KEY, headers={"Host": f"localhost.evil.example.com:{server.port}"})
    assert rv.status_code == 403
    for host, origin in [(f"localhost:{server.port}", f"http://localhost:{server.port}"),
                         (f"127.0.0.1:{server.port}", None), (f"[::1]:{server.port}", f"http://[::1]:{server.port}")]:
        h = {"Host": host, **({"Origin": origin} if origin else {})}
        assert rpc(server, "resources/list", era=LEGACY, key=KEY, headers=h).status_code == 200, h
    # Another port on localhost is another site (a dev server's page): refused (issue 12, finding 15).
    for origin in ("http://localhost:3000", "http://127.0.0.1:1", f"http://127.0.0.1:{server.port}"):
        h = {"Host": f"localhost:{server.port}", "Origin": origin}
        rv = rpc(server, "resources/list", era=LEGACY, key=KEY, headers=h)
        assert rv.status_code == 403 and rv.json()["error"]["code"] == -32011, origin


def test_get_and_delete_are_405(server):
    for method in ("GET", "DELETE"):
        rv = requests.request(method, server.mcp, headers=server.headers(KEY), timeout=10)
        assert rv.status_code == 405 and rv.headers["Allow"] == "POST"


def test_keys_and_scopes(server, units):
    rv = rpc(server, "resources/list", era=LEGACY)
    assert rv.status_code == 401 and error_of(rv, -32010)["id"] is None
    assert rv.headers["WWW-Authenticate"].startswith("Bearer")
    assert rpc(server, "resources/list", era=MODERN, key="wrong-key").status_code == 401
    # A push-only key may push but not read.
    rv = rpc(server, "resources/list", era=MODERN, key=PUSH_ONLY_KEY)
    assert rv.status_code == 403 and error_of(rv, -32011)
    rv = rpc(server, "tools/call", {"name": "context_search", "arguments": {"query": "hello"}}, key=PUSH_ONLY_KEY)
    assert rv.status_code == 200 and rv.json()["result"]["isError"] is True
    rv = rpc(server, "tools/call", {"name": "context_push", "arguments": {
        "type": "user_input", "source": "pytest_v1_mcp", "content": "pushed with a push-only key", "ttl": 60}},
        key=PUSH_ONLY_KEY)
    assert rv.json()["result"]["structuredContent"]["status"] == "ok"


def test_notifications_and_responses_get_202_without_body(server):
    for body, era in [({"jsonrpc": "2.0", "method": "notifications/initialized"}, LEGACY),
                      ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}, MODERN),
                      ({"jsonrpc": "2.0", "id": 9, "result": {}}, LEGACY)]:
        rv = post_raw(server, json.dumps(body), {"MCP-Protocol-Version": era}, key=KEY)
        assert rv.status_code == 202 and rv.content == b""


@pytest.mark.parametrize("requested, answered", [
    ("2025-11-25", "2025-11-25"), ("2025-06-18", "2025-06-18"), ("2025-03-26", "2025-03-26"),
    ("2024-11-05", "2025-11-25"), ("2026-07-28", "2025-11-25"), ("1999-01-01", "2025-11-25")])
def test_initialize_echoes_a_supported_revision(server, requested, answered):
    rv = rpc(server, "initialize", {"protocolVersion": requested, "capabilities": {},
                                    "clientInfo": {"name": "dify", "version": "1"}}, era=None, key=KEY)
    result = rv.json()["result"]
    assert result["protocolVersion"] == answered
    assert set(result["capabilities"]) == {"resources", "prompts", "tools"}
    assert result["serverInfo"]["name"] == "context-mode"
    # The negotiated revision then rides in the header of every request.
    rv = rpc(server, "ping", era=answered, key=KEY, id="p-1")
    assert rv.json() == {"jsonrpc": "2.0", "id": "p-1", "result": {}}


def test_protocol_version_header_rules(server):
    rv = rpc(server, "ping", era="1900-01-01", key=KEY)
    assert rv.status_code == 400 and error_of(rv, -32600)["error"]["data"]["requested"] == "1900-01-01"
    # 2026-07-28: unknown revision in the envelope → -32022 with supported/requested.
    rv = rpc(server, "server/discover", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}},
             key=KEY, headers={"MCP-Protocol-Version": "2099-01-01"})
    assert rv.status_code == 400
    assert error_of(rv, -32022)["error"]["data"] == {"supported": [MODERN], "requested": "2099-01-01"}
    # Header and envelope must agree, and the method header must mirror the body.
    rv = rpc(server, "resources/list", key=KEY, headers={"MCP-Protocol-Version": "2025-11-25X"})
    error_of(rv, -32020)
    rv = rpc(server, "resources/list", key=KEY, headers={"Mcp-Method": "tools/list"})
    error_of(rv, -32020)
    rv = rpc(server, "resources/read", {"uri": "context://units/000000000000"}, key=KEY,
             headers={"Mcp-Name": "context://units/111111111111"})
    error_of(rv, -32020)
    # A 2026-07-28 request without its envelope.
    rv = post_raw(server, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                  {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}, key=KEY)
    assert rv.status_code == 400 and error_of(rv, -32602)


def test_discover_and_cache_hints(server, units):
    rv = rpc(server, "server/discover", key=KEY).json()["result"]
    assert rv["supportedVersions"] == [MODERN] and rv["resultType"] == "complete"
    assert rv["cacheScope"] == "public" and rv["ttlMs"] > 0
    scopes = {}
    for method, params in [("resources/list", {}), ("resources/templates/list", {}), ("prompts/list", {}),
                           ("tools/list", {}), ("resources/read", {"uri": f"context://units/{units['mine']}"}),
                           ("resources/read", {"uri": "context://search/hello"})]:
        result = rpc(server, method, params, key=KEY).json()["result"]
        assert result["resultType"] == "complete" and isinstance(result["ttlMs"], int), method
        scopes[method + params.get("uri", "")] = result["cacheScope"]
        legacy = rpc(server, method, params, era=LEGACY, key=KEY).json()["result"]
        assert not {"resultType", "ttlMs", "cacheScope"} & set(legacy), method
    assert scopes == {"resources/list": "private", "resources/templates/list": "public", "prompts/list": "public",
                      "tools/list": "public", f"resources/readcontext://units/{units['mine']}": "private",
                      "resources/readcontext://search/hello": "private"}
    call = rpc(server, "tools/call", {"name": "context_search", "arguments": {"query": "hello"}}, key=KEY)
    assert call.json()["result"]["resultType"] == "complete"


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_unknown_methods(server, era):
    rv = rpc(server, "sampling/createMessage", {}, era=era, key=KEY)
    assert rv.status_code == (404 if era == MODERN else 200)
    error_of(rv, -32601)
    wrong_era = "ping" if era == MODERN else "server/discover"
    error_of(rpc(server, wrong_era, {}, era=era, key=KEY), -32601)
    error_of(rpc(server, "resources/subscribe", {"uri": "context://search/x"}, era=era, key=KEY), -32601)


# --- hostile JSON-RPC ---------------------------------------------------------------------------
HOSTILE = [
    (b"", -32700), (b"{", -32700), (b"\xff\xfe{}", -32700), (b"[" * 50_000 + b"]" * 50_000, -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","x":NaN}', -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"k":"\\ud800"}}}', -32700),
    (b"[]", -32600), (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', -32600), (b"1", -32600), (b'"ping"', -32600),
    (b"null", -32600), (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', -32600), (b'{"id":1,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":' + b"9" * 4000 + b',"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}', -32600), (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600), (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}', -32600), (b'{"jsonrpc":"2.0","id":1,"method":7}', -32600),
    (b'{"jsonrpc":"2.0","id":"' + b"x" * 5000 + b'","method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":[1,2]}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":"x"}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":17}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":[[[["x"]]]]}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"resources/list","params":{"cursor":12}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"context_search","arguments":"x"}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":["context_search"]}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"answer-with-context",'
     b'"arguments":{"question":5}}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":2025}}', -32602),
]


@pytest.mark.parametrize("body, code", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_messages_get_jsonrpc_errors(server, body, code):
    rv = post_raw(server, body, {"MCP-Protocol-Version": LEGACY}, key=KEY)
    assert rv.status_code in (200, 400), rv.status_code
    error_of(rv, code)


def test_hostile_values_inside_valid_calls_are_tool_errors_not_crashes(server):
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["a"] = {}
        node = node["a"]
    for arguments in [{"type": "tool_output", "source": "s\u0000x", "content": "c", "ttl": 60},
                      {"type": "tool_output", "source": "s", "content": {"json": "object"}, "ttl": 60},
                      {"type": "tool_output", "source": "s", "content": "c", "ttl": True},
                      {"type": "tool_output", "source": "s", "content": "c", "ttl": 60, "timestamp": 10**30},
                      {"type": "tool_output", "source": "s", "content": "c", "ttl": 60, "metadata": deep},
                      {"type": "tool_output", "source": "s", "content": "x" * (1024 * 1024 + 1), "ttl": 60}]:
        rv = rpc(server, "tools/call", {"name": "context_push", "arguments": arguments}, key=KEY)
        assert rv.status_code == 200, rv.text[:300]
        result = rv.json()["result"]
        assert result["isError"] is True or result["structuredContent"]["status"] == "ok"
    for arguments in [{"query": "x" * 20_000}, {"query": None}, {"query": "a", "types": ["nope"]},
                      {"query": "a", "since": "yesterday"}, {"query": "OR AND NOT \"* NEAR("}]:
        rv = rpc(server, "tools/call", {"name": "context_search", "arguments": arguments}, key=KEY)
        assert rv.status_code == 200, rv.text[:300]
        assert "result" in rv.json()


# --- resource URIs --------------------------------------------------------------------------------
def hostile_uris(cid: str) -> list[str]:
    return [
        f"context://units/../units/{cid}", f"context://units/%2e%2e%2f{cid}", f"context://units/%2E%2E%2F{cid}",
        "context://search/%2e%2e%2f", "context://search/..%2F", "context://search/%252e%252e%252f",
        f"context://units/%25{cid}", f"context://units/{cid}/extra", f"context://units/{cid}/",
        f"context://units/{cid}?query=1", f"context://units/{cid}#fragment", "context://search/hello?x=1",
        "context://search/hello#frag", "context://search/a/b", "context://search/", "context://search/hello+world",
        f"context://units/{cid.upper()}", f"context://units/{cid[:11]}", f"context://units/{cid}0",
        f"context://units/{cid}%0A", f"CONTEXT://units/{cid}", f"context://UNITS/{cid}", f"context:/units/{cid}",
        f"context://user@units/{cid}", f"context://units:80/{cid}", "file:///etc/passwd", f"http://units/{cid}",
        f"https://127.0.0.1/mcp/units/{cid}", "context://search/%FF%FE", "context://search/%00hello",
        "context://search/" + "a" * 10_240, f"context://units/{cid}" + "/" * 10_240, "", "context://",
        "context://search/%20",
    ]


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_hostile_uris_never_succeed(server, units, era):
    for uri in hostile_uris(units["mine"]):
        rv = rpc(server, "resources/read", {"uri": uri}, era=era, key=KEY)
        error_of(rv, NOT_FOUND[era])
    # Another tenant's unit, and an unknown one, look exactly alike.
    for cid in (units["theirs"], "0123456789ab"):
        error_of(rpc(server, "resources/read", {"uri": f"context://units/{cid}"}, era=era, key=KEY), NOT_FOUND[era])
    # The canonical spellings work.
    ok = rpc(server, "resources/read", {"uri": f"context://units/{units['mine']}"}, era=era, key=KEY).json()
    assert ok["result"]["contents"][0]["text"] == "hello from acme"
    ok = rpc(server, "resources/read", {"uri": "context://search/hello%20from%20acme"}, era=era, key=KEY).json()
    assert ok["result"]["contents"][0]["uri"] == "context://search/hello%20from%20acme"


def test_search_resource_escapes_stored_markdown(server):
    cid = push(server, "fence breaker ```\n# Injected heading\n```", key=KEY)["cid"]
    requests.post(server.url + "/mcp/search", json={"query": "breaker", "consistency": "strong"},
                  headers=server.headers(KEY), timeout=10)
    rv = rpc(server, "tools/call", {"name": "context_search", "arguments": {"query": "breaker",
                                                                            "consistency": "strong"}}, key=KEY)
    assert rv.json()["result"]["structuredContent"]["results"][0]["cid"] == cid
    for _ in range(100):
        text = rpc(server, "resources/read", {"uri": "context://search/breaker"}, key=KEY).json()[
            "result"]["contents"][0]["text"]
        if cid in text:
            break
        time.sleep(0.1)
    lines = text.splitlines()
    assert f"## 1. context://units/{cid}" in lines
    assert "# Injected heading" in lines            # inside the fence, as data
    fence_line = next(line for line in lines if line.startswith("````"))
    assert fence_line == "````text"                 # longer than any backtick run in the content


# --- pagination and tenants -----------------------------------------------------------------------
@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_cursors_page_newest_first_and_are_bound_to_the_tenant(server, units, era):
    batch = [{"type": "tool_output", "source": "pytest_v1_page", "timestamp": 1_790_000_000 + i, "ttl": 31_000_000,
              "content": f"page unit {era} {i}"} for i in range(60)]
    rv = requests.post(server.url + "/mcp/push", json={"units": batch}, headers=server.headers(OTHER_KEY), timeout=30)
    assert rv.status_code == 200
    seen, cursor, pages = [], None, 0
    while True:
        params = {"cursor": cursor} if cursor else {}
        result = rpc(server, "resources/list", params, era=era, key=OTHER_KEY).json()["result"]
        seen += [r["_meta"]["dev.context-mode/unit"]["seq"] for r in result["resources"]]
        pages += 1
        cursor = result.get("nextCursor")
        if not cursor:
            break
    assert pages >= 2 and seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) >= 61
    first = rpc(server, "resources/list", {}, era=era, key=OTHER_KEY).json()["result"]["nextCursor"]
    # A cursor minted for globex means nothing to acme; garbage or tampering is -32602 too.
    error_of(rpc(server, "resources/list", {"cursor": first}, era=era, key=KEY), -32602)
    tampered = first[:-2] + ("AA" if first[-2:] != "AA" else "BB")
    for bad in (tampered, "", "garbage", "A" * 10_000, first + "="):
        error_of(rpc(server, "resources/list", {"cursor": bad}, era=era, key=OTHER_KEY), -32602)


# --- resources/list is bounded (issue 14, item 2) -------------------------------------------------
def test_default_listing_fits_in_what_clients_page_through():
    from service.config import Config
    from service.mcp.resources import PAGE_SIZE
    # MCP Inspector stops at 64 pages; stay well inside that.
    assert Config().mcp_list_max_units == 500 and -(-500 // PAGE_SIZE) == 10


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_listing_stops_at_the_cap_and_older_units_stay_reachable(tmp_path_factory, era):
    srv = start_server(tmp_path_factory, "mcp-list-cap", keys=KEYS, env={"CONTEXT_MCP_LIST_MAX_UNITS": "70"})
    try:
        batch = [{"type": "tool_output", "source": "pytest_v1_cap", "timestamp": 1_790_000_000 + i,
                  "ttl": 31_000_000, "content": f"capped unit number{i}"} for i in range(100)]
        rv = requests.post(srv.url + "/mcp/push", json={"units": batch}, headers=srv.headers(KEY), timeout=30)
        assert rv.status_code == 200
        cids = [r["cid"] for r in rv.json()["results"]]
        seen, cursor, pages, last = [], None, 0, None
        while True:
            last = rpc(srv, "resources/list", {"cursor": cursor} if cursor else {}, era=era, key=KEY).json()["result"]
            seen += [r["uri"] for r in last["resources"]]
            pages += 1
            cursor = last.get("nextCursor")
            if not cursor:
                break
        assert pages == 2 and len(seen) == 70
        assert seen == [f"context://units/{c}" for c in reversed(cids)][:70]      # the newest 70, newest first
        assert last["_meta"]["dev.context-mode/list"]["truncated"] is True
        # The oldest unit is not listed but is still read by its URI and found by a search.
        oldest = cids[0]
        read = rpc(srv, "resources/read", {"uri": f"context://units/{oldest}"}, era=era, key=KEY).json()["result"]
        assert read["contents"][0]["text"] == "capped unit number0"
        found = rpc(srv, "tools/call", {"name": "context_search", "arguments": {
            "query": "number0", "consistency": "strong"}}, era=era, key=KEY).json()["result"]
        assert [r["uri"] for r in found["structuredContent"]["results"]][:1] == [f"context://units/{oldest}"]
    finally:
        srv.stop()


def test_a_listing_that_ends_below_the_cap_is_not_marked_truncated(server, units):
    result = rpc(server, "resources/list", {}, era=LEGACY, key=KEY).json()["result"]
    assert "nextCursor" not in result and "dev.context-mode/list" not in result.get("_meta", {})
