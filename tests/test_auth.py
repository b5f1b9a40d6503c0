"""API keys: tenants, scopes, 401/403, hashed storage and `context-mode keys add` (docs/design.md §9)."""
import json
import subprocess
import sys
import time

import pytest

from conftest import assert_error, make_unit
from service.auth import hash_key
from service.state import app_state


# The ``keyed`` client's keys (tests/conftest.py), read from a keys file: the acme keys as their hashes,
# the globex key in the clear (the development form)
KEYS = {"acme-writer": ("acme", ["push", "search"]), "acme-reader": ("acme", ["search"]),
        "globex-dev-0123456789abcdef": ("globex", ["push", "search", "admin"])}
KEYS_FILE = True
PLAIN_KEYS = {"globex-dev-0123456789abcdef"}


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_missing_malformed_and_bad_keys_are_401(keyed):
    assert_error(keyed.post("/mcp/push", json=make_unit("x")), 401, "missing_api_key")
    assert_error(keyed.post("/mcp/push", json=make_unit("x"), headers={"Authorization": "Basic abc"}), 401,
                 "malformed_api_key")
    assert_error(keyed.post("/mcp/push", json=make_unit("x"), headers={"Authorization": "Bearer"}), 401,
                 "malformed_api_key")
    assert_error(keyed.post("/mcp/push", json=make_unit("x"), headers=bearer("wrong")), 401, "invalid_api_key")
    assert_error(keyed.post("/mcp/search", json={"query": "x"}), 401, "missing_api_key")
    assert_error(keyed.get("/mcp/units/0123456789ab"), 401, "missing_api_key")


def test_missing_scope_is_403(keyed):
    assert_error(keyed.post("/mcp/push", json=make_unit("x"), headers=bearer("acme-reader")), 403, "missing_scope")
    cid = keyed.post("/mcp/push", json=make_unit("x"), headers=bearer("acme-writer")).get_json()["cid"]
    assert_error(keyed.delete(f"/mcp/units/{cid}", headers=bearer("acme-writer")), 403, "missing_scope")
    assert keyed.get(f"/mcp/units/{cid}", headers=bearer("acme-reader")).status_code == 200


def test_tenants_are_isolated(keyed):
    unit = make_unit("shared text 共享")
    a = keyed.post("/mcp/push", json=unit, headers=bearer("acme-writer")).get_json()
    b = keyed.post("/mcp/push", json=unit, headers=bearer("globex-dev-0123456789abcdef")).get_json()
    assert a["cid"] == b["cid"] and a["status"] == b["status"] == "ok"   # same unit, two tenants, both new
    only_acme = keyed.post("/mcp/push", json=make_unit("acme secret 机密"), headers=bearer("acme-writer")).get_json()
    assert_error(keyed.get(f"/mcp/units/{only_acme['cid']}", headers=bearer("globex-dev-0123456789abcdef")), 404, "not_found")
    assert_error(keyed.delete(f"/mcp/units/{only_acme['cid']}", headers=bearer("globex-dev-0123456789abcdef")), 404, "not_found")
    assert_error(keyed.post("/mcp/push", json=make_unit("child", parent_cid=only_acme["cid"]),
                            headers=bearer("globex-dev-0123456789abcdef")), 422, "parent_not_found")
    rv = keyed.post("/mcp/search", json={"query": "机密", "consistency": "strong"}, headers=bearer("globex-dev-0123456789abcdef"))
    assert rv.get_json()["results"] == []
    rv = keyed.post("/mcp/search", json={"query": "机密", "consistency": "strong"}, headers=bearer("acme-reader"))
    assert [r["cid"] for r in rv.get_json()["results"]] == [only_acme["cid"]]


def test_each_of_many_keys_is_its_own_tenant_and_a_repeated_hash_is_its_last_entry(tmp_path, make_app):
    keys = {f"key-{i:05d}-0123456789abcdef": f"t{i % 500}" for i in range(2000)}
    entries = [{"key_sha256": hash_key(k), "tenant": t, "scopes": ["push", "search"]} for k, t in keys.items()]
    entries.append({"key_sha256": hash_key("key-00007-0123456789abcdef"), "tenant": "later", "scopes": ["search"]})
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"keys": entries}))
    c = make_app(api_keys_file=str(path)).test_client()
    for key in ("key-00001-0123456789abcdef", "key-01999-0123456789abcdef"):
        assert c.post("/mcp/push", json=make_unit(f"zebrafish {key}"), headers=bearer(key)).status_code == 200
    found = c.post("/mcp/search", json={"query": "zebrafish", "consistency": "strong"},
                   headers=bearer("key-00501-0123456789abcdef")).get_json()["results"]
    assert [r["content"] for r in found] == ["zebrafish key-00001-0123456789abcdef"]        # t1's, not t499's
    # the hash listed twice is its later entry: tenant "later", search only
    assert_error(c.post("/mcp/push", json=make_unit("x"), headers=bearer("key-00007-0123456789abcdef")), 403,
                 "missing_scope")
    assert c.post("/mcp/search", json={"query": "zebrafish", "consistency": "strong"},
                  headers=bearer("key-00007-0123456789abcdef")).get_json()["results"] == []
    assert_error(c.post("/mcp/search", json={"query": "x"}, headers=bearer("key-02000-0123456789abcdef")), 401,
                 "invalid_api_key")


def test_keys_file_rejects_bad_entries(tmp_path, make_app):
    for entry in ({"key": "k", "tenant": "../etc", "scopes": ["push"]},
                  {"key": "k", "tenant": "ok", "scopes": ["root"]},
                  {"tenant": "ok", "scopes": ["push"]}):
        keys = tmp_path / "bad.json"
        keys.write_text(json.dumps({"keys": [entry]}))
        with pytest.raises(ValueError):
            make_app(api_keys_file=str(keys))


def test_inline_keys_from_environment_form(make_app):
    app = make_app(api_keys="k1-0123456789abcdef:team-a:push+search;k2-0123456789abcdef:team-b:search")
    c = app.test_client()
    assert c.post("/mcp/push", json=make_unit("x"), headers=bearer("k1-0123456789abcdef")).status_code == 200
    assert_error(c.post("/mcp/push", json=make_unit("x"), headers=bearer("k2-0123456789abcdef")), 403, "missing_scope")


def test_keys_add_prints_key_once_and_stores_only_its_hash(tmp_path):
    keys = tmp_path / "keys.json"
    out = subprocess.run([sys.executable, "-m", "service.cli", "keys", "add", "--tenant", "acme",
                          "--scopes", "push,search", "--file", str(keys)], capture_output=True, text=True, check=True)
    key = out.stdout.strip()
    assert len(key) > 30
    stored = json.loads(keys.read_text())["keys"]
    assert stored == [{"key_sha256": hash_key(key), "tenant": "acme", "scopes": ["push", "search"]}]
    assert key not in keys.read_text()
    bad = subprocess.run([sys.executable, "-m", "service.cli", "keys", "add", "--tenant", "Bad/Name",
                          "--file", str(keys)], capture_output=True, text=True)
    assert bad.returncode != 0 and "invalid tenant" in bad.stderr


def test_open_mode_warns_loudly(make_app, caplog):
    with caplog.at_level("WARNING"):
        app = make_app()
    app_state(app).shutdown()
    assert "NO API KEYS CONFIGURED" in caplog.text


def test_doctor_reports_checks(tmp_path):
    import os
    env = dict(os.environ, CONTEXT_DATA_DIR=str(tmp_path / "dd"))
    out = subprocess.run([sys.executable, "-m", "service.cli", "doctor"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "FTS5" in out.stdout and "jieba dictionary loads" in out.stdout and "writable" in out.stdout


def test_rate_limit_per_key_is_429_with_retry_after(make_app):
    app = make_app(rate_limit="5/minute",
                   api_keys="ka-0123456789abcdef:team-a:push+search;kb-0123456789abcdef:team-b:push+search")
    c = app.test_client()
    codes = [c.post("/mcp/search", json={"query": "x"}, headers=bearer("ka-0123456789abcdef")).status_code for _ in range(6)]
    assert codes == [200] * 5 + [429]
    rv = c.post("/mcp/push", json=make_unit("x"), headers=bearer("ka-0123456789abcdef"))
    assert_error(rv, 429, "rate_limited")
    assert int(rv.headers["Retry-After"]) > 0
    # Another key has its own budget; probes are never limited.
    assert c.post("/mcp/search", json={"query": "x"}, headers=bearer("kb-0123456789abcdef")).status_code == 200
    assert all(c.get("/healthz").status_code == 200 for _ in range(10))


# --- keys list / keys revoke (issue 14, item 10) ------------------------------------------------------
def _cli(*args, env=None):
    import os
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, env=environ)


def test_rate_limit_headers_count_down_and_probes_and_unknown_routes_are_never_counted(make_app):
    c = make_app(rate_limit="4/minute", api_keys="ka-0123456789abcdef:team-a:push+search+admin").test_client()
    auth = bearer("ka-0123456789abcdef")
    for _ in range(3):                            # probes, scrapes and no route: no budget, no headers
        for rv in (c.get("/healthz"), c.get("/readyz"), c.get("/metrics", headers=auth), c.get("/nowhere", headers=auth)):
            assert rv.status_code in (200, 404) and "X-RateLimit-Limit" not in rv.headers
    answers = [c.get("/mcp/stats", headers=auth) for _ in range(5)]
    assert [rv.status_code for rv in answers] == [200, 200, 200, 200, 429]
    assert [rv.headers["X-RateLimit-Remaining"] for rv in answers] == ["3", "2", "1", "0", "0"]
    assert {rv.headers["X-RateLimit-Limit"] for rv in answers} == {"4"}
    now = time.time()
    assert all(now < int(rv.headers["X-RateLimit-Reset"]) <= now + 62 for rv in answers)
    assert 0 < int(answers[4].headers["Retry-After"]) <= 61
    assert "4 per 1 minute" in answers[4].get_json()["error"]


def test_two_limits_are_both_kept_and_a_bad_one_stops_the_start(make_app):
    c = make_app(rate_limit="2/second;3/minute", api_keys="ka-0123456789abcdef:team-a:search").test_client()
    auth = bearer("ka-0123456789abcdef")
    answers = [c.get("/mcp/stats", headers=auth) for _ in range(3)]
    assert [rv.status_code for rv in answers] == [200, 200, 429]
    assert [rv.headers["X-RateLimit-Limit"] for rv in answers] == ["2", "2", "2"]     # the second's, over it
    time.sleep(1.1)
    answers = [c.get("/mcp/stats", headers=auth) for _ in range(2)]
    assert [rv.status_code for rv in answers] == [200, 429]
    assert [rv.headers["X-RateLimit-Limit"] for rv in answers] == ["2", "3"]          # then over the minute's
    with pytest.raises(ValueError, match="is not a rate limit"):
        make_app(rate_limit="lots", api_keys="ka-0123456789abcdef:team-a:search")


def test_the_moving_window_counts_every_window_and_forgets_idle_keys():
    from service.ratelimit import MovingWindow
    w = MovingWindow(3, 10)
    assert [w.hit("a", t) for t in (0, 1, 2, 3)] == [True, True, True, False]
    assert w.stats("a", 3) == (10, 0)               # frees a hit at 0 + 10, none left
    assert w.hit("a", 10) is False                  # a hit exactly a window old still counts (as limits does)
    assert w.hit("a", 10.5) is True and w.stats("a", 10.5) == (11, 0)
    assert w.hit("b", 10.5) is True                 # another key has its own window
    assert [w.hit("a", t) for t in (11.5, 12.5)] == [True, True] and w.stats("a", 12.5) == (20.5, 0)
    assert w.hit("c", 40) is True                   # a window later: the idle keys are dropped
    assert set(w.hits) == {"c"}


def test_keys_list_shows_ids_tenants_and_scopes_never_keys(tmp_path):
    keys = tmp_path / "keys.json"
    k1 = _cli("keys", "add", "--tenant", "acme", "--file", str(keys)).stdout.strip()
    k2 = _cli("keys", "add", "--tenant", "globex", "--scopes", "push,search,admin",
              env={"CONTEXT_API_KEYS_FILE": str(keys)}).stdout.strip()
    data = json.loads(keys.read_text())
    data["keys"].append({"key": "dev-plain-key-123", "tenant": "dev", "scopes": ["search"]})
    keys.write_text(json.dumps(data))
    rv = _cli("keys", "list", env={"CONTEXT_API_KEYS_FILE": str(keys)})
    assert rv.returncode == 0, rv.stderr
    lines = rv.stdout.splitlines()
    assert [line.split()[:3] for line in lines] == [
        [hash_key(k1)[:12], "acme", "push,search"], [hash_key(k2)[:12], "globex", "admin,push,search"],
        [hash_key("dev-plain-key-123")[:12], "dev", "search"]]
    assert "(plain, development)" in lines[2]
    assert k1 not in rv.stdout and "dev-plain-key-123" not in rv.stdout


def test_keys_revoke_removes_one_key_and_the_service_refuses_it_after_a_reload(tmp_path):
    import os
    import signal
    import time
    import requests
    from conftest import LiveServer
    keys = tmp_path / "keys.json"
    keep = _cli("keys", "add", "--tenant", "acme", "--file", str(keys)).stdout.strip()
    gone = _cli("keys", "add", "--tenant", "acme", "--file", str(keys)).stdout.strip()
    server = LiveServer(tmp_path / "data", workers=1, env={"CONTEXT_API_KEYS_FILE": str(keys)}).start()
    try:
        def status(key):
            return requests.get(server.url + "/mcp/search?q=x", headers=bearer(key), timeout=10).status_code
        assert status(gone) == 200
        for bad in ("abc", "zzzzzzzz", "00000000"):
            rv = _cli("keys", "revoke", bad, "--file", str(keys))
            assert rv.returncode == 1 and "Error" in rv.stderr, bad
        rv = _cli("keys", "revoke", hash_key(gone)[:10], "--file", str(keys))
        assert rv.returncode == 0, rv.stderr
        assert rv.stdout.startswith(f"revoked {hash_key(gone)[:12]} (tenant acme") and "SIGHUP" in rv.stderr
        assert [e["key_sha256"] for e in json.loads(keys.read_text())["keys"]] == [hash_key(keep)]
        os.kill(server.proc.pid, signal.SIGHUP)          # gunicorn reloads: new workers read the keys file again
        deadline = time.monotonic() + 60
        while status(gone) != 401 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status(gone) == 401 and status(keep) == 200
    finally:
        server.stop()
