"""GET /openapi.json: valid OpenAPI 3.1, in sync with the Flask routes, importable as a Dify/Open WebUI tool."""
import re

import pytest
from openapi_spec_validator import validate

# Routes deliberately left out of the document, and why.
NOT_DESCRIBED = {
    "/mcp": "MCP Streamable HTTP: JSON-RPC, not REST (section 7)",
    "//retrieval": "alias of /retrieval for endpoints registered with a trailing slash",
    "/adapters/continue": "Continue's fixed protocol; duplicates searchUnits and would confuse an LLM picking tools",
    "/healthz": "operational", "/readyz": "operational", "/metrics": "operational (Prometheus text)",
    "/openapi.json": "the document itself",
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


def test_the_sync_check_catches_a_new_route(tmp_path):
    from service import create_app
    app = create_app({"data_dir": str(tmp_path / "d"), "background": False})
    try:
        app.add_url_rule("/mcp/units/<cid>/tags", "tags_probe", lambda cid: "", methods=["GET", "PUT"])
        doc = app.test_client().get("/openapi.json").get_json()
        assert missing_operations(app, doc) == ["GET /mcp/units/<cid>/tags", "PUT /mcp/units/<cid>/tags"]
    finally:
        app.extensions["context_shutdown"]()


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
                "getUnitLineage", "difyRetrieval"}
    assert set(ids) == expected


def test_bearer_security_and_server_url(doc):
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": "An API key: Authorization: Bearer <key>."}
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["servers"][0]["url"] == "http://context-mode:5000"


def test_server_url_comes_from_configuration(tmp_path):
    from service import create_app
    app = create_app({"data_dir": str(tmp_path / "d"), "background": False,
                      "public_url": "https://memory.example.com/", "extra_types": "design_note"})
    try:
        doc = app.test_client().get("/openapi.json").get_json()
        assert doc["servers"] == [{"url": "https://memory.example.com"}]
        push = doc["paths"]["/mcp/push"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "design_note" in push["properties"]["type"]["enum"]
        validate(doc)
    finally:
        app.extensions["context_shutdown"]()


def test_public_without_keys(live_server_factory):
    import requests
    server = live_server_factory(workers=1, keys={"k-0123456789abcdef": ("acme", ["search"])})
    rv = requests.get(server.url + "/openapi.json", timeout=5)
    assert rv.status_code == 200
    assert rv.json()["servers"][0]["url"] == "http://context-mode.test:5000"   # CONTEXT_PUBLIC_URL
