"""clients/python (context_mode_client) against a real gunicorn, and its retry rules against a stub."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import free_port, make_unit
from context_mode_client import ContextModeClient, ContextModeError, compute_cid, make_unit as client_unit


@pytest.mark.parametrize("content,timestamp,source", [
    ("hello world", 1715824391, "curl_tool_v2.1"), ("", 0, "x"), ("订单 ORD-7890 已发货", 1700000000, "工具_v1"),
    ("emoji 😀 and \u00e9\u0301", 1, "s"), ('{"a": 1}', 99999999999, "src with spaces"),
])
def test_cid_is_the_servers(content, timestamp, source):
    from service.units import compute_cid as server_cid
    assert compute_cid(content, timestamp, source) == server_cid(content, timestamp, source)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One gunicorn for the live tests of this module (keys: a writer/reader and an admin)."""
    from conftest import LiveServer
    s = LiveServer(tmp_path_factory.mktemp("pyclient") / "data", workers=1,
                   keys={"rw-0123456789abcdef": ("acme", ["push", "search"]), "adm-0123456789abcdef": ("acme", ["push", "search", "admin"])})
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_push_search_context_get_lineage_delete(server):
    cm = ContextModeClient(server.url, "rw-0123456789abcdef")
    parent = client_unit("用户问：订单 ORD-5555 到哪了？", type="user_input", source="pyclient_v1_ci")
    rv = cm.push(parent)
    assert (rv["status"], rv["cid"]) == ("ok", parent["cid"])
    assert cm.push(parent)["status"] == "duplicate"
    child = cm.push("ORD-5555 shipped via DHL", source="pyclient_v1_ci", parent_cid=parent["cid"],
                    metadata={"carrier": "DHL"})
    found = cm.search("ORD-5555", consistency="strong")
    assert {r["cid"] for r in found["results"]} == {parent["cid"], child["cid"]}
    for key in ("cid", "type", "source", "timestamp", "ttl", "content", "metadata", "bm25_score", "score"):
        assert key in found["results"][0]
    assert cm.get(child["cid"])["metadata"] == {"carrier": "DHL"}
    assert [u["cid"] for u in cm.lineage(child["cid"])["ancestors"]] == [parent["cid"]]
    packed = cm.context("ORD-5555", budget_tokens=300, consistency="strong")
    assert child["cid"] in packed["context"] and "untrusted" in packed["context"]

    with pytest.raises(ContextModeError) as e:
        cm.delete(child["cid"])
    assert (e.value.status, e.value.code) == (403, "missing_scope")
    assert ContextModeClient(server.url, "adm-0123456789abcdef").delete(child["cid"])["status"] == "deleted"
    with pytest.raises(ContextModeError) as e:
        cm.get(child["cid"])
    assert (e.value.status, e.value.code, e.value.field) == (404, "not_found", "cid")


def test_units_go_to_a_project_or_everywhere(server):
    cm = ContextModeClient(server.url, "rw-0123456789abcdef")
    alpha = cm.push("PYSCOPE note alpha", source="pyclient_v1_ci", project="/repo/alpha")["cid"]
    beta = cm.push("PYSCOPE note beta", source="pyclient_v1_ci", project="/repo/beta", metadata={"k": 1})["cid"]
    shared = cm.push(client_unit("PYSCOPE note shared", source="pyclient_v1_ci", is_global=True))["cid"]
    found = cm.search("PYSCOPE", project="/repo/alpha", consistency="strong")
    assert {r["cid"] for r in found["results"]} == {alpha, shared}
    assert cm.get(beta)["metadata"] == {"k": 1, "project": "/repo/beta"}
    assert cm.get(shared)["metadata"] == {"global": True}


def test_push_many_in_batches_reports_each_unit(server):
    cm = ContextModeClient(server.url, "rw-0123456789abcdef")
    units = [client_unit(f"batch item {i} BATCHTAG", source="pyclient_v1_ci") for i in range(5)]
    units[3] = dict(units[3], cid="000000000000")            # wrong CID
    units.append({"content": "no type"})                      # invalid unit
    results = list(cm.push_many(units, batch_size=2))
    assert [r["index"] for r in results] == list(range(6))
    assert [r["status"] for r in results] == ["ok", "ok", "ok", "error", "ok", "error"]
    assert results[3]["code"] == "invalid_cid"
    assert results[5]["code"] in ("missing_field", "invalid_unit", "invalid_field")


def test_recall_is_the_plugin_habit(server):
    cm = ContextModeClient(server.url, "rw-0123456789abcdef")
    for i in range(5):
        cm.push(f"RECALLTAG note {i} " + "x" * 500, source="pyclient_v1_ci")
    cm.search("RECALLTAG", consistency="strong")
    hits = cm.recall("RECALLTAG note", threshold=0.0, consistency="strong")
    assert len(hits) == 3
    assert all(len(h["text"]) == 201 and h["text"].endswith("…") for h in hits)
    assert all(set(h) == {"cid", "type", "source", "score", "text"} for h in hits)
    assert cm.recall("RECALLTAG note", threshold=1.0, consistency="strong") == []


def test_errors_carry_the_servers_code(server):
    with pytest.raises(ContextModeError) as e:
        ContextModeClient(server.url, "wrong").search("x")
    assert (e.value.status, e.value.code) == (401, "invalid_api_key")
    assert not e.value.retryable
    with pytest.raises(ContextModeError) as e:
        ContextModeClient(server.url, "rw-0123456789abcdef").push(make_unit("x", ttl=0))
    assert (e.value.status, e.value.field) == (400, "ttl")
    assert "ttl" in str(e.value)


# --- retries, against a local stub --------------------------------------------------------------
class Stub:
    """A tiny HTTP server answering from a script of (status, headers, body); the last entry repeats."""

    def __init__(self, script):
        self.script, self.calls = list(script), []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                stub.calls.append((self.command, self.path, self.rfile.read(length)))
                status, headers, body = stub.script[min(len(stub.calls), len(stub.script)) - 1]
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


OK = (200, {}, {"status": "ok", "cid": "abcdefabcdef", "seq": 1, "indexed": False})
BUSY = (503, {"Retry-After": "0"}, {"error": "Storage is unavailable; retry later.", "code": "storage_unavailable"})


@pytest.fixture
def stub():
    stubs = []

    def make(*script):
        s = Stub(script)
        stubs.append(s)
        return s
    yield make
    for s in stubs:
        s.close()


def test_retries_503_with_exponential_backoff_and_same_body(stub):
    s = stub(BUSY, BUSY, BUSY, OK)
    delays = []
    cm = ContextModeClient(s.url, backoff=0.1, retries=4, sleep=delays.append)
    unit = client_unit("retry me", source="stub")
    assert cm.push(unit)["status"] == "ok"
    assert len(s.calls) == 4
    assert len({body for _, _, body in s.calls}) == 1            # the same unit (same CID) every time
    assert 0.05 <= delays[0] <= 0.1 and 0.1 <= delays[1] <= 0.2 and 0.2 <= delays[2] <= 0.4


def test_gives_up_after_retries(stub):
    s = stub(BUSY)
    cm = ContextModeClient(s.url, retries=2, sleep=lambda _: None)
    with pytest.raises(ContextModeError) as e:
        cm.push(client_unit("x", source="stub"))
    assert (e.value.status, e.value.code) == (503, "storage_unavailable")
    assert len(s.calls) == 3


def test_429_honours_retry_after(stub):
    s = stub((429, {"Retry-After": "2"}, {"error": "slow down", "code": "rate_limited"}), OK)
    delays = []
    cm = ContextModeClient(s.url, backoff=0.01, sleep=delays.append)
    cm.search("x")
    assert delays == [2.0] and len(s.calls) == 2


@pytest.mark.parametrize("status,code", [(400, "invalid_field"), (401, "invalid_api_key"), (403, "missing_scope"),
                                         (404, "not_found"), (409, "cid_collision"), (413, "payload_too_large"),
                                         (422, "already_expired")])
def test_never_retries_other_4xx(stub, status, code):
    s = stub((status, {}, {"error": "no", "code": code, "field": "ttl"}), OK)
    cm = ContextModeClient(s.url, sleep=lambda _: pytest.fail("must not sleep"))
    with pytest.raises(ContextModeError) as e:
        cm.push(client_unit("x", source="stub"))
    assert (e.value.status, e.value.code, e.value.field) == (status, code, "ttl")
    assert len(s.calls) == 1


def test_retries_connection_errors_then_raises():
    port = free_port()   # nothing listens here
    delays = []
    cm = ContextModeClient(f"http://127.0.0.1:{port}", retries=3, backoff=0.01, sleep=delays.append)
    start = time.monotonic()
    with pytest.raises(ContextModeError) as e:
        cm.search("x")
    assert e.value.status is None and e.value.code == "connection_error" and e.value.retryable
    assert len(delays) == 3 and time.monotonic() - start < 5


def test_dify_shaped_errors_are_understood(stub):
    s = stub((404, {}, {"error_code": 2001, "error_msg": "The knowledge base does not exist."}))
    with pytest.raises(ContextModeError) as e:
        ContextModeClient(s.url).request("POST", "/retrieval", body={"query": "x", "knowledge_id": "nope"})
    assert (e.value.status, e.value.code) == (404, "2001")
