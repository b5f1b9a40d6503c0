"""Every rule of the unit table (docs/design.md §3), through POST /mcp/push."""
import hashlib
import json
import time

import pytest

from conftest import assert_error, drain, lettered_timestamp, make_unit
from service.units import compute_cid

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")


def cid_of(content, timestamp, source):
    return hashlib.sha256((content + str(timestamp) + source).encode("utf-8")).hexdigest()[:12]


def test_cid_rule_matches_sha256_of_content_timestamp_source():
    assert compute_cid("héllo 世界", 1715824391, "curl_tool_v2.1") == cid_of("héllo 世界", 1715824391, "curl_tool_v2.1")


def test_push_computes_cid_and_reads_back(client):
    unit = make_unit("订单 ORD-7890 已发货", metadata={"http_status": 200})
    rv = client.post("/mcp/push", json=unit)
    assert rv.status_code == 200
    body = rv.get_json()
    assert body["status"] == "ok" and body["indexed"] is False and body["seq"] == 1
    assert body["cid"] == cid_of(unit["content"], unit["timestamp"], unit["source"])
    got = client.get(f"/mcp/units/{body['cid']}").get_json()
    for k in ("type", "source", "timestamp", "ttl", "content", "metadata"):
        assert got[k] == unit[k]
    assert got["expires_at"] == unit["timestamp"] + unit["ttl"]


def test_push_with_matching_cid_is_accepted(client):
    unit = make_unit("x")
    unit["cid"] = cid_of(unit["content"], unit["timestamp"], unit["source"])
    assert client.post("/mcp/push", json=unit).get_json()["cid"] == unit["cid"]


@pytest.mark.parametrize("bad_cid", ["abc", "0123456789abc", "0123456789AB", 123, "zzzzzzzzzzzz", ""])
def test_malformed_cid_rejected(client, bad_cid):
    unit = make_unit("x", cid=bad_cid)
    assert_error(client.post("/mcp/push", json=unit), 400, "invalid_cid", "cid")


def test_thirteen_char_and_uppercase_cid_rejected(client):
    unit = make_unit("y", timestamp=lettered_timestamp("y"))
    good = cid_of(unit["content"], unit["timestamp"], unit["source"])
    assert_error(client.post("/mcp/push", json={**unit, "cid": good + "0"}), 400, "invalid_cid", "cid")
    assert_error(client.post("/mcp/push", json={**unit, "cid": good.upper()}), 400, "invalid_cid", "cid")
    assert client.get(f"/mcp/units/{good}").status_code == 404


def test_cid_of_a_different_source_rejected(client):
    unit = make_unit("z", source="tool_a")
    other = cid_of(unit["content"], unit["timestamp"], "tool_b")
    assert_error(client.post("/mcp/push", json={**unit, "cid": other}), 400, "invalid_cid", "cid")


@pytest.mark.parametrize("utype", ["user_input", "model_thinking", "tool_output", "system_notice"])
def test_the_four_types(client, utype):
    assert client.post("/mcp/push", json=make_unit(f"t {utype}", type=utype)).status_code == 200


@pytest.mark.parametrize("utype", ["design_note", "", None, 3, "USER_INPUT"])
def test_unknown_type_rejected(client, utype):
    unit = make_unit("t")
    if utype is None:
        del unit["type"]
        assert_error(client.post("/mcp/push", json=unit), 400, "missing_field", "type")
    else:
        unit["type"] = utype
        assert_error(client.post("/mcp/push", json=unit), 400, "invalid_type", "type")


def test_extra_types_by_configuration(make_app):
    app = make_app(extra_types=["design_note"])
    rv = app.test_client().post("/mcp/push", json=make_unit("a note", type="design_note"))
    assert rv.status_code == 200


@pytest.mark.parametrize("source,ok", [("a", True), ("x" * 200, True), ("x" * 201, False), ("", False),
                                       ("   ", False), ("tool\nv1", False), ("tool\x00", False), (5, False)])
def test_source_rules(client, source, ok):
    rv = client.post("/mcp/push", json=make_unit("s", source=source))
    if ok:
        assert rv.status_code == 200
    else:
        assert_error(rv, 400, "invalid_field", "source")


@pytest.mark.parametrize("value", [True, False, 1715824391.0, 1.5, "1715824391", [1]])
def test_timestamp_must_be_integer(client, value):
    unit = make_unit("ts")
    unit["timestamp"] = value
    rv = client.post("/mcp/push", json=unit)
    assert_error(rv, 400, "invalid_field", "timestamp")


@pytest.mark.parametrize("value", ["absent", None])
def test_a_unit_without_timestamp_is_stamped_when_it_arrives(client, value):
    """Issue 26: an agent (a Dify tool call) cannot know the time; the server's clock is the unit's."""
    unit = make_unit("stamped on arrival")
    if value == "absent":
        del unit["timestamp"]
    else:
        unit["timestamp"] = None
    before = int(time.time())
    rv = client.post("/mcp/push", json=unit)
    assert rv.status_code == 200, rv.get_json()
    stored = client.get(f"/mcp/units/{rv.get_json()['cid']}").get_json()
    assert before <= stored["timestamp"] <= int(time.time())
    assert stored["cid"] == compute_cid("stamped on arrival", stored["timestamp"], unit["source"])


def test_json_true_timestamp_is_not_one(client):
    # Sent as raw JSON text so no client library can coerce it.
    body = '{"type":"user_input","source":"s","timestamp":true,"ttl":60,"content":"c"}'
    assert_error(client.post("/mcp/push", data=body, content_type="application/json"), 400, "invalid_field", "timestamp")


def test_timestamp_future_skew(client):
    now = int(time.time())
    assert client.post("/mcp/push", json=make_unit("soon", timestamp=now + 240)).status_code == 200
    assert_error(client.post("/mcp/push", json=make_unit("later", timestamp=now + 600)), 400,
                 "timestamp_in_future", "timestamp")


def test_negative_timestamp_rejected(client):
    assert_error(client.post("/mcp/push", json=make_unit("neg", timestamp=-5)), 400, "invalid_field", "timestamp")


@pytest.mark.parametrize("ttl,ok", [(1, True), (31_536_000, True), (0, False), (-1, False), (31_536_001, False),
                                    (3600.0, False), (1.5, False), (True, False), ("60", False)])
def test_ttl_rules(client, ttl, ok):
    rv = client.post("/mcp/push", json=make_unit(f"ttl {ttl!r}", ttl=ttl))
    if ok:
        assert rv.status_code == 200
    else:
        assert_error(rv, 400, "invalid_field", "ttl")


# --- ttl optional, configurable default and maximum (issue 14, item 5) -------------------------------
def test_ttl_is_optional_and_defaults_to_30_days(client):
    unit = make_unit("no ttl given")
    del unit["ttl"]
    rv = client.post("/mcp/push", json=unit)
    assert rv.status_code == 200, rv.get_json()
    got = client.get(f"/mcp/units/{rv.get_json()['cid']}").get_json()
    assert got["ttl"] == 2_592_000 and got["expires_at"] == unit["timestamp"] + 2_592_000


def test_default_ttl_is_configurable(make_app):
    app = make_app(default_ttl=600)
    c = app.test_client()
    unit = make_unit("short default")
    del unit["ttl"]
    cid = c.post("/mcp/push", json=unit).get_json()["cid"]
    assert c.get(f"/mcp/units/{cid}").get_json()["ttl"] == 600
    # An explicit ttl still follows the unit contract's maximum.
    assert_error(c.post("/mcp/push", json=make_unit("too long", ttl=31_536_001)), 400, "invalid_field", "ttl")


def test_no_maximum_lets_a_unit_be_kept_for_good(make_app):
    from service.units import NEVER_TTL
    app = make_app(max_ttl=0, default_ttl=0)
    c = app.test_client()
    unit = make_unit("kept for good 永久保存")
    del unit["ttl"]
    cid = c.post("/mcp/push", json=unit).get_json()["cid"]
    got = c.get(f"/mcp/units/{cid}").get_json()
    assert got["ttl"] == NEVER_TTL and got["expires_at"] == unit["timestamp"] + NEVER_TTL < 2**53
    rv = c.post("/mcp/push", json=make_unit("ten years", ttl=10 * 31_536_000))
    assert rv.status_code == 200
    assert_error(c.post("/mcp/push", json=make_unit("beyond", ttl=NEVER_TTL + 1)), 400, "invalid_field", "ttl")
    rv = c.post("/mcp/search", json={"query": "永久保存", "consistency": "strong"})
    assert [r["cid"] for r in rv.get_json()["results"]] == [cid]
    doc = c.get("/openapi.json").get_json()
    push = doc["paths"]["/mcp/push"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "ttl" not in push["required"] and "kept for good" in push["properties"]["ttl"]["description"]


@pytest.mark.parametrize("config", [{"default_ttl": 0}, {"default_ttl": 40_000_000}, {"max_ttl": -1}])
def test_inconsistent_ttl_configuration_stops_the_start(make_app, config):
    with pytest.raises(ValueError, match="CONTEXT_"):
        make_app(**config)


def test_float_ttl_as_raw_json(client):
    body = '{"type":"user_input","source":"s","timestamp":%d,"ttl":3600.0,"content":"c"}' % int(time.time())
    assert_error(client.post("/mcp/push", data=body, content_type="application/json"), 400, "invalid_field", "ttl")


def test_already_expired_is_422_not_silently_dropped(client):
    now = int(time.time())
    rv = client.post("/mcp/push", json=make_unit("old", timestamp=now - 7200, ttl=3600))
    assert_error(rv, 422, "already_expired")
    assert client.get("/mcp/units/" + cid_of("old", now - 7200, "test_v1_ci")).status_code == 404


def test_content_object_rejected_with_serialize_hint(client):
    rv = client.post("/mcp/push", json=make_unit({"order_id": "ORD-7890"}))
    assert_error(rv, 400, "invalid_content", "content")
    assert "serialize" in rv.get_json()["error"]
    assert_error(client.post("/mcp/push", json=make_unit([1, 2])), 400, "invalid_content", "content")
    assert_error(client.post("/mcp/push", json=make_unit(42)), 400, "invalid_content", "content")


def test_content_size_limit(client):
    limit = 1024 * 1024
    assert client.post("/mcp/push", json=make_unit("a" * limit)).status_code == 200
    assert_error(client.post("/mcp/push", json=make_unit("a" * (limit + 1))), 400, "content_too_large", "content")
    # The limit is UTF-8 bytes, not characters: 3 bytes per CJK character.
    assert_error(client.post("/mcp/push", json=make_unit("订" * (limit // 3 + 1))), 400, "content_too_large", "content")


def test_empty_and_whitespace_content_stored_not_searchable(client):
    for text in ("", "   \n\t"):
        rv = client.post("/mcp/push", json=make_unit(text))
        assert rv.status_code == 200
        assert client.get(f"/mcp/units/{rv.get_json()['cid']}").get_json()["content"] == text
    rv = client.post("/mcp/search", json={"query": "anything", "consistency": "strong"})
    assert rv.status_code == 200 and rv.get_json()["results"] == []


def test_any_string_is_content_and_comes_back_exactly(app, client):
    """Content is any string (docs/design.md §3), U+0000 included, which PostgreSQL's text cannot
    hold: that backend stores it escaped (service/store/postgresql/rows.py). Every read gives back what was pushed:
    the unit, strong and default search, the list, the export, MCP resources/read."""
    texts = ["parcel a\x00b", "parcel \uffff0 not a NUL", "parcel \uffff\uffff\x00\uffff", "\x00", "parcel \uffff"]
    cids = {}
    for text in texts:
        rv = client.post("/mcp/push", json=make_unit(text, source="nul_v1"))
        assert rv.status_code == 200, rv.get_json()
        cids[rv.get_json()["cid"]] = text
    assert len(cids) == len(texts)
    for cid, text in cids.items():
        assert client.get(f"/mcp/units/{cid}").get_json()["content"] == text
    searchable = {cid: text for cid, text in cids.items() if "parcel" in text}

    def found(**body):
        rv = client.post("/mcp/search", json={"query": "parcel", "top_k": 10, **body})
        assert rv.status_code == 200, rv.get_json()
        return {r["cid"]: r["content"] for r in rv.get_json()["results"]}
    assert found(consistency="strong") == searchable
    drain(app)
    assert found() == searchable
    listed = client.get("/mcp/units?source=nul_v1&limit=50").get_json()["units"]
    assert {u["cid"]: u["content"] for u in listed} == cids
    exported = [json.loads(x) for x in client.get("/mcp/export?source=nul_v1").get_data(as_text=True).splitlines()]
    assert {u["cid"]: u["content"] for u in exported} == cids
    cid = next(iter(cids))
    rv = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "resources/read",
                                   "params": {"uri": f"context://units/{cid}"}},
                     headers={"MCP-Protocol-Version": "2025-11-25", "Accept": "application/json, text/event-stream"})
    [doc] = rv.get_json()["result"]["contents"]
    assert doc["text"] == cids[cid]


def test_metadata_rules(client):
    assert client.post("/mcp/push", json=make_unit("m1", metadata={"k": [1, {"x": None}]})).status_code == 200
    assert_error(client.post("/mcp/push", json=make_unit("m2", metadata=[1])), 400, "invalid_field", "metadata")
    assert_error(client.post("/mcp/push", json=make_unit("m3", metadata="s")), 400, "invalid_field", "metadata")
    big = {"k": "v" * (64 * 1024)}
    assert_error(client.post("/mcp/push", json=make_unit("m4", metadata=big)), 400, "metadata_too_large", "metadata")


def test_parent_must_exist_live_and_same_tenant(client):
    assert_error(client.post("/mcp/push", json=make_unit("child", parent_cid="0123456789ab")), 422,
                 "parent_not_found", "parent_cid")
    assert_error(client.post("/mcp/push", json=make_unit("child", parent_cid="NOTHEX")), 400, "invalid_cid",
                 "parent_cid")
    parent = client.post("/mcp/push", json=make_unit("parent")).get_json()["cid"]
    rv = client.post("/mcp/push", json=make_unit("child", parent_cid=parent))
    assert rv.status_code == 200
    assert client.get(f"/mcp/units/{rv.get_json()['cid']}").get_json()["parent_cid"] == parent


def test_expired_parent_rejected(clock, client):
    now = int(time.time())
    parent = client.post("/mcp/push", json=make_unit("short", timestamp=now - 10, ttl=11)).get_json()["cid"]
    clock.advance(1.2)
    assert_error(client.post("/mcp/push", json=make_unit("late child", parent_cid=parent)), 422, "parent_not_found")


def test_unknown_field_rejected(client):
    assert_error(client.post("/mcp/push", json=make_unit("u", colour="red")), 400, "unknown_field", "colour")


def test_repush_is_idempotent_and_takes_new_mutable_fields(client):
    unit = make_unit("same content", metadata={"v": 1})
    first = client.post("/mcp/push", json=unit).get_json()
    again = client.post("/mcp/push", json={**unit, "type": "system_notice", "ttl": 7200, "metadata": {"v": 2}})
    assert again.status_code == 200
    body = again.get_json()
    assert body["status"] == "duplicate" and body["cid"] == first["cid"] and body["seq"] == first["seq"]
    got = client.get(f"/mcp/units/{first['cid']}").get_json()
    assert got["type"] == "system_notice" and got["ttl"] == 7200 and got["metadata"] == {"v": 2}
    assert got["expires_at"] == unit["timestamp"] + 7200


def test_seq_is_per_tenant_and_increasing(client):
    seqs = [client.post("/mcp/push", json=make_unit(f"n{i}")).get_json()["seq"] for i in range(5)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


def test_forced_48_bit_collision_never_overwrites(client, monkeypatch):
    import service.units as units
    first = make_unit("the original unit")
    cid = client.post("/mcp/push", json=first).get_json()["cid"]
    before = client.get(f"/mcp/units/{cid}").get_json()
    # Every CID now equals the first one: a different unit collides.
    monkeypatch.setattr(units, "compute_cid", lambda content, ts, source: cid)
    rv = client.post("/mcp/push", json=make_unit("an impostor with other content", ttl=99))
    assert_error(rv, 409, "cid_collision", "cid")
    rv = client.post("/mcp/push", json=make_unit("the original unit", source="another_source"))
    assert_error(rv, 409, "cid_collision")
    assert client.get(f"/mcp/units/{cid}").get_json() == before


def test_collision_by_brute_force_on_a_short_prefix(client, monkeypatch):
    """The CID cut to 16 bits (repeated to 12 hex digits) so brute force finds two real contents that collide."""
    import service.units as units

    def short_cid(content, timestamp, source):
        return hashlib.sha256((content + str(timestamp) + source).encode()).hexdigest()[:4] * 3

    ts, source = int(time.time()), "test_v1_ci"
    seen, pair = {}, None
    for i in range(100_000):
        cid = short_cid(f"unit {i}", ts, source)
        if cid in seen:
            pair = (seen[cid], f"unit {i}")
            break
        seen[cid] = f"unit {i}"
    assert pair is not None
    monkeypatch.setattr(units, "compute_cid", short_cid)
    rv1 = client.post("/mcp/push", json=make_unit(pair[0], timestamp=ts, source=source))
    rv2 = client.post("/mcp/push", json=make_unit(pair[1], timestamp=ts, source=source))
    assert rv1.status_code == 200
    assert_error(rv2, 409, "cid_collision")
    assert client.get(f"/mcp/units/{rv1.get_json()['cid']}").get_json()["content"] == pair[0]


@pytest.mark.sqlite_only
def test_unit_for_yesterday_lands_in_yesterdays_file(client, app):
    import datetime
    now = int(time.time())
    yesterday = now - 86_400
    rv = client.post("/mcp/push", json=make_unit("from yesterday", timestamp=yesterday, ttl=3 * 86_400))
    assert rv.status_code == 200
    day = datetime.datetime.fromtimestamp(yesterday, datetime.timezone.utc).strftime("%Y-%m-%d")
    today = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%d")
    data = app.config["CONTEXT"].data_path / "tenants" / "default"
    import sqlite3
    conn = sqlite3.connect(data / "primary" / f"{day}.db")
    assert conn.execute("SELECT content, indexed FROM units").fetchall() == [("from yesterday", 0)]
    conn.close()
    assert not (data / "primary" / f"{today}.db").exists()
    cat = sqlite3.connect(data / "catalog.db")
    assert cat.execute("SELECT day FROM catalog WHERE cid = ?", (rv.get_json()["cid"],)).fetchone() == (day,)
    cat.close()


def test_single_unit_body_must_be_an_object(client):
    assert_error(client.post("/mcp/push", json="just a string"), 400, "invalid_unit")
    assert_error(client.post("/mcp/push", json=42), 400, "invalid_unit")


def test_lone_surrogate_content_rejected(client):
    body = json.dumps(make_unit("x")).replace('"x"', '"\\ud800"')
    assert_error(client.post("/mcp/push", data=body, content_type="application/json"), 400, "invalid_content")


def test_lone_surrogate_source_and_cid_with_newline_rejected(client):
    body = json.dumps(make_unit("x", source="s")).replace('"source": "s"', '"source": "s\\ud800x"')
    assert_error(client.post("/mcp/push", data=body, content_type="application/json"), 400, "invalid_field", "source")
    assert_error(client.post("/mcp/push", json=make_unit("x", parent_cid="0123456789ab\n")), 400, "invalid_cid",
                 "parent_cid")
    assert_error(client.get("/mcp/units/0123456789ab%0A"), 400, "invalid_cid", "cid")     # as parent_cid (issue 26)
