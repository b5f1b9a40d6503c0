"""CONTEXT_MASK_PUSHES (issue 39, finding 5; off by default): a pushed unit's credentials are masked by the hooks'
own detector before it is stored, content, source and metadata alike, under the CID of what is stored; a unit
without any is stored as sent, with its own CID. On both stores."""
from __future__ import annotations

from conftest import assert_error, make_unit
from service.units import compute_cid

BACKENDS = ("sqlite", "postgresql")
TOKEN = "ghp_" + "a1B2c3D4e5" * 4


def test_credentials_are_masked_before_they_are_stored(make_app):
    c = make_app(mask_pushes=True).test_client()
    unit = make_unit(f"export GITHUB_TOKEN={TOKEN}\ndone", source=f"bash_v1 {TOKEN}",
                     metadata={"cwd": f"/srv/{TOKEN}", "session_id": "4f1c2a9b-7d3e", "PRIVATE-TOKEN": "abc12345"})
    unit["cid"] = compute_cid(unit["content"], unit["timestamp"], unit["source"])     # the client's CID is accepted
    rv = c.post("/mcp/push", json=unit)
    assert rv.status_code == 200, rv.get_json()
    cid = rv.get_json()["cid"]
    stored = c.get(f"/mcp/units/{cid}").get_json()
    assert stored["content"] == "export GITHUB_TOKEN=[REDACTED:github-pat]\ndone"
    assert stored["source"] == "bash_v1 [REDACTED:github-pat]"
    assert stored["metadata"] == {"cwd": "/srv/[REDACTED:github-pat]", "session_id": "4f1c2a9b-7d3e",
                                  "PRIVATE-TOKEN": "[REDACTED:secret_name]"}
    assert cid == compute_cid(stored["content"], stored["timestamp"], stored["source"]) != unit["cid"]
    assert c.post("/mcp/push", json=unit).get_json()["status"] == "duplicate"           # a retry stays one unit
    found = c.post("/mcp/search", json={"query": "GITHUB_TOKEN", "consistency": "strong"}).get_json()["results"]
    assert [r["cid"] for r in found] == [cid] and TOKEN not in str(found)
    batch = c.post("/mcp/push", json=[make_unit(f"two {TOKEN}"), make_unit("three, clean")]).get_json()["results"]
    assert [r["status"] for r in batch] == ["ok", "ok"]
    assert TOKEN not in c.get(f"/mcp/units/{batch[0]['cid']}").get_json()["content"]


def test_off_by_default_and_a_clean_unit_keeps_its_cid(make_app, tmp_path):
    c = make_app().test_client()
    rv = c.post("/mcp/push", json=make_unit(f"token {TOKEN}"))
    assert c.get(f"/mcp/units/{rv.get_json()['cid']}").get_json()["content"] == f"token {TOKEN}"
    c = make_app(mask_pushes=True, data_dir=tmp_path / "masking").test_client()
    clean = make_unit("nothing to hide here")
    rv = c.post("/mcp/push", json=clean)
    assert rv.get_json()["cid"] == compute_cid(clean["content"], clean["timestamp"], clean["source"])


def test_a_unit_its_tags_make_too_long_is_refused_and_nothing_stored(make_app):
    c = make_app(mask_pushes=True, max_content_bytes=200).test_client()
    rv = c.post("/mcp/push", json=make_unit("a:bcd@x " * 25))
    assert_error(rv, 400, "content_too_large", "content")
    assert c.post("/mcp/search", json={"query": "bcd", "consistency": "strong"}).get_json()["results"] == []
