"""The MCP Inspector CLI (npm @modelcontextprotocol/inspector, installed by .ci/setup.d/mcp-inspector.sh)
against gunicorn: resources/list, resources/read, prompts/get and tools/call."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import ROOT
from mcp_support import push, start_server, wait_searchable

INSPECTOR = ROOT / ".ci" / "node_modules_inspector" / "node_modules" / ".bin" / "mcp-inspector"

pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None or shutil.which("node") is None,
    reason="npm/node not installed: the MCP Inspector CLI cannot be installed (.ci/setup.d/mcp-inspector.sh)")


@pytest.fixture(scope="module")
def inspector():
    if not INSPECTOR.exists():
        subprocess.run(["bash", str(ROOT / ".ci" / "setup.d" / "mcp-inspector.sh")], check=True, timeout=600)
    return INSPECTOR


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The Inspector CLI sends no Authorization header: run the single-tenant, keyless mode.
    srv = start_server(tmp_path_factory, "mcp-inspector")
    yield srv
    srv.stop()


def run_cli(inspector, server, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(inspector), "--cli", server.mcp, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def output(proc) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_inspector_cli_lists_reads_prompts_and_calls(inspector, server):
    parent = push(server, "inspector parent: 订单 ORD-1 placed", key=None)["cid"]
    cid = push(server, "inspector sees ORD-1 shipped", key=None, parent_cid=parent)["cid"]
    wait_searchable(server, "inspector", {parent, cid}, key=None)

    listed = output(run_cli(inspector, server, "--method", "resources/list"))
    assert [r["uri"] for r in listed["resources"]][:2] == [f"context://units/{cid}", f"context://units/{parent}"]

    read = output(run_cli(inspector, server, "--method", "resources/read", "--uri", f"context://units/{cid}"))
    [contents] = read["contents"]
    assert (contents["mimeType"], contents["text"]) == ("text/plain", "inspector sees ORD-1 shipped")

    prompt = output(run_cli(inspector, server, "--method", "prompts/get", "--prompt-name", "review-lineage",
                            "--prompt-args", f"cid={cid}"))
    assert "untrusted data" in prompt["messages"][0]["content"]["text"]
    embedded = [m["content"]["resource"] for m in prompt["messages"][1:]]
    assert [e["uri"] for e in embedded] == [f"context://units/{cid}", f"context://units/{parent}"]
    assert embedded[0]["text"] == contents["text"] and embedded[0]["mimeType"] == contents["mimeType"]

    called = output(run_cli(inspector, server, "--method", "tools/call", "--tool-name", "context_search",
                            "--tool-arg", "query=inspector", "consistency=strong"))
    assert called.get("isError") in (None, False)
    assert {r["cid"] for r in called["structuredContent"]["results"]} == {cid, parent}

    missing = run_cli(inspector, server, "--method", "resources/read", "--uri", "context://units/000000000000")
    assert missing.returncode != 0 and "-32002" in missing.stdout + missing.stderr


# --- the Inspector with a key (issue 14, item 8): Inspector 0.15 (what npm installs on Node 20) has
# no --header, but it launches stdio servers with -e variables: the bridge carries the key.
def test_inspector_with_a_key_through_the_stdio_bridge(inspector, tmp_path_factory):
    from mcp_support import KEY, KEYS, context_mode_bin
    srv = start_server(tmp_path_factory, "mcp-inspector-key", keys=KEYS)
    try:
        cid = push(srv, "inspector with a key: ORD-2 packed", key=KEY)["cid"]

        def via_bridge(key, *args):
            return subprocess.run([str(inspector), "--cli", "-e", f"CONTEXT_URL={srv.url}", "-e", f"CONTEXT_API_KEY={key}",
                                   str(context_mode_bin()), "mcp-stdio", *args], capture_output=True, text=True,
                                  timeout=120, cwd=ROOT)
        listed = output(via_bridge(KEY, "--method", "resources/list"))
        assert [r["uri"] for r in listed["resources"]] == [f"context://units/{cid}"]
        refused = via_bridge("wrong-key", "--method", "resources/list")
        assert refused.returncode != 0 and "Invalid API key" in refused.stdout + refused.stderr
    finally:
        srv.stop()
