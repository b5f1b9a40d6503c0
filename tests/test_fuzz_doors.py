"""Fuzzing the doors /openapi.json does not describe (issue 12): JSON-RPC on POST /mcp in both
protocol revisions, Dify's POST /retrieval, and raw bytes on every route, against a live gunicorn.

No response is a 5xx; every JSON-RPC answer is a result or an error object; every /retrieval
error has Dify's shape; every other error the service's. FUZZ_EXAMPLES sets the examples per
door (CI: 300; `make fuzz` runs thousands and writes the counts to bench/results/fuzz.json).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from urllib3.util.retry import Retry

from conftest import LiveServer, make_unit

# Each example is sent several ways (every protocol revision, with and without a key, every route),
# so a door gets several requests per generated example.
EXAMPLES = int(os.environ.get("FUZZ_DOOR_EXAMPLES", os.environ.get("FUZZ_EXAMPLES", "300")))
HTTP = requests.Session()
# gunicorn closes a keep-alive connection idle for 2 s, which a slow example can outlast: a request
# on such a connection is sent again on a new one (a 5xx is still a 5xx: statuses are never retried)
HTTP.mount("http://", requests.adapters.HTTPAdapter(max_retries=Retry(total=2, connect=2, read=2, status=0,
                                                                      allowed_methods=None, raise_on_status=False)))
KEY = "fuzz-doors-key-0123456789abcdef"
MODERN, LEGACY = "2026-07-28", "2025-11-25"
COUNTS: dict[str, dict[str, int]] = {}

SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)
words = st.sampled_from(["ORD-7890", "订单", "发货", "fuzz", "seed", "*", '"', "NEAR", "AND", "-x", "^", "(", ""])
queries = st.one_of(st.lists(words, max_size=6).map(" ".join), st.text(max_size=60))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("fuzz-doors") / "data", workers=2,
                     keys={KEY: ("fuzz", ["push", "search", "admin"])},
                     env={"CONTEXT_RATE_LIMIT": "off"}).start()
    cids = []
    for i in range(20):
        rv = requests.post(srv.url + "/mcp/push", json=make_unit(f"fuzz seed {i} 订单 ORD-{i}", **(
            {"parent_cid": cids[-1]} if cids else {})), headers=srv.headers(KEY), timeout=30)
        cids.append(rv.json()["cid"])
    srv.cids = cids
    # a registered tool, so that GET/PUT/DELETE /mcp/tools/{name} also meet one that exists
    requests.post(srv.url + "/mcp/tools", json={"name": "fuzz_seed_tool", "description": "Finds fuzz seeds by order",
                                                "input_schema": {"type": "object"}},
                  headers=srv.headers(KEY), timeout=30).raise_for_status()
    yield srv
    srv.stop()
    total = sum(c["requests"] for c in COUNTS.values())
    print(f"\nfuzzed the doors with {total} requests: {json.dumps(COUNTS)}; no 5xx")
    out = os.environ.get("FUZZ_RESULTS")
    if out:
        path = Path(out)
        prior = json.loads(path.read_text()) if path.exists() else {}
        prior["doors"] = COUNTS
        path.write_text(json.dumps(prior, indent=1))


def count(door: str, status: int) -> None:
    c = COUNTS.setdefault(door, {"requests": 0, "2xx": 0, "4xx": 0, "other": 0})
    c["requests"] += 1
    c["2xx" if status < 300 else "4xx" if 400 <= status < 500 else "other"] += 1


# --- POST /mcp ------------------------------------------------------------------------------------
METHODS = ["initialize", "notifications/initialized", "ping", "server/discover", "resources/list",
           "resources/templates/list", "resources/read", "prompts/list", "prompts/get", "tools/list",
           "tools/call", "subscriptions/listen", "completion/complete", "logging/setLevel", "resources/subscribe"]
NAMES = ["context_search", "context_push", "context_get", "answer-with-context", "review-lineage"]


@st.composite
def mcp_requests(draw):
    method = draw(st.one_of(st.sampled_from(METHODS), st.text(max_size=20)))
    params = draw(st.one_of(
        st.none(), json_values,
        st.fixed_dictionaries({}, optional={
            "uri": st.one_of(st.text(max_size=30), (st.sampled_from(["context://units/", "context://search/",
                                                                     "context://lineage/", "context://"])
                                                     | st.just("context://units/")).flatmap(
                lambda p: st.text(max_size=20).map(lambda x: p + x))),
            "name": st.one_of(st.sampled_from(NAMES), st.text(max_size=20)),
            "arguments": st.one_of(json_values, st.fixed_dictionaries({}, optional={
                "query": queries, "top_k": json_values, "question": queries, "cid": st.text(max_size=14),
                "types": json_values, "content": st.text(max_size=50), "type": json_values})),
            "cursor": st.one_of(st.text(max_size=30), json_values),
            "_meta": json_values,
        })))
    era = draw(st.sampled_from([MODERN, "1999-01-01", "garbage"]))
    has_id = draw(st.booleans())
    body: dict = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0", None])), "method": method}
    if has_id:
        body["id"] = draw(st.one_of(st.integers(), st.text(max_size=10), st.none(), st.floats(allow_nan=False)))
    if params is not None:
        body["params"] = params
    if era == MODERN and isinstance(params, dict) and draw(st.booleans()):
        params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                           "io.modelcontextprotocol/clientCapabilities": {},
                           "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "1"}}
    raw = draw(st.one_of(st.just(json.dumps(body)), st.just(json.dumps([body])), st.text(max_size=60)))
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {KEY}"}
    modern = dict(base, **{"MCP-Protocol-Version": era})
    # (a header value cannot start or end with whitespace: requests refuses to send one)
    if era == MODERN and isinstance(method, str) and method.isascii() and method.isprintable() \
            and method == method.strip():
        modern["Mcp-Method"] = method
    # the same message as each revision's client would send it, and with no revision header
    return raw, [modern, dict(base, **{"MCP-Protocol-Version": LEGACY}), base]


def test_mcp_jsonrpc_no_5xx(server):
    @given(req=mcp_requests())
    @SETTINGS
    def run(req):
        raw, variants = req
        for headers in variants:
            check_mcp(server, raw, headers)
    run()


def check_mcp(server, raw: str, headers: dict) -> None:
    """One JSON-RPC POST: no 5xx, and an answer that is a result or an error object."""
    with HTTP.post(server.url + "/mcp", data=raw.encode("utf-8", "surrogatepass"), headers=headers, timeout=60,
                   stream=True) as rv:
        count("mcp", rv.status_code)
        if "text/event-stream" in rv.headers.get("Content-Type", ""):
            assert rv.status_code == 200
            return            # a subscription's stream: closing it cancels it
        content = rv.content
    assert rv.status_code < 500, (raw[:300], rv.status_code, content[:300])
    if rv.status_code == 202 or not content:
        return
    body = json.loads(content)
    for msg in body if isinstance(body, list) else [body]:
        assert msg.get("jsonrpc") == "2.0" and (("result" in msg) != ("error" in msg)), msg
        if "error" in msg:
            assert isinstance(msg["error"]["code"], int) and isinstance(msg["error"]["message"], str), msg
            assert "Traceback" not in msg["error"]["message"]


# --- POST /retrieval (Dify) -------------------------------------------------------------------------
@st.composite
def dify_bodies(draw):
    body = draw(st.fixed_dictionaries({}, optional={
        "knowledge_id": st.one_of(st.sampled_from(["fuzz", "", "other", "default"]), json_values),
        "query": st.one_of(queries, json_values),
        "retrieval_setting": st.one_of(json_values, st.fixed_dictionaries({}, optional={
            "top_k": json_values, "score_threshold": json_values})),
        "metadata_condition": st.one_of(json_values, st.fixed_dictionaries({}, optional={
            "logical_operator": st.one_of(st.sampled_from(["and", "or"]), json_values),
            "conditions": st.lists(st.fixed_dictionaries({}, optional={
                "name": st.one_of(st.lists(st.sampled_from(["type", "source", "timestamp", "cid", "x"]), max_size=2),
                                  json_values),
                "comparison_operator": st.one_of(st.sampled_from(
                    ["is", "is not", "contains", "start with", "empty", ">", "<", "≥", "before", "in"]), json_values),
                "value": json_values}), max_size=3)})),
    }))
    return draw(st.one_of(st.just(json.dumps(body)), st.text(max_size=40)))


def test_dify_retrieval_no_5xx(server):
    @given(raw=dify_bodies())
    @SETTINGS
    def run(raw):
        # with the key, with the scheme spelled otherwise, and with none (Dify's 1001/1002 path)
        for auth in (f"Bearer {KEY}", f"bearer  {KEY}", None):
            headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
            rv = HTTP.post(server.url + "/retrieval", data=raw.encode("utf-8", "surrogatepass"), headers=headers,
                           timeout=60)
            count("retrieval", rv.status_code)
            assert rv.status_code < 500, (raw[:300], rv.status_code, rv.text[:300])
            body = rv.json()
            if rv.status_code >= 400:
                assert isinstance(body.get("error_code"), int) and isinstance(body.get("error_msg"), str), body
            else:
                assert isinstance(body["records"], list)
    run()


# --- raw bytes on every route ------------------------------------------------------------------------
ROUTES = ["/mcp/push", "/mcp/search", "/mcp/context", "/mcp/units/{cid}", "/mcp/units/{cid}/lineage",
          "/retrieval", "/mcp", "/adapters/continue", "/healthz", "/readyz",
          "/metrics", "/openapi.json", "/mcp/search?q=", "/nowhere",
          "/mcp/units", "/mcp/units?limit=", "/mcp/stats", "/mcp/forget", "/mcp/export?types=", "/console/", "/",
          "/mcp/tools", "/mcp/tools?q=", "/mcp/tools/{name}", "/mcp/stream", "/mcp/stream?query="]
STREAMS = ("/mcp/stream",)       # a GET there is a live stream that stays open: fuzzed with other methods
tool_names = st.one_of(st.sampled_from(["fuzz_seed_tool", "no_such_tool", "%00", "..%2f", "a" * 300, "x.y-z"]),
                       st.text(max_size=40).map(lambda t: requests.utils.quote(t, safe="")))


@st.composite
def raw_requests(draw):
    cid = draw(st.one_of(st.sampled_from(["0123456789ab", "zz", "%00", "..%2f"]),
                         st.text(alphabet="0123456789abcdef", min_size=12, max_size=12)))
    query = requests.utils.quote(draw(queries))
    # the same bytes to every route
    name = draw(tool_names)
    method = draw(st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"]))
    routes = [r.replace("{cid}", cid).replace("{name}", name) + (query if r.endswith("=") else "") for r in ROUTES
              if not (method == "GET" and r.startswith(STREAMS))]
    body = draw(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
    ctype = draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                  "application/json; charset=latin-1", ""]))
    return method, routes, body, ctype


def test_raw_requests_no_5xx(server):
    @given(req=raw_requests())
    @SETTINGS
    def run(req):
        method, routes, body, ctype = req
        headers = {"Authorization": f"Bearer {KEY}"}
        if ctype:
            headers["Content-Type"] = ctype
        for route in routes:
            rv = HTTP.request(method, server.url + route, data=body, headers=headers, timeout=60)
            count("raw", rv.status_code)
            assert rv.status_code < 500, (method, route, body[:200], rv.status_code, rv.text[:300])
            if rv.status_code >= 400 and route != "/mcp" and not route.startswith("/retrieval"):
                err = rv.json()
                assert set(err) <= {"error", "code", "field"} and err.get("error") and err.get("code"), err
    run()
