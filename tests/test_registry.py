"""The tool registry (issue 16): REST CRUD with scopes, JSON Schema 2020-12 checks, credentials refused,
BM25 tool search (by a paraphrase among 500 tools), tenant isolation, MCP tool_search and
context://tools/{name}; the registry never calls a registered endpoint."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from conftest import ROOT, store_env
from mcp_support import LEGACY, McpServer, connect, rpc
from service.state import app_state

ADMIN, READER, PUSHER = "tools-admin-0123456789abcdef", "tools-reader-0123456789abcdef", "tools-pusher-0123456789abcdef"
OTHER_ADMIN = "tools-other-0123456789abcdef"
KEYS = {ADMIN: ("acme", ["push", "search", "admin"]), READER: ("acme", ["search"]), PUSHER: ("acme", ["push"]),
        OTHER_ADMIN: ("globex", ["search", "admin"])}
WEATHER = {"name": "get_weather", "title": "Weather now",
           "description": "Get the current weather forecast for a city: temperature, wind and rain.",
           "endpoint": "https://api.example.com/weather", "auth_type": "api_key", "tags": ["weather", "public"],
           "metadata": {"rate_limit_per_minute": 60, "max_tokens": 500},
           "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                            "properties": {"city": {"type": "string", "description": "City name"},
                                           "units": {"enum": ["metric", "imperial"], "default": "metric"}},
                            "required": ["city"], "additionalProperties": False},
           "output_schema": {"type": "object", "properties": {"temperature_c": {"type": "number"}}}}


# Both storage backends (issue 18): on PostgreSQL the registry is one table every node shares
# (service/store/postgresql/registry.py), with the same answers and the same ranking.
BACKENDS = ("sqlite", "postgresql")


# --- validation, in-process ---------------------------------------------------------------------------
def auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_crud_round_trip_with_scopes(keyed):
    c = keyed
    assert c.post("/mcp/tools", json=WEATHER, headers=auth(READER)).status_code == 403
    rv = c.post("/mcp/tools", json=WEATHER, headers=auth(ADMIN))
    assert rv.status_code == 200, rv.get_json()
    tool = rv.get_json()
    assert tool["version"] == 1 and tool["uri"] == "context://tools/get_weather"
    assert tool["input_schema"] == WEATHER["input_schema"] and tool["metadata"] == WEATHER["metadata"]
    assert c.post("/mcp/tools", json=WEATHER, headers=auth(ADMIN)).get_json()["code"] == "tool_exists"
    assert c.get("/mcp/tools/get_weather", headers=auth(PUSHER)).status_code == 403
    assert c.get("/mcp/tools/get_weather", headers=auth(READER)).get_json() == tool
    rv = c.put("/mcp/tools/get_weather", json=dict(WEATHER, description="Weather by city."), headers=auth(ADMIN))
    assert rv.get_json()["version"] == 2 and rv.get_json()["description"] == "Weather by city."
    assert c.put("/mcp/tools/get_weather", json=dict(WEATHER, name="other"), headers=auth(ADMIN)).status_code == 400
    assert c.put("/mcp/tools/nope", json=dict(WEATHER, name="nope"), headers=auth(ADMIN)).status_code == 404
    assert c.delete("/mcp/tools/get_weather", headers=auth(READER)).status_code == 403
    assert c.delete("/mcp/tools/get_weather", headers=auth(ADMIN)).get_json() == {"status": "deleted",
                                                                                   "name": "get_weather"}
    assert c.get("/mcp/tools/get_weather", headers=auth(READER)).status_code == 404
    assert c.get("/mcp/tools/..", headers=auth(READER)).status_code == 404


def _bad(**changes):
    tool = json.loads(json.dumps(WEATHER))
    for k, v in changes.items():
        if v is None:
            tool.pop(k, None)
        else:
            tool[k] = v
    return tool


@pytest.mark.parametrize("tool,status,code", [
    (_bad(description=None), 400, "missing_field"),
    (_bad(input_schema=None), 400, "missing_field"),
    (_bad(name="has space"), 400, "invalid_name"),
    (_bad(name=".hidden"), 400, "invalid_name"),
    (_bad(auth_type="magic"), 400, "invalid_auth_type"),
    (_bad(tags=["UPPER"]), 400, "invalid_tag"),
    (_bad(extra="x"), 400, "unknown_field"),
    (_bad(endpoint="ftp://files.example.com/x"), 400, "invalid_endpoint"),
    (_bad(endpoint="not a url"), 400, "invalid_endpoint"),
    (_bad(input_schema=[1, 2]), 400, "invalid_schema"),
    (_bad(input_schema={"type": "string"}), 400, "invalid_schema"),
    (_bad(input_schema={"type": "object", "properties": {"a": {"type": "strng"}}}), 400, "invalid_schema"),
    (_bad(input_schema={"type": "object", "required": "city"}), 400, "invalid_schema"),
    (_bad(input_schema={"type": "object", "properties": {"a": {"pattern": "(unclosed"}}}), 400, "invalid_schema"),
    (_bad(input_schema={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}), 400,
     "invalid_schema"),
    (_bad(output_schema={"type": "array"}), 400, "invalid_schema"),
    (_bad(description="Looks up\x00 the weather"), 400, "invalid_field"),    # (PostgreSQL's text: 500 once)
    (_bad(title="Weather\x00"), 400, "invalid_field"),
    (_bad(input_schema=json.loads('{"type": "object", "properties": {"a": ' * 40 + "{}" + "}}" * 40)), 400,
     "invalid_schema"),
])
def test_invalid_tools_are_refused_with_the_error_shape(keyed, tool, status, code):
    rv = keyed.post("/mcp/tools", json=tool, headers=auth(ADMIN))
    assert rv.status_code == status and rv.get_json()["code"] == code, rv.get_json()
    assert set(rv.get_json()) <= {"error", "code", "field"}
    assert keyed.get("/mcp/tools", headers=auth(READER)).get_json()["tools"] == []


JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


@pytest.mark.parametrize("changes,where", [
    ({"metadata": {"api_key": "a1b2c3d4e5f6g7h8"}}, "metadata.api_key"),
    ({"metadata": {"auth": {"clientSecret": "s3cr3t-value"}}}, "metadata.auth.clientSecret"),
    ({"metadata": {"notes": f"use {JWT}"}}, "metadata.notes"),
    ({"metadata": {"headers": ["Authorization: Bearer abcdefghijklmnop0123"]}}, "metadata.headers[0]"),
    ({"description": "Weather. Key: AKIAIOSFODNN7EXAMPLE"}, "description"),
    ({"endpoint": "https://user:hunter2@api.example.com/weather"}, "endpoint"),
    ({"endpoint": "https://api.example.com/weather?api_key=0123456789"}, "endpoint"),
    ({"input_schema": {"type": "object", "properties": {"token": {"type": "string",
                                                                  "default": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"}}}},
     "input_schema.properties.token.default"),
    ({"password": "hunter2"}, "password"),
    ({"headers": {"X-Api-Key": "x"}}, "headers"),
])
def test_credentials_are_never_stored(keyed, changes, where):
    rv = keyed.post("/mcp/tools", json=dict(WEATHER, **changes), headers=auth(ADMIN))
    body = rv.get_json()
    assert rv.status_code == 422 and body["code"] == "credential_not_allowed" and body["field"] == where, body
    assert "auth_type" in body["error"]
    assert keyed.get("/mcp/tools/get_weather", headers=auth(READER)).status_code == 404


def test_what_only_looks_like_a_credential_word_is_kept(keyed):
    tool = dict(WEATHER, metadata={"max_tokens": 100, "token_budget": 5, "api_key_header": "",
                                   "docs": "send 'Authorization: Bearer <your key>'"},
                input_schema={"type": "object", "properties": {"api_key": {"type": "string",
                                                                           "description": "The caller's key"}}})
    rv = keyed.post("/mcp/tools", json=tool, headers=auth(ADMIN))
    assert rv.status_code == 200, rv.get_json()


def test_search_ranks_filters_and_isolates_tenants(keyed):
    c = keyed
    tools = [WEATHER,
             {"name": "send_email", "description": "Send an email message to a recipient with a subject.",
              "auth_type": "oauth2", "tags": ["email"],
              "input_schema": {"type": "object", "properties": {"toAddress": {"type": "string"}}}},
             {"name": "lookup_order", "description": "查询订单的发货状态 order shipping status",
              "tags": ["orders"], "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}}}]
    for t in tools:
        assert c.post("/mcp/tools", json=t, headers=auth(ADMIN)).status_code == 200
    search = lambda q, **kw: c.get("/mcp/tools", query_string={"q": q, **kw}, headers=auth(READER)).get_json()["tools"]
    assert [t["name"] for t in search("is it going to rain in Paris")] == ["get_weather"]
    assert search("订单 发货")[0]["name"] == "lookup_order"                      # jieba, as for units
    assert search("to address")[0]["name"] == "send_email"                         # camelCase property names
    assert search("order_id")[0]["name"] == "lookup_order"
    hit = search("weather forecast")[0]
    assert hit["input_schema"] == WEATHER["input_schema"] and 0 < hit["score"] <= 1 and hit["bm25_score"] > 0
    assert search("weather", tags="email") == [] and search("weather", auth_type="oauth2") == []
    assert [t["name"] for t in search("send", tags="email", auth_type="oauth2")] == ["send_email"]
    assert search("the a of") == []                                                # stopwords only
    listed = c.get("/mcp/tools?limit=2", headers=auth(READER)).get_json()
    assert [t["name"] for t in listed["tools"]] == ["get_weather", "lookup_order"] and listed["next_after"]
    rest = c.get(f"/mcp/tools?limit=2&after={listed['next_after']}", headers=auth(READER)).get_json()
    assert [t["name"] for t in rest["tools"]] == ["send_email"] and "next_after" not in rest
    # another tenant sees none of them, and may register the same name for itself
    assert c.get("/mcp/tools?q=weather", headers=auth(OTHER_ADMIN)).get_json()["tools"] == []
    assert c.get("/mcp/tools/get_weather", headers=auth(OTHER_ADMIN)).status_code == 404
    assert c.delete("/mcp/tools/get_weather", headers=auth(OTHER_ADMIN)).status_code == 404
    assert c.post("/mcp/tools", json=dict(WEATHER, description="Globex weather"),
                  headers=auth(OTHER_ADMIN)).status_code == 200
    assert c.get("/mcp/tools/get_weather", headers=auth(READER)).get_json()["description"] == WEATHER["description"]


@pytest.mark.parametrize("query,code", [("top_k=0&q=x", "invalid_field"), ("top_k=x&q=x", "invalid_field"),
                                        ("q=x&auth_type=magic", "invalid_auth_type"), ("bogus=1", "unknown_field"),
                                        ("limit=500", "invalid_field")])
def test_bad_searches(keyed, query, code):
    rv = keyed.get("/mcp/tools?" + query, headers=auth(READER))
    assert rv.status_code == 400 and rv.get_json()["code"] == code


# --- live: clients, MCP, the 500-tool catalogue -------------------------------------------------------
class Recorder(BaseHTTPRequestHandler):
    hits: list = []

    def do_GET(self):   # noqa: N802 - http.server's naming
        Recorder.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_store_config):
    srv = McpServer(tmp_path_factory.mktemp("registry") / "data", keys=KEYS,
                    env={**store_env(module_store_config), "CONTEXT_RATE_LIMIT": "off"}).start()
    yield srv
    srv.stop()


def test_the_registry_never_calls_a_registered_endpoint(server):
    from context_mode_client import ContextModeClient
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    try:
        cm = ContextModeClient(server.url, api_key=ADMIN)
        cm.register_tool(dict(WEATHER, name="local_hook", endpoint=endpoint, description="Calls a local hook."))
        cm.update_tool("local_hook", dict(WEATHER, name="local_hook", endpoint=endpoint + "2",
                                          description="Calls a local hook, really."))
        assert cm.get_tool("local_hook")["endpoint"] == endpoint + "2"
        assert cm.find_tools("local hook")[0]["name"] == "local_hook"
        rpc(server, "resources/read", {"uri": "context://tools/local_hook"}, key=READER).raise_for_status()
        rpc(server, "tools/call", {"name": "tool_search", "arguments": {"query": "local hook"}}, key=READER)
        cm.delete_tool("local_hook")
        assert Recorder.hits == []
    finally:
        httpd.shutdown()


@pytest.mark.parametrize("conn", ["http-auto", "http-legacy"])
def test_mcp_tool_search_and_tool_resources(server, conn):
    requests.post(server.url + "/mcp/tools", json=WEATHER, headers=server.headers(ADMIN), timeout=10)

    async def body():
        async with connect(server, conn, key=READER) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["tool_search"].annotations.read_only_hint is True
            result = await client.call_tool("tool_search", {"query": "will it rain in Rome", "top_k": 3})
            assert not result.is_error, result
            best = result.structured_content["tools"][0]
            assert best["name"] == "get_weather" and best["input_schema"] == WEATHER["input_schema"]
            assert best["uri"] == "context://tools/get_weather"
            bad = await client.call_tool("tool_search", {"query": "x", "top_k": 500})
            assert bad.is_error and "top_k" in bad.content[0].text
            read = await client.read_resource("context://tools/get_weather")
            assert read.contents[0].mime_type == "application/json"
            assert json.loads(read.contents[0].text)["output_schema"] == WEATHER["output_schema"]
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert "context://tools/{name}" in templates
    asyncio.run(body())
    missing = rpc(server, "resources/read", {"uri": "context://tools/nope"}, key=READER).json()["error"]
    assert missing["code"] == -32602
    legacy = rpc(server, "resources/read", {"uri": "context://tools/nope"}, era=LEGACY, key=READER).json()["error"]
    assert legacy["code"] == -32002
    foreign = rpc(server, "resources/read", {"uri": "context://tools/get_weather"}, key=OTHER_ADMIN).json()
    assert foreign["error"]["code"] == -32602          # globex has no such tool


# (on PostgreSQL: tests/test_postgresql.py registers the same 500 tools on both backends and finds every
# judged request ranked alike, scores included)
@pytest.mark.sqlite_only
def test_a_paraphrase_finds_its_tool_among_500(server):
    """bench/data's 500 tools through the Python client; the judged paraphrases (bench/tools.py reports
    recall@5 over all of them) must keep finding their tools."""
    from context_mode_client import ContextModeClient
    cm = ContextModeClient(server.url, api_key=ADMIN)
    data = ROOT / "bench" / "data"
    catalogue = [json.loads(line) for line in (data / "tools.jsonl").read_text(encoding="utf-8").splitlines()]
    for tool in catalogue:
        cm.register_tool(dict(tool, tags=tool["tags"] + ["catalogue"]))
    assert sum(1 for _ in cm.list_tools(tags=["catalogue"])) == 500
    hits = cm.find_tools("turn this prospect into an opportunity", tags=["catalogue"])
    assert "salesforce_convert_lead" in [t["name"] for t in hits]
    judged = json.loads((data / "tool_queries.json").read_text(encoding="utf-8"))
    found = sum(q["tool"] in [t["name"] for t in cm.find_tools(q["query"], tags=["catalogue"])] for q in judged)
    assert found / len(judged) >= 0.6, found          # measured 0.64 (bench/README.md); a floor against regressions


def test_backup_and_restore_keep_the_registry(tmp_path):
    """tools.db is tenant data: `context-mode backup` copies it and `restore` brings it back, searchable."""
    from service import create_app
    from service.store.sqlite.backup import backup, restore
    app = create_app({"data_dir": str(tmp_path / "data"), "background": False})
    app_state(app).registry.create("default", WEATHER)
    manifest = backup(tmp_path / "data", tmp_path / "bk")
    app_state(app).shutdown()
    assert manifest["tenants"]["default"]["tools"]["rows"] == 1
    restore(tmp_path / "bk", tmp_path / "restored")
    app = create_app({"data_dir": str(tmp_path / "restored"), "background": False})
    try:
        found = app_state(app).registry.search("default", "rain forecast")
        assert [t["name"] for t in found] == ["get_weather"]
    finally:
        app_state(app).shutdown()
