"""Issue 25, findings 7 and 11: the registry refuses credentials in every string of a tool (this service's
own keys included) and schemas whose $refs point outside them, loop, or fan out; through a real gunicorn
on both backends. Issue 39: the credentials are found by the hooks' own detector (every shape of
tests/secret_corpus.py refused, its near-misses kept), and recursive schemas are told from schema bombs."""
from __future__ import annotations

import json

import pytest
import requests

from conftest import LiveServer, store_env
from secret_corpus import NEAR_MISSES, SECRET_KEYS, SECRETS
from test_registry import ADMIN, KEYS, READER, WEATHER

BACKENDS = ("sqlite", "postgresql")
OBJ = {"type": "object"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_store_config):
    srv = LiveServer(tmp_path_factory.mktemp("creds") / "data", keys=KEYS,
                     env={**store_env(module_store_config), "CONTEXT_RATE_LIMIT": "off"}).start()
    yield srv
    srv.stop()


def tool(**changes) -> dict:
    out = json.loads(json.dumps(WEATHER))
    out.update(changes)
    return out


def schema(**props) -> dict:
    return {"type": "object", "properties": props}


CREDENTIALS = [
    ("openai_title", tool(title="sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c")),
    ("bearer_in_schema_description", tool(input_schema=schema(q={"type": "string",
                                          "description": "send Bearer eyJhbGciOi0123456789abcdefXYZ"}))),
    ("aws_in_schema_description", tool(input_schema=schema(q={"type": "string",
                                       "description": "uses AKIAIOSFODNN7EXAMPLE"}))),
    ("x_api_key_keyword", tool(input_schema={"type": "object", "x-api-key": "a1b2c3d4e5f6a7b8"})),
    ("x_password_keyword", tool(input_schema={"type": "object", "x-password": "hunter2hunter2"})),
    ("password_default", tool(input_schema=schema(password={"type": "string", "default": "hunter2"}))),
    ("postgres_url_in_metadata", tool(metadata={"db": "postgres://admin:pw@db.internal:5432/app"})),
    ("access_token_fragment", tool(endpoint="https://api.example.com/weather#access_token=abc123def456")),
    ("access_token_fragment_kv", tool(endpoint="https://api.example.com/weather#x=1&token=abc123")),
    ("own_key_in_description", tool(description="Weather. Use cms_" + "A" * 43)),
    ("own_key_in_metadata_key", tool(metadata={"cms_" + "b" * 43: 1})),
    ("github_in_enum", tool(input_schema=schema(t={"enum": ["ghp_" + "a" * 36]}))),
    ("slack_in_examples", tool(input_schema=schema(t={"examples": ["xoxb-1234567890-abcdefghij"]}))),
    ("jwt_in_title", tool(title="eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P")),
    ("user_info", tool(endpoint="https://svc:s3cret@api.example.com/weather")),
]


@pytest.mark.parametrize("name,body", CREDENTIALS, ids=[c[0] for c in CREDENTIALS])
def test_realistic_credentials_are_refused_everywhere_in_a_tool(server, name, body):
    body["name"] = f"cred_{name}"
    rv = requests.post(server.url + "/mcp/tools", json=body, headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 422 and rv.json()["code"] == "credential_not_allowed", (name, rv.text)
    assert requests.get(f"{server.url}/mcp/tools/cred_{name}", headers=server.headers(READER),
                        timeout=10).status_code == 404


def fanout(levels: int) -> dict:
    defs = {"d0": {"type": "string"}}
    for i in range(1, levels):
        defs[f"d{i}"] = {"type": "array", "items": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]}
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": f"#/$defs/d{levels - 1}"}}}


BOMBS = [
    ("remote_ref", {"type": "object", "properties": {"a": {"$ref": "http://169.254.169.254/latest/meta-data"}}}),
    ("remote_id", {"type": "object", "$id": "https://evil.example/schema"}),
    ("relative_ref", {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}),
    ("cyclic_ref", {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "properties": {"x": {"$ref": "#/$defs/a"}}}),
    ("fanout_2_to_59", fanout(60)),
    ("dangling_ref", {"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}}),
    # issue 39, low 10: loops that stay at one place of the instance, and expansion through in-place keywords
    ("self_ref_in_place", {"type": "object", "allOf": [{"$ref": "#"}]}),
    ("not_self", {"type": "object", "not": {"$ref": "#"}}),
    ("anchor_loop", {"type": "object", "$defs": {"a": {"$anchor": "a", "anyOf": [{"$ref": "#b"}]},
                                                 "b": {"$anchor": "b", "if": {"$ref": "#a"}}},
                     "properties": {"x": {"$ref": "#a"}}}),
    ("dangling_anchor", {"type": "object", "properties": {"x": {"$ref": "#nowhere"}}}),
    ("allof_fanout", {"type": "object", "$defs": {"d0": {"type": "string"}, **{
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]} for i in range(1, 40)}},
        "properties": {"x": {"$ref": "#/$defs/d39"}}}),
    ("properties_fanout", {"type": "object", "$defs": {"d0": {"type": "string"}, **{
        f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i - 1}"},
                                                   "b": {"$ref": f"#/$defs/d{i - 1}"}}} for i in range(1, 40)}},
        "properties": {"x": {"$ref": "#/$defs/d39"}}}),
]


@pytest.mark.parametrize("name,input_schema", BOMBS, ids=[b[0] for b in BOMBS])
def test_schema_bombs_are_refused(server, name, input_schema):
    rv = requests.post(server.url + "/mcp/tools", json=tool(name=f"bomb_{name}", input_schema=input_schema),
                       headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 400 and rv.json()["code"] == "invalid_schema", (name, rv.text)


def test_local_refs_and_credential_words_without_values_are_kept(server):
    ok = tool(name="local_refs", input_schema={
        "type": "object", "$defs": {"city": {"type": "string"}},
        "properties": {"from": {"$ref": "#/$defs/city"}, "to": {"$ref": "#/$defs/city"},
                       "password": {"type": "string", "description": "The caller's own password"},
                       "api_key": {"type": "string", "minLength": 8}},
        "x-api-key": ""}, endpoint="https://api.example.com/weather#section")
    rv = requests.post(server.url + "/mcp/tools", json=ok, headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 200, rv.text


# Valid recursive schemas (issue 39, low 10): each cycle passes through a keyword that applies to a part of the
# instance, so validation follows the instance down and ends with it.
TREE = {"type": "object", "$defs": {"node": {"type": "object", "properties": {
    "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "properties": {"tree": {"$ref": "#/$defs/node"}}}
RECURSIVE = [
    ("items_root", {"type": "object", "properties": {"x": {"type": "array", "items": {"$ref": "#"}}}},
     {"x": [{"x": [{"x": []}]}]}, {"x": [{"x": 5}]}),
    ("properties_root", {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}},
     {"next": {"next": {"v": 1}}}, {"next": {"v": "one"}}),
    ("defs_tree", TREE, {"tree": {"name": "a", "children": [{"name": "b", "children": []}]}},
     {"tree": {"children": [{"name": 7}]}}),
    ("anchor", {"type": "object", "$defs": {"n": {"$anchor": "node", "type": "object",
                                                  "additionalProperties": {"$ref": "#node"}}},
                "properties": {"root": {"$ref": "#node"}}}, {"root": {"a": {"b": {}}}}, {"root": {"a": 1}}),
    ("dynamic_anchor", {"type": "object", "$dynamicAnchor": "meta",
                        "properties": {"kids": {"type": "array", "items": {"$dynamicRef": "#meta"}}}},
     {"kids": [{"kids": []}]}, {"kids": [1]}),
]


# Issue 50, L3: literal {"$ref": ...} values and %-escaped pointers, both valid JSON Schema, were refused (400).
LITERAL_REFS = [
    ("enum_literal", {"type": "object", "properties": {"p": {"enum": [{"$ref": "#/nowhere"}, "x"]}}},
     {"p": {"$ref": "#/nowhere"}}, {"p": "y"}),
    ("const_literal", {"type": "object", "properties": {"p": {"const": {"$ref": "https://example.com/x"}}}},
     {"p": {"$ref": "https://example.com/x"}}, {"p": 1}),
    ("examples_literal", {"type": "object", "properties": {"p": {"type": "object", "examples": [{"$id": "x"}]}}},
     {"p": {}}, {"p": 1}),
    ("escaped_pointer", {"type": "object", "$defs": {"a b": {"type": "integer"}, "c%d": {"type": "string"}},
                         "properties": {"n": {"$ref": "#/$defs/a%20b"}, "s": {"$ref": "#/$defs/c%25d"}}},
     {"n": 1, "s": "x"}, {"n": "one"}),
    ("property_named_enum", {"type": "object", "properties": {"enum": {"$ref": "#/$defs/i"}},
                             "$defs": {"i": {"type": "integer"}}}, {"enum": 1}, {"enum": "x"}),
]


@pytest.mark.parametrize("name,input_schema,good,bad", RECURSIVE + LITERAL_REFS,
                         ids=[r[0] for r in RECURSIVE + LITERAL_REFS])
def test_recursive_schemas_literal_refs_and_escaped_pointers_are_accepted(server, name, input_schema, good, bad):
    from jsonschema import Draft202012Validator
    validator = Draft202012Validator(input_schema)         # a real validator terminates on them
    assert validator.is_valid(good) and not validator.is_valid(bad)
    body = tool(name=f"recursive_{name}", input_schema=input_schema)
    rv = requests.post(server.url + "/mcp/tools", json=body, headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 200, (name, rv.text)
    rv = requests.get(f"{server.url}/mcp/tools/recursive_{name}", headers=server.headers(READER), timeout=10)
    assert rv.json()["input_schema"] == input_schema


def test_an_escaped_pointer_to_nothing_is_still_refused(server):
    body = tool(name="escaped_nowhere", input_schema={"type": "object", "$defs": {"a b": {"type": "integer"}},
                                                      "properties": {"n": {"$ref": "#/$defs/a%20c"}}})
    rv = requests.post(server.url + "/mcp/tools", json=body, headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 400 and rv.json()["code"] and "points at nothing" in rv.json()["error"], rv.text


@pytest.mark.parametrize("name", ["self_ref_in_place", "not_self", "anchor_loop"])
def test_the_loops_refused_are_the_ones_a_validator_cannot_finish(name):
    from jsonschema import Draft202012Validator
    schema = dict(BOMBS)[name]
    with pytest.raises(RecursionError):
        Draft202012Validator(schema).is_valid({"x": 1})


# --- issue 39, finding 5: one detector, the hooks' and the registry's; every shape of the corpus is refused --------

@pytest.mark.parametrize("shape,text,secret", SECRETS, ids=[s[0] for s in SECRETS])
def test_every_secret_shape_is_refused_in_a_description(server, shape, text, secret):
    body = tool(name=f"corpus_{shape}", description=f"Calls the service.\n{text}\nThen answers.")
    rv = requests.post(server.url + "/mcp/tools", json=body, headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 422 and rv.json()["code"] == "credential_not_allowed", (shape, rv.text)
    assert secret not in rv.text


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_every_secret_named_metadata_key_is_refused(server, key):
    rv = requests.post(server.url + "/mcp/tools", json=tool(name="corpus_key", metadata={key: "abc12345"}),
                       headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 422 and rv.json()["field"] == f"metadata.{key}", rv.text


def test_near_misses_are_registered_as_written(server):
    for i, text in enumerate(NEAR_MISSES):
        body = tool(name=f"near_miss_{i}", description=f"Example output: {text}")
        rv = requests.post(server.url + "/mcp/tools", json=body, headers=server.headers(ADMIN), timeout=10)
        assert rv.status_code == 200, (text, rv.text)
        got = requests.get(f"{server.url}/mcp/tools/near_miss_{i}", headers=server.headers(READER), timeout=10)
        assert got.json()["description"] == body["description"]


def test_a_large_schema_without_references_is_no_bomb(server):
    """Its own size is bounded by the 256 KiB cap; only what references add is an expansion (it used to be
    refused past 10,000 nodes, saying "inlining its $refs", with none in it)."""
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d"} for i in range(5000)}}
    rv = requests.post(server.url + "/mcp/tools", json=tool(name="wide_schema", input_schema=big),
                       headers=server.headers(ADMIN), timeout=30)
    assert rv.status_code == 200, rv.text[:300]


def test_a_tool_name_shaped_like_a_token_is_refused(server):
    """Issue 50, I2: a tool name is read by every key of the tenant, so it is scanned for credentials as a tool's
    other strings are (a name of GitHub-token shape was accepted)."""
    from secret_corpus import ALNUM, r
    name = "ghp_" + r(ALNUM, 36)
    rv = requests.post(server.url + "/mcp/tools", json=tool(name=name), headers=server.headers(ADMIN), timeout=10)
    assert rv.status_code == 422 and rv.json()["code"] == "credential_not_allowed", rv.text
    assert rv.json()["field"] == "name"
    assert requests.get(f"{server.url}/mcp/tools/{name}", headers=server.headers(READER), timeout=10).status_code == 404
    rv = requests.post(server.url + "/mcp/tools", json=tool(name="ghp_lookup"), headers=server.headers(ADMIN),
                       timeout=10)
    assert rv.status_code == 200, rv.text
