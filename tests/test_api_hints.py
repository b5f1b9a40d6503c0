"""Issue 26, item 9: the API's papercuts. Repeated list parameters count whole (others are 400), a body's
``q`` is pointed at ``query``, a millisecond timestamp is named as one, a malformed CID in a path is
400 invalid_cid like a malformed parent_cid."""
import time

import pytest

from conftest import assert_error, make_unit

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture
def three_types(client):
    """One unit of each of three types, all holding 'papercut'; returns type -> cid."""
    out = {}
    for utype in ("user_input", "tool_output", "system_notice"):
        rv = client.post("/mcp/push", json=make_unit(f"papercut {utype}", type=utype))
        assert rv.status_code == 200, rv.get_json()
        out[utype] = rv.get_json()["cid"]
    return out


@pytest.mark.parametrize("query_string", [
    "types=user_input&types=tool_output", "types=user_input,tool_output", "types=user_input&types=tool_output,user_input"])
def test_search_takes_every_types_value(client, three_types, query_string):
    rv = client.get(f"/mcp/search?q=papercut&consistency=strong&{query_string}")
    assert rv.status_code == 200, rv.get_json()
    assert {r["type"] for r in rv.get_json()["results"]} == {"user_input", "tool_output"}


def test_list_takes_every_types_value(client, three_types):
    rv = client.get("/mcp/units?types=system_notice&types=user_input")
    assert rv.status_code == 200, rv.get_json()
    assert sorted(u["cid"] for u in rv.get_json()["units"]) == sorted([three_types["system_notice"],
                                                                        three_types["user_input"]])


@pytest.mark.parametrize("path", ["/mcp/search?q=papercut&top_k=1&top_k=2", "/mcp/search?q=a&q=b",
                                  "/mcp/units?source=a&source=b", "/mcp/units?limit=1&limit=2",
                                  "/mcp/stream?source=a&source=b"])
def test_any_other_repeated_parameter_is_400(client, path):
    name = path.rsplit("&", 1)[1].split("=")[0]
    rv = client.get(path)
    assert_error(rv, 400, "duplicate_parameter", name)
    assert "given 2 times" in rv.get_json()["error"]


@pytest.mark.parametrize("path", ["/mcp/search?q=a&query=b", "/mcp/stream?q=a&query=b"])
def test_q_and_query_together_are_400(client, path):
    assert_error(client.get(path), 400, "duplicate_parameter", "query")


@pytest.mark.parametrize("path,wrong,right", [("/mcp/search", "q", "query"), ("/mcp/context", "q", "query"),
                                              ("/mcp/search", "limit", "top_k"), ("/mcp/search", "type", "types")])
def test_a_body_with_another_apis_name_is_told_ours(client, path, wrong, right):
    body = {"query": "x", wrong: "user_input" if wrong == "type" else 3}
    if wrong == "q":
        body = {"q": "x"}
    rv = client.post(path, json=body)
    assert_error(rv, 400, "unknown_field", wrong)
    assert f"did you mean {right!r}" in rv.get_json()["error"]


def test_an_unknown_field_without_a_near_name_has_no_hint(client):
    rv = client.post("/mcp/search", json={"query": "x", "colour": "red"})
    assert_error(rv, 400, "unknown_field", "colour")
    assert "did you mean" not in rv.get_json()["error"]


@pytest.mark.parametrize("factor,unit", [(1000, "milliseconds"), (1_000_000, "microseconds")])
def test_a_millisecond_timestamp_is_named_as_one(client, factor, unit):
    now = int(time.time())
    rv = client.post("/mcp/push", json=make_unit("papercut ms", timestamp=now * factor))
    assert_error(rv, 400, "timestamp_in_future", "timestamp")
    assert f"looks like {unit}: send Unix seconds ({now})" in rv.get_json()["error"]
    rv = client.post("/mcp/push", json=make_unit("papercut an hour ahead", timestamp=now + 3600))
    assert_error(rv, 400, "timestamp_in_future", "timestamp")
    assert "looks like" not in rv.get_json()["error"]              # seconds, only too far ahead


@pytest.mark.parametrize("method,path", [("GET", "/mcp/units/xyz"), ("GET", "/mcp/units/xyz/lineage"),
                                         ("DELETE", "/mcp/units/xyz"), ("GET", "/mcp/units/0123456789AB"),
                                         ("GET", "/mcp/units/" + "a" * 400)])
def test_a_malformed_cid_in_the_path_is_400_invalid_cid(client, method, path):
    rv = client.open(path, method=method)
    assert_error(rv, 400, "invalid_cid", "cid")
    assert len(rv.get_json()["error"]) < 120                         # a long segment is not echoed whole


def test_a_well_formed_cid_that_is_not_stored_is_still_404(client):
    assert_error(client.get("/mcp/units/0123456789ab"), 404, "not_found", "cid")


def test_the_openapi_document_says_so(client):
    doc = client.get("/openapi.json").get_json()
    for method, path in (("get", "/mcp/units/{cid}"), ("get", "/mcp/units/{cid}/lineage"),
                         ("delete", "/mcp/units/{cid}")):
        assert "400" in doc["paths"][path][method]["responses"], (method, path)
    [types] = [p for p in doc["paths"]["/mcp/search"]["get"]["parameters"] if p["name"] == "types"]
    assert "repeated" in types["description"]
