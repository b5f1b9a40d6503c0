"""Rate limits (service/ratelimit.py) and the per-worker cap on concurrent searches (service/shares/): a limit keys
on the parsed key and is on by default with keys; 429 and 503 in each door's own shape, Retry-After only on them.
(Each tenant's share of the slots: tests/test_fair_shares.py.)"""
import json

from conftest import assert_error
from service.state import app_state


# --- rate limits --------------------------------------------------------------------------------------------
def test_rate_limit_cannot_be_dodged_by_spelling_the_scheme_differently(make_app):
    key = "ka-0123456789abcdef"
    app = make_app(rate_limit="4/minute", api_keys=f"{key}:team-a:push+search")
    c = app.test_client()
    spellings = [f"Bearer {key}", f"bearer {key}", f"BEARER {key}", f"Bearer   {key}  ", f"  bEaReR {key}",
                 f"Bearer {key}"]
    codes = [c.post("/mcp/search", json={"query": "x"}, headers={"Authorization": h}).status_code
             for h in spellings]
    assert codes == [200] * 4 + [429] * 2


def test_a_rate_limit_is_on_by_default_when_keys_are_configured(make_app):
    app = make_app(api_keys="ka-0123456789abcdef:team-a:push+search")
    rv = app.test_client().post("/mcp/search", json={"query": "x"},
                                headers={"Authorization": "Bearer ka-0123456789abcdef"})
    assert rv.status_code == 200 and rv.headers["X-RateLimit-Limit"] == "1200"


def test_rate_limit_and_size_errors_use_each_doors_shape(make_app):
    key = "kd-0123456789abcdef"
    app = make_app(rate_limit="1/minute", api_keys=f"{key}:acme:push+search", max_request_bytes=1000)
    c = app.test_client()
    auth = {"Authorization": f"Bearer {key}"}
    big = {"knowledge_id": "", "query": "x" * 2000}
    rv = c.post("/retrieval", json=big, headers=auth)
    assert rv.status_code == 413 and rv.get_json()["error_code"] == 3002
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "x" * 2000000}}
    rv = c.post("/mcp", json=rpc, headers=auth)
    assert rv.status_code == 413 and rv.get_json()["jsonrpc"] == "2.0" and rv.get_json()["error"]["code"] == -32600
    assert c.post("/retrieval", json={"knowledge_id": "", "query": "x"}, headers=auth).status_code == 200
    rv = c.post("/retrieval", json={"knowledge_id": "", "query": "x"}, headers=auth)
    assert rv.status_code == 429 and rv.get_json()["error_code"] == 3003 and "Retry-After" in rv.headers
    rv = c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=auth)
    assert rv.status_code == 429 and rv.get_json()["error"]["code"] == -32600 and "Retry-After" in rv.headers


def test_retry_after_is_only_on_429_and_503(make_app, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"key": "retry-after-0123456789", "tenant": "t", "scopes": ["search"]}]}))
    c = make_app(api_keys_file=str(keys), rate_limit="3/minute").test_client()
    auth = {"Authorization": "Bearer retry-after-0123456789"}
    answers = [c.get("/mcp/stats", headers=auth) for _ in range(4)]
    assert [rv.status_code for rv in answers] == [200, 200, 200, 429]
    assert all("Retry-After" not in rv.headers for rv in answers[:3])
    assert "X-RateLimit-Limit" in answers[0].headers and int(answers[3].headers["Retry-After"]) > 0


# --- a cap on concurrent searches, answered in every door's shape -------------------------------------------
def test_concurrent_searches_are_capped_per_worker(make_app):
    import threading
    app = make_app(max_concurrent_searches=1, search_wait_s=0.2)
    store = app_state(app).store
    entered, release = threading.Event(), threading.Event()
    real = store.searcher.search

    def slow(*args, **kw):
        entered.set()
        release.wait(30)
        return real(*args, **kw)
    store.searcher.search = slow
    holder = threading.Thread(target=lambda: app.test_client().post("/mcp/search", json={"query": "x"}))
    holder.start()
    try:
        assert entered.wait(30)
        c = app.test_client()
        rv = c.post("/mcp/search", json={"query": "y"})
        assert_error(rv, 503, "search_busy")
        assert rv.headers["Retry-After"] == "1"
        rv = c.post("/retrieval", json={"knowledge_id": "", "query": "y"})
        assert rv.status_code == 503 and rv.get_json()["error_code"] == 5001 and "Retry-After" in rv.headers
        rv = c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": "context_search", "arguments": {"query": "y"}}},
                    headers={"MCP-Protocol-Version": "2025-11-25"})
        assert rv.status_code == 503 and rv.get_json()["error"]["code"] == -32603
        assert c.get("/healthz").status_code == 200
    finally:
        release.set()
        holder.join(30)
    assert app.test_client().post("/mcp/search", json={"query": "y"}).status_code == 200
