"""Seeing and managing the memory (issue 15) through its real doors against gunicorn: the Python client,
`context-mode list | stats | forget | export | import` (round trips across tenants and after a restore)
and the MCP `context_forget` tool and `context://stats` resource with the official SDK client."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path
from contextlib import asynccontextmanager

import pytest
import requests

from conftest import VENV_BIN, LiveServer, make_unit, store_env
from context_mode_client import ContextModeClient, ContextModeError

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")

ADMIN = "live-admin-0123456789abcdef"
READER = "live-reader-0123456789abcde"
GLOBEX = "live-globex-0123456789abcde"
KEYS = {ADMIN: ("acme", ["push", "search", "admin"]), READER: ("acme", ["push", "search"]),
        GLOBEX: ("globex", ["push", "search", "admin"])}
DAY = 86_400


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_store_config):
    s = LiveServer(tmp_path_factory.mktemp("manage-live") / "data", workers=2, keys=KEYS,
                   env=store_env(module_store_config))
    try:
        yield s.start()
    finally:
        s.stop()


def cli(server, *args, key=ADMIN, stdin=None, data_dir=None):
    env = dict(os.environ, CONTEXT_URL=server.url if server else "", CONTEXT_API_KEY=key)
    return subprocess.run([str(VENV_BIN / "context-mode"), *map(str, args)], env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


def exported(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_python_client_lists_counts_exports_and_forgets(server):
    cm = ContextModeClient(server.url, ADMIN)
    source = f"pyc_manage_{time.time_ns()}"
    cids = [cm.push(f"第{i}条 PYMANAGE note {i}", source=source, type="user_input" if i % 2 else "tool_output")["cid"]
            for i in range(7)]
    assert [u["cid"] for u in cm.iter_units(page_size=3, source=source)] == cids[::-1]
    page = cm.list_units(limit=2, source=source, types=["user_input"])
    assert [u["cid"] for u in page["units"]] == [cids[5], cids[3]] and page["next_cursor"]
    assert cm.stats()["types"]["user_input"]["units"] >= 3
    assert [u["cid"] for u in cm.export(source=source)] == cids

    with pytest.raises(ContextModeError) as e:
        ContextModeClient(server.url, READER).forget(source=source)
    assert (e.value.status, e.value.code) == (403, "missing_scope")
    dry = cm.forget(source=source, query="PYMANAGE", types="user_input")
    assert dry["count"] == 3 and not dry.get("forgotten")
    assert cm.forget(source=source, query="PYMANAGE", types="user_input", confirm=dry["confirm"])["forgotten"] == 3
    assert [u["cid"] for u in cm.iter_units(source=source)] == [cids[6], cids[4], cids[2], cids[0]]
    # gone from search at once, whichever worker answers
    for _ in range(6):
        found = cm.search("PYMANAGE", source=source, top_k=20)["results"]
        assert {r["cid"] for r in found} <= {cids[0], cids[2], cids[4], cids[6]}


def test_cli_list_stats_forget(server):
    source = f"cli_manage_{time.time_ns()}"
    cids = []
    for i in range(4):
        rv = cli(server, "push", "--source", source, "--type", "system_notice" if i == 3 else "tool_output",
                 f"CLIMANAGE 日志 {i}")
        assert rv.returncode == 0, rv.stderr
        cids.append(rv.stdout.split()[0])
    rv = cli(server, "list", "--source", source, "--limit", "3")
    assert rv.returncode == 0, rv.stderr
    assert [line.split()[1] for line in rv.stdout.splitlines()] == cids[::-1][:3] and "--limit" in rv.stderr
    rv = cli(server, "list", "--source", source, "--type", "system_notice", "--json")
    assert [json.loads(x)["cid"] for x in rv.stdout.splitlines()] == [cids[3]]
    rv = cli(server, "stats")
    assert rv.returncode == 0 and "tenant acme:" in rv.stdout and "system_notice" in rv.stdout
    # days in words true of both stores (PostgreSQL has no day files)
    assert re.search(r"^days stored [1-9]\d* \(\d+ bytes on disk\), ", rv.stdout, re.M) and "day files" not in rv.stdout
    assert json.loads(cli(server, "stats", "--json").stdout)["tenant"] == "acme"

    rv = cli(server, "forget", "--source", source, "--query", "CLIMANAGE", "--dry-run")
    assert rv.returncode == 0 and rv.stdout.startswith("4 unit(s) match")
    rv = cli(server, "forget", "--source", source, "--type", "tool_output", stdin="n\n")
    assert rv.returncode == 1 and "nothing forgotten" in rv.stderr
    assert len(cli(server, "list", "--source", source).stdout.splitlines()) == 4
    rv = cli(server, "forget", "--source", source, "--type", "tool_output", stdin="y\n")
    assert rv.returncode == 0 and "forgot 3 unit(s)" in rv.stdout, rv.stdout + rv.stderr
    rv = cli(server, "forget", "--cid", cids[3], "--yes")
    assert rv.returncode == 0 and "forgot 1 unit(s)" in rv.stdout
    assert cli(server, "list", "--source", source).stdout == ""
    rv = cli(server, "forget", "--source", source, key=READER, stdin="y\n")
    assert rv.returncode == 1 and "missing_scope" in rv.stderr
    assert cli(server, "forget").returncode == 2                  # nothing named: a usage error


def _lineage_world(server, key, tag):
    """Units over three days with metadata, a lineage, and one unit whose newer parent was pushed after
    it (a duplicate push moved it), so an export in ack order lists a child before its parent."""
    now = int(time.time())
    h = server.headers(key)
    units = [make_unit(f"{tag} 根 root", type="user_input", source="round_v1", timestamp=now - 2 * DAY,
                       metadata={"k": [1, "二"], "nested": {"ok": True}}, ttl=30 * DAY)]
    units[0]["cid"] = requests.post(server.url + "/mcp/push", json=units[0], headers=h, timeout=30).json()["cid"]
    moved = make_unit(f"{tag} moved child", source="round_v1", timestamp=now - DAY, ttl=9 * DAY)
    moved_cid = requests.post(server.url + "/mcp/push", json=moved, headers=h, timeout=30).json()["cid"]
    newer = make_unit(f"{tag} newer parent 新的父", type="model_thinking", source="round_v2", timestamp=now,
                      parent_cid=units[0]["cid"])
    newer_cid = requests.post(server.url + "/mcp/push", json=newer, headers=h, timeout=30).json()["cid"]
    rv = requests.post(server.url + "/mcp/push", json={**moved, "parent_cid": newer_cid}, headers=h, timeout=30)
    assert rv.json()["status"] == "duplicate"
    batch = [make_unit(f"{tag} batch {i} 批", source=f"round_v{i % 3}", timestamp=now - (i % 3) * DAY,
                       parent_cid=newer_cid if i % 4 == 0 else None) for i in range(30)]
    rv = requests.post(server.url + "/mcp/push", json={"units": batch}, headers=h, timeout=30)
    assert {r["status"] for r in rv.json()["results"]} == {"ok"}
    return moved_cid, newer_cid


def _normalized(units: list[dict]) -> list[dict]:
    return sorted(units, key=lambda u: u["cid"])


def test_export_then_import_into_another_tenant_is_the_same_store(server, tmp_path):
    tag = f"ROUNDTRIP{time.time_ns()}"
    moved_cid, newer_cid = _lineage_world(server, ADMIN, tag)
    out = tmp_path / "acme.jsonl"
    rv = cli(server, "export", out, "--source", "round_v*")
    assert rv.returncode == 0 and f"exported 33 unit(s) to {out}" in rv.stderr, rv.stderr
    acme = exported(out)
    order = [u["cid"] for u in acme]
    assert order.index(moved_cid) < order.index(newer_cid)         # the child comes before its parent

    rv = cli(server, "import", out, key=GLOBEX)
    assert rv.returncode == 0, rv.stdout + rv.stderr
    assert "imported 33 new, 0 duplicate, 0 failed" in rv.stdout
    copy = tmp_path / "globex.jsonl"
    assert cli(server, "export", copy, "--source", "round_v*", key=GLOBEX).returncode == 0
    assert _normalized(exported(copy)) == _normalized(acme)
    # the copy is a working store: search, lineage
    cm = ContextModeClient(server.url, GLOBEX)
    assert cm.lineage(moved_cid)["ancestors"][0]["cid"] == newer_cid
    assert {r["cid"] for r in cm.search(tag, consistency="strong", top_k=100)["results"]} == set(order)
    # importing the same file again changes nothing
    rv = cli(server, "import", out, key=GLOBEX)
    assert "imported 0 new, 33 duplicate, 0 failed" in rv.stdout
    # export to stdout equals the file
    assert [json.loads(x) for x in cli(server, "export", "--source", "round_v*").stdout.splitlines()] == acme


def open_to_others(*paths: Path) -> list[str]:
    """Every file or folder under these paths that its group or others may read, write or enter."""
    found = []
    for top in paths:
        for p in [top, *(top.rglob("*") if top.is_dir() else [])]:
            if p.stat().st_mode & 0o077:
                found.append(f"{p} {oct(p.stat().st_mode & 0o777)}")
    return found


@pytest.mark.sqlite_only
def test_export_after_a_backup_and_restore_is_the_same(tmp_path, live_server_factory):
    live = live_server_factory(data_dir=tmp_path / "live", workers=1, keys=KEYS)
    _lineage_world(live, ADMIN, "RESTORED")
    before = tmp_path / "before.jsonl"
    assert cli(live, "export", before).returncode == 0
    rv = cli(None, "backup", tmp_path / "backup", "--data-dir", tmp_path / "live")
    assert rv.returncode == 0, rv.stderr
    rv = cli(None, "restore", tmp_path / "backup", "--data-dir", tmp_path / "restored")
    assert rv.returncode == 0, rv.stderr
    # what the commands wrote is the memory: private, as the live store is (issue 51: backups were 0644 / 0755)
    assert open_to_others(before, tmp_path / "backup", tmp_path / "restored") == []
    restored = live_server_factory(data_dir=tmp_path / "restored", workers=1, keys=KEYS)
    after = tmp_path / "after.jsonl"
    assert cli(restored, "export", after).returncode == 0
    assert exported(after) == exported(before) and len(exported(before)) == 33
    # and imported from the restored store into an empty one: the same units again
    empty = live_server_factory(data_dir=tmp_path / "empty", workers=1, keys=KEYS)
    assert cli(empty, "import", after).returncode == 0
    again = tmp_path / "again.jsonl"
    assert cli(empty, "export", again).returncode == 0
    assert _normalized(exported(again)) == _normalized(exported(before))


@asynccontextmanager
async def connect(server, mode: str, key: str):
    """The official MCP SDK client over Streamable HTTP ("auto": 2026-07-28, "legacy": 2025-11-25)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(server.url + "/mcp", http_client=http), mode=mode) as client:
            yield client


def test_mcp_forget_tool_and_stats_resource_with_the_sdk(server):
    source = f"mcp_manage_{time.time_ns()}"
    cm = ContextModeClient(server.url, ADMIN)
    cids = [cm.push(f"MCPFORGET 第{i}条", source=source)["cid"] for i in range(3)]

    async def body():
        async with connect(server, "auto", ADMIN) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            forget = tools["context_forget"]
            assert forget.annotations.destructive_hint is True and forget.annotations.read_only_hint is False
            dry = await client.call_tool("context_forget", {"source": source, "query": "MCPFORGET"})
            assert dry.is_error is False and dry.structured_content["count"] == 3
            assert dry.structured_content["sample"][0]["uri"] == f"context://units/{cids[0]}"
            one = await client.call_tool("context_forget", {"cid": cids[1]})
            assert one.structured_content["count"] == 1
            done = await client.call_tool("context_forget", {"cid": cids[1], "confirm": one.structured_content["confirm"]})
            assert done.structured_content["forgotten"] == 1
            bad = await client.call_tool("context_forget", {"source": source, "confirm": "nope"})
            assert bad.is_error is True and "invalid_confirm" in bad.content[0].text
            stats = await client.read_resource("context://stats")
            [doc] = stats.contents
            assert doc.mime_type == "application/json" and json.loads(doc.text)["tenant"] == "acme"
            assert stats.cache_scope == "private"
        async with connect(server, "legacy", READER) as client:
            refused = await client.call_tool("context_forget", {"cid": cids[0]})
            assert refused.is_error is True and "admin" in refused.content[0].text
            stats = await client.read_resource("context://stats")
            assert json.loads(stats.contents[0].text)["units"] >= 2
    asyncio.run(body())
    assert [u["cid"] for u in cm.iter_units(source=source)] == [cids[2], cids[0]]
