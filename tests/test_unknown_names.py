"""A name nobody can encode (a lone surrogate as an unknown field's name) is a 400 that names it escaped, on
every door that reports unknown fields and on both stores: it used to fail the answer's own encoding (a 500)."""
from __future__ import annotations

import pytest
import requests

BACKENDS = ("sqlite", "postgresql")
UNIT = '"type": "tool_output", "source": "surrogate_v1", "content": "named by a lone surrogate"'
TOOL = ('"name": "surrogate_tool", "description": "d", "input_schema": {"type": "object"}')


@pytest.mark.parametrize("method,path,raw", [
    ("POST", "/mcp/push", '{"\\ud800": 1, ' + UNIT + '}'),
    ("POST", "/mcp/search", '{"\\ud800": 1, "query": "x"}'),
    ("POST", "/mcp/context", '{"\\udfff": 1, "query": "x"}'),
    ("POST", "/mcp/forget", '{"\\ud800": 1}'),
    ("POST", "/mcp/tools", '{"\\ud800": 1, ' + TOOL + '}'),
    ("PUT", "/mcp/tools/surrogate_tool", '{"\\ud800": 1, ' + TOOL + '}'),
], ids=["push", "search", "context", "forget", "tools-post", "tools-put"])
def test_a_lone_surrogate_as_an_unknown_field_is_a_400_naming_it_escaped(live_server, method, path, raw):
    rv = requests.request(method, live_server.url + path, data=raw.encode(), timeout=10,
                          headers={"Content-Type": "application/json"})
    assert rv.status_code == 400, rv.text
    body = rv.json()
    assert body["code"] == "unknown_field" and body["field"] in ("\\ud800", "\\udfff"), body
    assert body["field"] in body["error"]


def test_a_batch_item_named_by_a_lone_surrogate_is_refused_alone(live_server):
    raw = '[{"\\ud800": 1, ' + UNIT + '}, {' + UNIT + '}]'
    rv = requests.post(live_server.url + "/mcp/push", data=raw.encode(), timeout=10,
                       headers={"Content-Type": "application/json"})
    assert rv.status_code == 200, rv.text
    bad, good = rv.json()["results"]
    assert (bad["status"], bad["code"], bad["field"]) == ("error", "unknown_field", "\\ud800")
    assert good["status"] == "ok"
    rv = requests.post(live_server.url + "/mcp/search", json={"query": "surrogate", "consistency": "strong"},
                       timeout=10)
    assert [r["cid"] for r in rv.json()["results"]] == [good["cid"]]
