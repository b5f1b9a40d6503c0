"""Batch push, size limits and the HTTP status codes of the REST API (docs/design.md §4)."""
import time

from conftest import assert_error, drain, make_unit

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")


def test_batch_of_1000_with_3_bad_items(client):
    now = int(time.time())
    units = [make_unit(f"batch unit {i} 订单 {i}", timestamp=now - i) for i in range(1000)]
    units[10]["ttl"] = 1.5                              # float ttl
    units[500]["content"] = {"not": "a string"}         # object content
    units[999]["timestamp"] = True                      # JSON true
    rv = client.post("/mcp/push", json={"units": units})
    assert rv.status_code == 200
    results = rv.get_json()["results"]
    assert [r["index"] for r in results] == list(range(1000))
    bad = {r["index"]: r for r in results if r["status"] == "error"}
    assert sorted(bad) == [10, 500, 999]
    assert bad[10]["code"] == "invalid_field" and bad[500]["code"] == "invalid_content"
    assert all(r["error"] for r in bad.values())
    good = [r for r in results if r["status"] == "ok"]
    assert len(good) == 997
    assert len({r["seq"] for r in good}) == 997
    for r in good[::50]:
        assert client.get(f"/mcp/units/{r['cid']}").status_code == 200
    assert client.get(f"/mcp/units/{good[-1]['cid']}").get_json()["content"].startswith("batch unit 998")


def test_batch_as_bare_array_and_parent_within_batch(client):
    parent = make_unit("parent in batch")
    from service.units import compute_cid
    pcid = compute_cid(parent["content"], parent["timestamp"], parent["source"])
    rv = client.post("/mcp/push", json=[parent, make_unit("child in batch", parent_cid=pcid)])
    assert [r["status"] for r in rv.get_json()["results"]] == ["ok", "ok"]


def test_batch_duplicate_inside_batch(client):
    u = make_unit("twice")
    results = client.post("/mcp/push", json=[u, u]).get_json()["results"]
    assert [r["status"] for r in results] == ["ok", "duplicate"]
    assert results[0]["seq"] == results[1]["seq"]


def test_batch_limits(client):
    assert_error(client.post("/mcp/push", json={"units": []}), 400, "empty_batch")
    assert_error(client.post("/mcp/push", json=[]), 400, "empty_batch")
    assert_error(client.post("/mcp/push", json={"units": [make_unit(str(i)) for i in range(1001)]}), 400,
                 "batch_too_large")
    assert_error(client.post("/mcp/push", json={"units": "nope"}), 400, "invalid_field", "units")
    assert client.get("/mcp/search", query_string={"q": "0"}).get_json()["results"] == []


def test_request_body_too_large_is_413(make_app):
    app = make_app(max_body_bytes=10_000)
    rv = app.test_client().post("/mcp/push", json=make_unit("x" * 20_000))
    assert_error(rv, 413, "payload_too_large")


def test_invalid_json_is_400(client):
    for body in (b"{bad", b"", b"\xff\xfe", b'{"a": NaN}', b"[" * 100_000):
        assert_error(client.post("/mcp/push", data=body, content_type="application/json"), 400, "invalid_json")


def test_unknown_route_404_and_wrong_method_405_are_json(client):
    assert_error(client.get("/nowhere"), 404, "not_found")
    assert_error(client.put("/mcp/push", json={}), 405, "method_not_allowed")
    assert_error(client.get("/mcp/push"), 405, "method_not_allowed")
    assert_error(client.post("/mcp/units/0123456789ab"), 405, "method_not_allowed")


def test_get_unknown_unit_is_404_and_malformed_is_400(client):
    assert_error(client.get("/mcp/units/0123456789ab"), 404, "not_found")
    assert_error(client.get("/mcp/units/..%2f..%2fetc"), 404, "not_found")          # no such route
    assert_error(client.get("/mcp/units/ABCDEF012345"), 400, "invalid_cid", "cid")   # as parent_cid (issue 26)


def test_expired_unit_is_404(clock, client):
    now = int(time.time())
    cid = client.post("/mcp/push", json=make_unit("brief", timestamp=now - 5, ttl=7)).get_json()["cid"]
    assert client.get(f"/mcp/units/{cid}").status_code == 200
    clock.advance(now + 2.1 - time.time())
    assert_error(client.get(f"/mcp/units/{cid}"), 404, "not_found")


def test_lineage_ancestors_root_last_and_children(client):
    root = client.post("/mcp/push", json=make_unit("root")).get_json()["cid"]
    mid = client.post("/mcp/push", json=make_unit("mid", parent_cid=root)).get_json()["cid"]
    leaf = client.post("/mcp/push", json=make_unit("leaf", parent_cid=mid)).get_json()["cid"]
    other = client.post("/mcp/push", json=make_unit("sibling", parent_cid=mid)).get_json()["cid"]
    body = client.get(f"/mcp/units/{leaf}/lineage").get_json()
    assert [u["cid"] for u in body["ancestors"]] == [mid, root]
    assert body["children"] == []
    body = client.get(f"/mcp/units/{mid}/lineage").get_json()
    assert [u["cid"] for u in body["ancestors"]] == [root]
    assert [u["cid"] for u in body["children"]] == [leaf, other]
    assert_error(client.get("/mcp/units/0123456789ab/lineage"), 404, "not_found")


def test_delete_removes_unit_everywhere(client, app):
    cid = client.post("/mcp/push", json=make_unit("delete me 删除")).get_json()["cid"]
    assert client.post("/mcp/search", json={"query": "删除", "consistency": "strong"}).get_json()["results"]
    rv = client.delete(f"/mcp/units/{cid}")
    assert rv.status_code == 200 and rv.get_json() == {"status": "deleted", "cid": cid}
    assert_error(client.get(f"/mcp/units/{cid}"), 404, "not_found")
    assert client.post("/mcp/search", json={"query": "删除", "consistency": "strong"}).get_json()["results"] == []
    drain(app)  # refresh the replica
    assert client.post("/mcp/search", json={"query": "删除"}).get_json()["results"] == []
    assert_error(client.delete(f"/mcp/units/{cid}"), 404, "not_found")


def test_healthz_and_readyz(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    body = client.get("/readyz").get_json()
    assert body["status"] == "ok" and body["storage_writable"] is True
    assert body["index_pending"] == 0
    assert body["read_index"] == {"behind_units": 0, "lag_ms": 0, "units": 0}
    client.post("/mcp/push", json=make_unit("pending one"))
    body = client.get("/readyz").get_json()
    assert body["index_pending"] == 1
    # units the read index lacks; "units" is the old name of the same count, kept for monitors
    assert body["read_index"]["behind_units"] == body["read_index"]["units"] == 1
