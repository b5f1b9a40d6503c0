"""Seeing and managing the memory (issue 15), in-process: GET /mcp/units, GET /mcp/stats, GET /mcp/export,
POST /mcp/forget, and forgotten units leaving search (the read index too) and being compacted."""
from __future__ import annotations

import base64
import json
import os
import sqlite3
import string
import time

import pytest

from conftest import drain, make_unit
from service.state import app_state

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")

DAY = 86_400
ADMIN = "manage-admin-0123456789abcdef"
READER = "manage-reader-0123456789abcd"
OTHER = "manage-other-0123456789abcdef"
KEYS = f"{ADMIN}:acme:push+search+admin;{READER}:acme:push+search;{OTHER}:globex:push+search+admin"


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def app(make_app):
    return make_app(replica_debounce_ms=0, api_keys=KEYS)


@pytest.fixture
def client(app):
    return app.test_client()


def push(client, content, key=ADMIN, **fields):
    rv = client.post("/mcp/push", json=make_unit(content, **fields), headers=auth(key))
    assert rv.status_code == 200, rv.get_json()
    return rv.get_json()["cid"]


def error(rv, status, code):
    assert rv.status_code == status, (rv.status_code, rv.get_json())
    body = rv.get_json()
    assert set(body) <= {"error", "code", "field"} and body["code"] == code, body
    return body


def listing(client, key=ADMIN, **params):
    """Every unit the listing shows, following next_cursor; and how many pages it took."""
    units, cursor, pages = [], None, 0
    while True:
        q = dict(params, **({"cursor": cursor} if cursor else {}))
        rv = client.get("/mcp/units", query_string=q, headers=auth(key))
        assert rv.status_code == 200, rv.get_json()
        body = rv.get_json()
        units += body["units"]
        pages += 1
        cursor = body["next_cursor"]
        if not cursor:
            return units, pages


def search(client, query, key=ADMIN, **extra):
    rv = client.post("/mcp/search", json={"query": query, "top_k": 50, **extra}, headers=auth(key))
    assert rv.status_code == 200, rv.get_json()
    return [r["cid"] for r in rv.get_json()["results"]]


@pytest.fixture
def world(client):
    """Units over three days, four types, two sources, a lineage; one unit of another tenant."""
    now = int(time.time())
    cids = {}
    cids["root"] = push(client, "用户问：订单 ORD-1 到哪了", type="user_input", source="chat_v1_prod", timestamp=now - 2 * DAY)
    cids["child"] = push(client, "ORD-1 shipped 订单已发货", source="curl_v2_prod", timestamp=now - DAY,
                         parent_cid=cids["root"])
    cids["thought"] = push(client, "模型思考 ORD-1 发货", type="model_thinking", source="gpt_v4_prod", timestamp=now,
                           parent_cid=cids["child"])
    cids["notice"] = push(client, "system notice deploy", type="system_notice", source="curl_v2_dev", timestamp=now)
    cids["foreign"] = push(client, "globex 订单 ORD-1 secret", key=OTHER)
    return cids


# --- GET /mcp/units -------------------------------------------------------------------------------
def test_list_is_newest_first_and_pages_with_a_signed_cursor(client, world):
    units, pages = listing(client, limit=2)
    assert [u["cid"] for u in units] == [world[k] for k in ("notice", "thought", "child", "root")]
    assert pages == 2
    assert all(set(u) >= {"cid", "type", "source", "timestamp", "ttl", "content", "metadata", "parent_cid",
                          "expires_at", "seq"} for u in units)
    assert [u["seq"] for u in units] == sorted((u["seq"] for u in units), reverse=True)
    # another tenant sees only its own
    assert [u["cid"] for u in listing(client, key=OTHER)[0]] == [world["foreign"]]


@pytest.mark.parametrize("params,expected", [
    ({"types": "user_input,model_thinking"}, ["thought", "root"]),
    ({"source": "curl_v2_prod"}, ["child"]),
    ({"source": "curl_v2*"}, ["notice", "child"]),
    ({"parent_cid": "ROOT"}, ["child"]),
    ({"types": "tool_output", "source": "curl*"}, ["child"]),
])
def test_list_filters_are_the_search_filters(client, world, params, expected):
    params = {k: world["root"] if v == "ROOT" else v for k, v in params.items()}
    assert [u["cid"] for u in listing(client, **params)[0]] == [world[k] for k in expected]


def test_list_time_filters(client, world):
    now = int(time.time())
    assert [u["cid"] for u in listing(client, since=now - DAY - 60, until=now - DAY + 60)[0]] == [world["child"]]
    assert [u["cid"] for u in listing(client, until=now - DAY + 60)[0]] == [world["child"], world["root"]]


@pytest.mark.sqlite_only
def test_a_selective_filter_answers_short_pages_that_still_reach_every_match(client, world, monkeypatch):
    from service.store.sqlite import manage
    monkeypatch.setattr(manage, "SCAN_BUDGET", 1)
    monkeypatch.setattr(manage, "PAGE_ROWS", 1)
    for i in range(6):
        push(client, f"filler {i}", source="filler_v1")
    units, pages = listing(client, types="user_input", limit=5)
    assert [u["cid"] for u in units] == [world["root"]] and pages > 3



def test_large_units_are_listed_and_exported_a_bounded_number_of_bytes_at_a_time(client, monkeypatch):
    """A listing page ends once its contents pass PAGE_BYTES (a shorter page, with a cursor), and units are
    read a few at a time: a worker never holds a whole page (or export page) of large units (issue 25)."""
    from service.store.postgresql import manage as pg_manage
    from service.store.sqlite import manage as sqlite_manage
    for module in (sqlite_manage, pg_manage):
        monkeypatch.setattr(module, "PAGE_BYTES", 2500)
    monkeypatch.setattr(sqlite_manage, "FETCH_ROWS", 2)
    pushed = [push(client, f"large unit {i} " + "x" * 1000) for i in range(8)]
    first = client.get("/mcp/units", query_string={"limit": 200}, headers=auth(ADMIN)).get_json()
    assert [u["cid"] for u in first["units"]] == pushed[::-1][:3] and first["next_cursor"]     # 3 x ~1 kB
    units, pages = listing(client, limit=200)
    assert [u["cid"] for u in units] == pushed[::-1] and pages == 3                          # all, once each
    lines = client.get("/mcp/export", headers=auth(ADMIN)).get_data(as_text=True).splitlines()
    assert [json.loads(x)["cid"] for x in lines] == pushed

@pytest.mark.parametrize("query,code", [
    ({"limit": 0}, "invalid_field"), ({"limit": 201}, "invalid_field"), ({"limit": "x"}, "invalid_field"),
    ({"types": "nope"}, "invalid_type"), ({"since": "yesterday"}, "invalid_field"),
    ({"parent_cid": "XYZ"}, "invalid_cid"), ({"top_k": 3}, "unknown_field"), ({"cursor": "garbage"}, "invalid_cursor"),
    ({"cursor": "A" * 600}, "invalid_cursor"),
])
def test_list_rejects_bad_parameters(client, world, query, code):
    error(client.get("/mcp/units", query_string=query, headers=auth(ADMIN)), 400, code)


def test_a_cursor_works_only_for_its_tenant_and_filters(client, world):
    cursor = client.get("/mcp/units?limit=1", headers=auth(ADMIN)).get_json()["next_cursor"]
    error(client.get("/mcp/units", query_string={"cursor": cursor}, headers=auth(OTHER)), 400, "invalid_cursor")
    error(client.get("/mcp/units", query_string={"cursor": cursor, "types": "user_input"}, headers=auth(ADMIN)),
          400, "invalid_cursor")
    tampered = cursor[:-3] + ("AAA" if not cursor.endswith("AAA") else "BBB")
    error(client.get("/mcp/units", query_string={"cursor": tampered}, headers=auth(ADMIN)), 400, "invalid_cursor")
    assert client.get("/mcp/units", query_string={"cursor": cursor}, headers=auth(ADMIN)).status_code == 200


@pytest.mark.parametrize("payload", [{"a": 1}, {"ab": 12}, {"abc": 123}])   # 23, 25, 27 bytes with the MAC
def test_a_token_passes_only_as_it_was_written(payload):
    """Python's base64 decoder maps other strings to a token's bytes (the last character's unused bits,
    padding, characters outside the alphabet): each was accepted as the token the server returned, and
    a tamper test failed on it in CI. Confirmations, list cursors and MCP cursors decode the one way."""
    from service import tokens
    from service.errors import BadRequest
    secret = b"k" * 32
    token = tokens.seal("forget", "acme", payload, secret=secret)
    assert tokens.unseal("forget", "acme", token, field="confirm", code="invalid_confirm", secret=secret) == payload
    variants = [token[:-1] + c for c in string.ascii_letters + string.digits + "-_" if c != token[-1]]
    variants += [token + "=", token + "==", token[:5] + "!" + token[5:], token[:5] + "\n" + token[5:]]

    def lenient(text):
        try:
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except ValueError:
            return None
    aliases = [v for v in variants if lenient(v) == lenient(token)]
    assert len(aliases) >= 2          # the inserted characters at least; more with unused trailing bits
    for v in variants:
        with pytest.raises(BadRequest):
            tokens.unseal("forget", "acme", v, field="confirm", code="invalid_confirm", secret=secret)


def test_list_stats_export_need_a_key_and_forget_needs_admin(client, world):
    for path in ("/mcp/units", "/mcp/stats", "/mcp/export"):
        error(client.get(path), 401, "missing_api_key")
        assert client.get(path, headers=auth(READER)).status_code == 200
    error(client.post("/mcp/forget", json={"source": "chat_v1_prod"}, headers=auth(READER)), 403, "missing_scope")


# --- GET /mcp/stats -------------------------------------------------------------------------------
def test_stats_count_units_and_utf8_bytes_per_type_and_day(client, world):
    s = client.get("/mcp/stats", headers=auth(ADMIN)).get_json()
    contents = {"user_input": ["用户问：订单 ORD-1 到哪了"], "tool_output": ["ORD-1 shipped 订单已发货"],
                "model_thinking": ["模型思考 ORD-1 发货"], "system_notice": ["system notice deploy"]}
    assert s["tenant"] == "acme" and s["units"] == 4
    assert s["types"] == {t: {"units": len(c), "bytes": sum(len(x.encode()) for x in c)} for t, c in sorted(contents.items())}
    assert s["bytes"] == sum(len(x.encode()) for c in contents.values() for x in c)
    assert [d["units"] for d in s["days"]] == [1, 1, 2] and s["days"][-1]["types"] == {"model_thinking": 1, "system_notice": 1}
    assert s["days"] == sorted(s["days"], key=lambda d: d["day"])
    assert s["oldest"] < s["newest"] and s["day_files"]["count"] == 3 and s["day_files"]["bytes"] > 0
    assert s["index_pending"] == 4            # background maintenance is off in this app
    assert client.get("/mcp/stats", headers=auth(OTHER)).get_json()["units"] == 1
    error(client.get("/mcp/stats?x=1", headers=auth(ADMIN)), 400, "unknown_field")


def test_stats_follow_pushes_deletes_and_expiry(clock, client, app, world):
    first = client.get("/mcp/stats", headers=auth(ADMIN)).get_json()
    push(client, "one more 再来一条")
    assert client.get("/mcp/stats", headers=auth(ADMIN)).get_json()["units"] == first["units"] + 1
    assert client.delete(f"/mcp/units/{world['notice']}", headers=auth(ADMIN)).status_code == 200
    after = client.get("/mcp/stats", headers=auth(ADMIN)).get_json()
    assert after["units"] == first["units"] and "system_notice" not in after["types"]
    push(client, "short lived", ttl=2)
    assert client.get("/mcp/stats", headers=auth(ADMIN)).get_json()["units"] == first["units"] + 1
    clock.advance(2.1)
    assert client.get("/mcp/stats", headers=auth(ADMIN)).get_json()["units"] == first["units"]


# --- GET /mcp/export ------------------------------------------------------------------------------
def test_export_is_jsonl_of_every_live_unit_oldest_first(client, world):
    rv = client.get("/mcp/export", headers=auth(ADMIN))
    assert rv.status_code == 200 and rv.mimetype == "application/x-ndjson"
    lines = [json.loads(x) for x in rv.get_data(as_text=True).splitlines()]
    assert [u["cid"] for u in lines] == [world[k] for k in ("root", "child", "thought", "notice")]
    assert all(list(u) == ["cid", "type", "source", "timestamp", "ttl", "content", "metadata", "parent_cid"] for u in lines)
    only = client.get("/mcp/export?types=model_thinking", headers=auth(ADMIN)).get_data(as_text=True)
    assert [json.loads(x)["cid"] for x in only.splitlines()] == [world["thought"]]
    foreign = client.get("/mcp/export", headers=auth(OTHER)).get_data(as_text=True)
    assert [json.loads(x)["cid"] for x in foreign.splitlines()] == [world["foreign"]]


def test_export_pushed_into_another_tenant_is_the_same_store(client, world):
    exported = client.get("/mcp/export", headers=auth(ADMIN)).get_data(as_text=True)
    units = [json.loads(x) for x in exported.splitlines()]
    rv = client.post("/mcp/push", json={"units": units}, headers=auth(OTHER))
    assert [r["status"] for r in rv.get_json()["results"]] == ["ok"] * 4
    again = [json.loads(x) for x in client.get("/mcp/export", headers=auth(OTHER)).get_data(as_text=True).splitlines()]
    assert [u for u in again if u["cid"] != world["foreign"]] == units


# --- POST /mcp/forget -----------------------------------------------------------------------------
def test_forget_is_a_dry_run_then_a_confirmation(client, app, world):
    body = {"query": "ORD-1 订单"}
    dry = client.post("/mcp/forget", json=body, headers=auth(ADMIN)).get_json()
    assert dry["dry_run"] is True and dry["count"] == 2            # every word: root and child, not the thought
    assert [u["cid"] for u in dry["sample"]] == [world["root"], world["child"]]
    assert set(search(client, "ORD-1", consistency="strong")) == {world[k] for k in ("root", "child", "thought")}
    done = client.post("/mcp/forget", json={**body, "confirm": dry["confirm"]}, headers=auth(ADMIN)).get_json()
    assert done == {"dry_run": False, "forgotten": 2, "count": 2}
    for k in ("root", "child"):
        error(client.get(f"/mcp/units/{world[k]}", headers=auth(ADMIN)), 404, "not_found")
    assert search(client, "ORD-1", consistency="strong") == [world["thought"]]
    assert [u["cid"] for u in listing(client)[0]] == [world["notice"], world["thought"]]
    # the other tenant's unit with the same words is untouched
    assert search(client, "ORD-1", key=OTHER, consistency="strong") == [world["foreign"]]
    # the same confirmation again forgets nothing more
    assert client.post("/mcp/forget", json={**body, "confirm": dry["confirm"]}, headers=auth(ADMIN)).get_json()["forgotten"] == 0


def test_forget_operator_cids_and_filters(client, world):
    def count(**body):
        rv = client.post("/mcp/forget", json=body, headers=auth(ADMIN))
        assert rv.status_code == 200, rv.get_json()
        return rv.get_json()["count"]
    assert count(query="发货 deploy", operator="or") == 3
    assert count(query="发货 deploy") == 0
    assert count(query="，。！") == 0                         # no searchable word matches nothing
    assert count(cids=[world["root"], world["notice"], "0123456789ab"]) == 2
    assert count(types=["system_notice", "model_thinking"]) == 2
    assert count(source="curl_v2*", query="ORD-1") == 1
    assert count(parent_cid=world["root"]) == 1
    assert count() == 4
    assert count(source="*") == 4


def test_forget_never_removes_more_than_the_dry_run_counted(client, world):
    body = {"source": "curl_v2*"}
    dry = client.post("/mcp/forget", json=body, headers=auth(ADMIN)).get_json()
    assert dry["count"] == 2
    later = push(client, "pushed after the dry run", source="curl_v2_prod")
    rv = client.post("/mcp/forget", json={**body, "confirm": dry["confirm"]}, headers=auth(ADMIN))
    assert rv.get_json()["forgotten"] == 2
    assert client.get(f"/mcp/units/{later}", headers=auth(ADMIN)).status_code == 200     # newer than the dry run: kept
    # a duplicate push turns a unit older than the dry run into a match: more than counted, refused
    dry = client.post("/mcp/forget", json={"types": ["tool_output"]}, headers=auth(ADMIN)).get_json()
    assert dry["count"] == 1
    root = client.get(f"/mcp/units/{world['root']}", headers=auth(ADMIN)).get_json()
    again = {k: root[k] for k in ("source", "timestamp", "ttl", "content")}
    rv = client.post("/mcp/push", json={**again, "type": "tool_output"}, headers=auth(ADMIN))
    assert rv.get_json()["status"] == "duplicate"
    error(client.post("/mcp/forget", json={"types": ["tool_output"], "confirm": dry["confirm"]}, headers=auth(ADMIN)),
          409, "forget_changed")
    assert client.get(f"/mcp/units/{world['root']}", headers=auth(ADMIN)).status_code == 200
    assert client.get(f"/mcp/units/{later}", headers=auth(ADMIN)).status_code == 200


def test_a_confirmation_is_bound_to_its_filters_tenant_and_time(clock, client, world):
    dry = client.post("/mcp/forget", json={"source": "chat_v1_prod"}, headers=auth(ADMIN)).get_json()
    error(client.post("/mcp/forget", json={"source": "gpt_v4_prod", "confirm": dry["confirm"]}, headers=auth(ADMIN)),
          400, "invalid_confirm")
    error(client.post("/mcp/forget", json={"source": "chat_v1_prod", "confirm": dry["confirm"]}, headers=auth(OTHER)),
          400, "invalid_confirm")
    tampered = dry["confirm"][:-2] + ("xx" if not dry["confirm"].endswith("xx") else "yy")
    error(client.post("/mcp/forget", json={"source": "chat_v1_prod", "confirm": tampered},
                      headers=auth(ADMIN)), 400, "invalid_confirm")
    clock.advance(601)
    error(client.post("/mcp/forget", json={"source": "chat_v1_prod", "confirm": dry["confirm"]}, headers=auth(ADMIN)),
          400, "confirm_expired")


@pytest.mark.parametrize("body,code", [
    ({"cids": []}, "invalid_cid"), ({"cids": ["nope"]}, "invalid_cid"), ({"cids": "0123456789ab"}, "invalid_cid"),
    ({"cids": ["0123456789ab"] * 1001}, "invalid_cid"), ({"types": ["nope"]}, "invalid_type"),
    ({"query": 3}, "invalid_field"), ({"operator": "xor"}, "invalid_field"), ({"confirm": 3}, "invalid_confirm"),
    ({"top_k": 3}, "unknown_field"), ([], "invalid_body"), ({"since": "x"}, "invalid_field"),
])
def test_forget_rejects_bad_bodies_and_changes_nothing(client, world, body, code):
    error(client.post("/mcp/forget", json=body, headers=auth(ADMIN)), 400, code)
    assert len(listing(client)[0]) == 4


@pytest.mark.sqlite_only
def test_forgotten_units_leave_default_searches_before_the_read_index_pass(client, app, world):
    drain(app)                              # the read index holds every unit
    store = app_state(app).store
    t = store.tenant("acme")
    assert store.searcher.view(t).searcher.num_docs == 4
    assert set(search(client, "ORD-1")) == {world[k] for k in ("root", "child", "thought")}
    dry = client.post("/mcp/forget", json={"cids": [world["child"]]}, headers=auth(ADMIN)).get_json()
    client.post("/mcp/forget", json={"cids": [world["child"]], "confirm": dry["confirm"]}, headers=auth(ADMIN))
    assert client.delete(f"/mcp/units/{world['root']}", headers=auth(ADMIN)).status_code == 200
    # no pass has run: the read index still holds both documents, the search leaves them out
    assert store.searcher.view(t).searcher.num_docs == 4
    assert search(client, "ORD-1") == [world["thought"]]
    assert search(client, "订单") == []
    drain(app)                              # the pass removes them from the index
    assert store.searcher.view(t).searcher.num_docs == 2        # thought and notice
    assert search(client, "ORD-1") == [world["thought"]]


@pytest.mark.sqlite_only
def test_the_janitor_compacts_a_day_file_after_a_bulk_forget(client, app):
    now = int(time.time())
    payload = " ".join(f"word{i}" for i in range(400))
    cids = [push(client, f"bulk {i} 批量 {payload}", source="bulk_v1", timestamp=now - 3600) for i in range(120)]
    keep = push(client, "kept unit 保留", source="keep_v1", timestamp=now - 3600)
    drain(app)
    t = app_state(app).store.tenant("acme")
    day = t.primary_days()[-1]
    path = t.primary_path(day)
    t.shard(day).read(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    before = os.path.getsize(path)
    dry = client.post("/mcp/forget", json={"source": "bulk_v1"}, headers=auth(ADMIN)).get_json()
    assert dry["count"] == 120
    assert client.post("/mcp/forget", json={"source": "bulk_v1", "confirm": dry["confirm"]},
                       headers=auth(ADMIN)).get_json()["forgotten"] == 120
    janitor = app_state(app).maintenance.janitor
    app_state(app).maintenance.run_once(force_janitor=True)
    assert janitor.compacted == 1
    after = os.path.getsize(path) + (os.path.getsize(f"{path}-wal") if os.path.exists(f"{path}-wal") else 0)
    assert after < before / 4, (before, after)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("INSERT INTO units_fts(units_fts, rank) VALUES ('integrity-check', 1)") is not None
    conn.close()
    assert search(client, "保留 kept") == [keep] and search(client, "批量", consistency="strong") == []
    app_state(app).maintenance.run_once(force_janitor=True)
    assert janitor.compacted == 1           # nothing more was forgotten: no second compaction
    assert all(client.get(f"/mcp/units/{c}", headers=auth(ADMIN)).status_code == 404 for c in cids[:5])
