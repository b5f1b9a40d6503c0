"""GET /openapi.json: valid OpenAPI 3.1, in sync with the Flask routes, importable as a Dify/Open WebUI tool."""
import re

import pytest
import requests
from openapi_spec_validator import validate
from service.state import app_state

# Routes deliberately left out of the document, and why.
NOT_DESCRIBED = {
    "/mcp": "MCP Streamable HTTP: JSON-RPC, not REST (section 7)",
    "//retrieval": "alias of /retrieval for endpoints registered with a trailing slash",
    "/adapters/continue": "Continue's fixed protocol; duplicates searchUnits and would confuse an LLM picking tools",
    "/healthz": "operational", "/readyz": "operational", "/metrics": "operational (Prometheus text)",
    "/openapi.json": "the document itself",
    "/": "redirects to the web console",
    "/console": "the web console (HTML)", "/console/": "the web console (HTML)",
    "/console/<name>": "the web console's script, style sheet and icon",
    "/console/session": "the web console's sign-in check (tenant, scopes and types of the presented key)",
}
IGNORED_METHODS = {"HEAD", "OPTIONS"}


def openapi_path(rule: str) -> str:
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def missing_operations(app, doc) -> list[str]:
    """Every (method, path) Flask serves that the document does not describe."""
    missing = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule in NOT_DESCRIBED:
            continue
        item = doc["paths"].get(openapi_path(rule.rule), {})
        for method in sorted(rule.methods - IGNORED_METHODS):
            if method.lower() not in item:
                missing.append(f"{method} {rule.rule}")
    return missing


def operations(doc):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            yield path, method, op


@pytest.fixture
def doc(client):
    rv = client.get("/openapi.json")
    assert rv.status_code == 200
    assert rv.mimetype == "application/json"
    return rv.get_json()


def test_document_is_valid_openapi_31(doc):
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_is_described(app, doc):
    assert missing_operations(app, doc) == []


def test_the_sync_check_catches_a_new_route(make_app):
    app = make_app()
    app.add_url_rule("/mcp/units/<cid>/tags", "tags_probe", lambda cid: "", methods=["GET", "PUT"])
    doc = app.test_client().get("/openapi.json").get_json()
    assert missing_operations(app, doc) == ["GET /mcp/units/<cid>/tags", "PUT /mcp/units/<cid>/tags"]


def test_no_operation_for_a_route_that_does_not_exist(app, doc):
    served = {(m.lower(), openapi_path(r.rule)) for r in app.url_map.iter_rules() for m in r.methods}
    for path, method, _ in operations(doc):
        assert (method, path) in served, f"{method.upper()} {path} is described but not served"


def test_every_operation_is_importable_as_a_tool(doc):
    ids = []
    for path, method, op in operations(doc):
        where = f"{method.upper()} {path}"
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", op.get("operationId", "")), where
        assert op.get("summary") and op.get("description"), where
        assert "200" in op["responses"], where
        ids.append(op["operationId"])
        body = op.get("requestBody")
        if body:
            # Flat: Dify turns the top-level properties into tool parameters and resolves no nested $ref.
            schema = body["content"]["application/json"]["schema"]
            assert schema["type"] == "object" and schema["properties"], where
            assert "$ref" not in repr(schema) and "allOf" not in schema and "oneOf" not in schema, where
            for name, prop in schema["properties"].items():
                assert prop.get("description") or name == "query", f"{where} {name}"
        for param in op.get("parameters", []):
            assert "schema" in param and param["in"] in ("query", "path"), where
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    expected = {"pushUnits", "searchUnits", "searchUnitsByQueryString", "packContext", "getUnit", "deleteUnit",
                "getUnitLineage", "difyRetrieval", "listUnits", "getStats", "exportUnits", "forgetUnits",
                # issue 16: the live stream and the tool registry
                "streamUnits", "findTools", "registerTool", "getTool", "updateTool", "deleteTool"}
    assert set(ids) == expected


def test_bearer_security_and_server_url(doc):
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": "An API key: Authorization: Bearer <key>."}
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["servers"][0]["url"] == "http://context-mode:5000"


def test_server_url_comes_from_configuration(make_app):
    app = make_app(public_url="https://memory.example.com/", extra_types="design_note")
    doc = app.test_client().get("/openapi.json").get_json()
    assert doc["servers"] == [{"url": "https://memory.example.com"}]
    push = doc["paths"]["/mcp/push"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "design_note" in push["properties"]["type"]["enum"]
    validate(doc)


def test_public_without_keys(live_server_factory):
    server = live_server_factory(workers=1, keys={"k-0123456789abcdef": ("acme", ["search"])})
    rv = requests.get(server.url + "/openapi.json", timeout=5)
    assert rv.status_code == 200
    assert rv.json()["servers"][0]["url"] == "http://context-mode.test:5000"   # CONTEXT_PUBLIC_URL


# --- importers' own parsers, re-implemented from their source (issue 14, item 1) ----------------
# openapi-spec-validator accepts `"type": ["object", "null"]`, but Dify's importer does not: its
# ApiBasedToolSchemaParser (langgenius/dify, api/core/tools/utils/parser.py) tests each parameter's
# and each top-level body property's type with `typ in {"integer", "number"}`, which raises
# "unhashable type: 'list'" for a list (langgenius/dify#12768). These are ports of that logic.
DIFY_PARAMETER_TYPES = {"integer": "number", "number": "number", "boolean": "boolean", "string": "string",
                        "array": "array", "object": "object"}


def dify_parameter_type(prop: dict):
    """Dify's _get_tool_parameter_type: the property's own type, else its schema's, looked up in a set."""
    typ = prop.get("type", (prop.get("schema") or {}).get("type"))
    if typ in {"integer", "number"}:        # raises TypeError on a list-valued type, as Dify does
        return "number"
    return DIFY_PARAMETER_TYPES.get(typ)


def dify_parse(doc: dict) -> list[dict]:
    """Dify's parse_openapi_to_tool_bundle, reduced to what can fail: one bundle per operation."""
    assert doc["servers"], "Dify: No server found in the openapi yaml."
    server_url = doc["servers"][0]["url"]
    bundles = []
    for path, item in doc["paths"].items():
        for method in ("get", "post", "put", "delete", "patch", "head", "options", "trace"):
            if method not in item:
                continue
            op = item[method]
            params = [{"name": p["name"], "required": p.get("required", False),
                       "default": (p.get("schema") or {}).get("default"), "type": dify_parameter_type(p) or "string"}
                      for p in op.get("parameters", [])]
            for content in op.get("requestBody", {}).get("content", {}).values():
                if "schema" not in content:
                    continue
                schema = content["schema"]
                if "$ref" in schema:       # Dify resolves only a top-level $ref, by walking the pointer
                    schema = doc
                    for part in content["schema"]["$ref"].split("/")[1:]:
                        schema = schema[part]
                required = schema.get("required", [])
                for name, prop in schema.get("properties", {}).items():
                    params.append({"name": name, "required": name in required, "default": prop.get("default"),
                                   "description": prop.get("description", ""),
                                   "type": dify_parameter_type(prop) or "string"})
            bundles.append({"server_url": server_url + path, "method": method,
                            "operation_id": op.get("operationId"),
                            "summary": op.get("description", op.get("summary")), "parameters": params})
    return bundles


def test_dify_tool_parser_accepts_the_document(doc):
    bundles = dify_parse(doc)
    ids = {b["operation_id"] for b in bundles}
    assert "difyRetrieval" in ids and "pushUnits" in ids
    retrieval = next(b for b in bundles if b["operation_id"] == "difyRetrieval")
    types = {p["name"]: p["type"] for p in retrieval["parameters"]}
    assert types["metadata_condition"] == "object" and types["query"] == "string"
    search = next(b for b in bundles if b["operation_id"] == "searchUnits")
    assert {p["name"]: p["type"] for p in search["parameters"]}["top_k"] == "number"


def test_the_dify_port_fails_on_a_list_valued_type():
    bad = {"servers": [{"url": "http://x"}], "paths": {"/r": {"post": {"operationId": "r", "requestBody": {
        "content": {"application/json": {"schema": {"type": "object", "properties": {
            "m": {"type": ["object", "null"]}}}}}}}}}}
    with pytest.raises(TypeError, match="unhashable"):
        dify_parse(bad)


def test_no_schema_anywhere_has_a_list_valued_type(doc):
    """Importers differ in how deep they look; a single-string type everywhere satisfies all of them."""
    def walk(node, where):
        if isinstance(node, dict):
            assert not isinstance(node.get("type"), list), where
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")
    walk(doc, "#")


def openwebui_tools(doc: dict) -> list[dict]:
    """Open WebUI's tool-server loader (backend/open_webui/utils/tools.py): one function per operation with
    an operationId; path/query parameters and the body's top-level properties become its parameters."""
    tools = []
    for item in doc["paths"].values():
        for op in item.values():
            if not op.get("operationId"):
                continue
            props, required = {}, []
            for p in op.get("parameters", []):
                props[p["name"]] = {"type": p["schema"]["type"], "description": p.get("description", "")}
                if p.get("required"):
                    required.append(p["name"])
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                props.update(body["properties"])
                required += body.get("required", [])
            tools.append({"name": op["operationId"], "description": op.get("description", op.get("summary")),
                          "parameters": {"type": "object", "properties": props, "required": required}})
    return tools


def test_open_webui_loader_accepts_the_document(doc):
    tools = openwebui_tools(doc)
    assert len(tools) == 18       # 12, and issue 16's stream and five tool-registry operations
    for tool in tools:
        assert tool["description"]
        for name, prop in tool["parameters"]["properties"].items():
            assert isinstance(prop.get("type"), str), f"{tool['name']}.{name}"


# --- CONTEXT_PUBLIC_URL (issue 14, item 10) -------------------------------------------------------------
@pytest.mark.parametrize("url,problem", [
    ("http://context-mode:5000", None), ("https://memory.example.com", None), ("http://8.8.8.8:5000", None),
    ("http://127.0.0.1:5000", "loopback"), ("http://localhost:5000", "loopback"), ("http://[::1]:5000", "loopback"),
    ("http://10.1.2.3:5000", "private"), ("http://192.168.1.5", "private"), ("http://0.0.0.0:5000", "unspecified"),
    ("http://169.254.1.1", "link-local"), ("no-scheme", "no host")])
def test_public_url_problems(url, problem):
    from service.adapters.openapi import public_url_problem
    got = public_url_problem(url)
    assert (got is None) if problem is None else (problem in got)


def test_a_loopback_public_url_is_warned_at_start(make_app, caplog):
    for url, warned in (("http://127.0.0.1:5000", True), ("https://memory.example.com", False)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            app = make_app(public_url=url)
        app_state(app).shutdown()
        assert ("Dify refuses" in caplog.text) is warned, url


# --- /openapi.json?profile=dify: what a Dify agent should get as tools (issue 26, item 4) ------------
DIFY_TOOLS = {"searchUnits", "packContext", "pushUnits", "getUnit", "getUnitLineage"}


def test_the_dify_profile_holds_only_what_an_agent_should_call(client, doc):
    rv = client.get("/openapi.json?profile=dify")
    assert rv.status_code == 200
    dify = rv.get_json()
    validate(dify)
    assert {op["operationId"] for _, _, op in operations(dify)} == DIFY_TOOLS
    assert {b["operation_id"] for b in dify_parse(dify)} == DIFY_TOOLS
    for path, method, op in operations(dify):              # the same operations as the whole document's
        assert op == doc["paths"][path][method]
    assert set(dify["components"]["schemas"]) < set(doc["components"]["schemas"])
    text = rv.get_data(as_text=True)
    for ref in set(re.findall(r'"#/components/schemas/([^"]+)"', text)):
        assert ref in dify["components"]["schemas"], ref
    assert len(text) < len(client.get("/openapi.json").get_data()) / 2


def test_an_unknown_profile_is_400(client):
    rv = client.get("/openapi.json?profile=everything")
    assert rv.status_code == 400 and rv.get_json()["code"] == "invalid_field" and rv.get_json()["field"] == "profile"


def test_a_dify_agent_calls_the_profiles_tools_on_a_live_server(live_server_factory):
    """Each tool of the profile called the way Dify's ApiTool sends it: path parameters in the URL, the
    body's top-level properties as JSON, the key as a Bearer header."""
    key = "difytool-0123456789abcdef"
    server = live_server_factory(workers=1, keys={key: ("acme", ["push", "search"])})
    doc = requests.get(server.url + "/openapi.json?profile=dify", timeout=10).json()
    tools = {b["operation_id"]: b for b in dify_parse(doc)}
    headers = {"Authorization": f"Bearer {key}"}

    def call(name, **args):
        tool = tools[name]
        url = tool["server_url"].replace("http://context-mode.test:5000", server.url)
        for p in tool["parameters"]:
            if "{" + p["name"] + "}" in url:
                url = url.replace("{" + p["name"] + "}", str(args.pop(p["name"])))
        rv = requests.request(tool["method"], url, json=args or None, headers=headers, timeout=10)
        assert rv.status_code == 200, (name, rv.text)
        return rv.json()
    pushed = call("pushUnits", type="tool_output", source="dify_agent_v1", content="订单 ORD-1212 已签收")
    assert call("getUnit", cid=pushed["cid"])["content"] == "订单 ORD-1212 已签收"
    assert call("getUnitLineage", cid=pushed["cid"])["unit"]["cid"] == pushed["cid"]
    assert [r["cid"] for r in call("searchUnits", query="ORD-1212 签收")["results"]] == [pushed["cid"]]
    assert pushed["cid"] in call("packContext", query="ORD-1212")["context"]
