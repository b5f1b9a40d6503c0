"""One declaration per request shape (service/params.py, issue 13): every door accepts exactly the search
fields declared for it, validates them the same way, and advertises exactly them."""
import pytest

from service import params
from service.units import FIELDS, PUSH_FIELDS

# A value each kind of field refuses, as JSON and as a query-string value (None: nothing is invalid there).
BAD = {"text": (5, None), "integer": ("x", "x"), "count": ("x", "x"), "number": ("x", "x"),
       "boolean": ("x", None), "choice": ("zzz", "zzz"), "types": (5, "no_such_type"), "source": ("", ""),
       "key": ("", "a\x01b"), "cid": ("XYZ", "XYZ")}
ALL_NAMES = [f.name for f in params.PACKING + params.SEARCH] + ["tenant", "other"]


def mcp_call(client, arguments):
    rv = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                   "params": {"name": "context_search", "arguments": arguments}},
                     headers={"MCP-Protocol-Version": "2025-11-25"})
    assert rv.status_code == 200, rv.get_data(as_text=True)
    return rv.get_json()["result"]


def refused_field(door, client, name, value):
    """The field a door's 400 (or the tool's isError result) names, or None when it accepted the request."""
    if door == "tool":
        result = mcp_call(client, {"query": "x", name: value} if name != "query" else {name: value})
        if not result.get("isError"):
            return None
        text = result["content"][0]["text"]
        return text.split("(field '")[1].split("'")[0] if "(field '" in text else text
    if door == "continue":
        rv = client.post("/adapters/continue", json={"query": "x", "options": {name: value}})
    else:
        path = "/mcp/search" if door == "search" else "/mcp/context"
        rv = client.post(path, json={"query": "x", name: value} if name != "query" else {name: value})
    return None if rv.status_code == 200 else rv.get_json()["field"]


@pytest.mark.parametrize("door", ["search", "context", "tool", "continue"])
def test_every_door_validates_exactly_its_declared_fields(client, door):
    declared = params.names(door)
    for f in params.fields(door):
        assert refused_field(door, client, f.name, BAD[f.kind][0]) == f.name, (door, f.name)
    for name in ALL_NAMES:
        if name in declared:
            continue
        got = refused_field(door, client, name, "x")
        if door == "continue":
            assert got is None, name      # the user's own options: ignored, never a search field
        else:
            assert got == name, (door, name)


def test_the_query_string_takes_the_search_fields_by_kind(client):
    for f in params.fields("search"):
        key = "q" if f.name == "query" else f.name
        bad = BAD[f.kind][1]
        if bad is None:
            assert client.get("/mcp/search", query_string={"q": "x", key: "true"}).status_code == 200, key
            continue
        rv = client.get("/mcp/search", query_string={"q": "x", key: bad})
        assert rv.status_code == 400 and rv.get_json()["field"] == f.name, (key, rv.get_json())
    for name in ALL_NAMES:
        if name not in params.names("search"):
            rv = client.get("/mcp/search", query_string={"q": "x", name: "1"})
            assert rv.status_code == 400 and rv.get_json()["code"] == "unknown_field", name


def test_the_advertised_schemas_are_the_declaration(client):
    doc = client.get("/openapi.json").get_json()
    body = doc["paths"]["/mcp/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert list(body["properties"]) == list(params.names("search"))
    body = doc["paths"]["/mcp/context"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert list(body["properties"]) == list(params.names("context"))
    assert body["properties"]["top_k"]["default"] == 20
    query = [p["name"] for p in doc["paths"]["/mcp/search"]["get"]["parameters"]]
    assert query == ["q" if n == "query" else n for n in params.names("search")]
    push = doc["paths"]["/mcp/push"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert tuple(push["properties"]) == FIELDS == tuple(f.name for f in PUSH_FIELDS)
    rv = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                     headers={"MCP-Protocol-Version": "2025-11-25"})
    tools = {t["name"]: t for t in rv.get_json()["result"]["tools"]}
    search = tools["context_search"]["inputSchema"]
    assert list(search["properties"]) == list(params.names("tool")) and search["additionalProperties"] is False
    assert set(tools["context_push"]["inputSchema"]["properties"]) == set(FIELDS)
    for f in params.SEARCH:
        assert (doc["paths"]["/mcp/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
                ["properties"][f.name]["description"]) == f.description


def test_context_defaults(client):
    p, budget, max_chars = params.parse_context({"query": "q"}, client.application.config["CONTEXT"])
    assert (p.top_k, budget, max_chars) == (20, 2000, 2000)
    # An explicit null is the field's own default (as before: only an absent top_k took the door's).
    p, _, _ = params.parse_context({"query": "q", "top_k": None}, client.application.config["CONTEXT"])
    assert p.top_k == 10
