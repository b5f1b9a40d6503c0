"""Issue 26, item 1: a unit pushed without a ttl lives as long as the server says, through every door and
client (REST, MCP context_push, the CLI's push and import, the Python and JavaScript clients).

The server runs with an unusual CONTEXT_DEFAULT_TTL, so a client that fills in its own default fails here."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import ROOT, make_unit
from context_mode_client import ContextModeClient, make_unit as client_unit
from mcp_support import McpServer, rpc

KEY = "ttlkey-0123456789abcdef"
SERVER_TTL = 777_777                        # neither the old clients' 86400 nor the shipped 30 days
CLI = Path(sys.executable).parent / "context-mode"
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = McpServer(tmp_path_factory.mktemp("ttl") / "data", workers=1, keys={KEY: ("acme", ["push", "search"])},
                   env={"CONTEXT_DEFAULT_TTL": str(SERVER_TTL)})
    try:
        yield s.start()
    finally:
        s.stop()


def stored_ttl(server, cid: str) -> int:
    rv = requests.get(f"{server.url}/mcp/units/{cid}", headers=server.headers(KEY), timeout=30)
    assert rv.status_code == 200, rv.text
    return rv.json()["ttl"]


def cli(server, *args):
    env = dict(os.environ, CONTEXT_URL=server.url, CONTEXT_API_KEY=KEY)
    rv = subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stdout + rv.stderr
    return rv.stdout


def test_rest_push_without_ttl(server):
    unit = make_unit("TTLREST no ttl named")
    del unit["ttl"]
    rv = requests.post(server.url + "/mcp/push", json=unit, headers=server.headers(KEY), timeout=30)
    assert rv.status_code == 200, rv.text
    assert stored_ttl(server, rv.json()["cid"]) == SERVER_TTL


def test_mcp_context_push_without_ttl(server):
    rv = rpc(server, "tools/call", {"name": "context_push", "arguments": {
        "type": "user_input", "source": "ttl_v1_mcp", "content": "TTLMCP no ttl named"}}, key=KEY)
    result = rv.json()["result"]
    assert result["isError"] is False, result
    assert stored_ttl(server, result["structuredContent"]["cid"]) == SERVER_TTL


def test_cli_push_without_ttl(server):
    cid = cli(server, "push", "--source", "ttl_v1_cli", "TTLCLI no ttl named").split()[0]
    assert stored_ttl(server, cid) == SERVER_TTL
    cid = cli(server, "push", "--source", "ttl_v1_cli", "--ttl", "120", "TTLCLI ttl named").split()[0]
    assert stored_ttl(server, cid) == 120


def test_cli_import_without_ttl(server, tmp_path):
    path = tmp_path / "units.jsonl"
    path.write_text(json.dumps({"content": "TTLIMPORT no ttl named", "source": "ttl_v1_import"}) + "\n")
    assert "imported 1 new" in cli(server, "import", str(path))
    cid = json.loads(cli(server, "search", "TTLIMPORT", "--strong", "--json"))["results"][0]["cid"]
    assert stored_ttl(server, cid) == SERVER_TTL


def test_python_client_without_ttl(server):
    cm = ContextModeClient(server.url, KEY)
    unit = client_unit("TTLPY make_unit", source="ttl_v1_py")
    assert "ttl" not in unit                                          # the server decides
    assert stored_ttl(server, cm.push(unit)["cid"]) == SERVER_TTL
    assert stored_ttl(server, cm.push("TTLPY content only", source="ttl_v1_py")["cid"]) == SERVER_TTL
    assert stored_ttl(server, cm.push("TTLPY named", source="ttl_v1_py", ttl=600)["cid"]) == 600


@pytest.mark.skipif(NODE is None, reason="node is not installed: the JS client was not tested")
def test_js_client_without_ttl(server, tmp_path):
    module = (ROOT / "clients" / "js" / "context-mode.mjs").as_uri()
    script = tmp_path / "ttl.mjs"
    script.write_text(f"""
import {{ ContextModeClient, makeUnit }} from {json.dumps(module)};
const cm = new ContextModeClient({{ url: {json.dumps(server.url)}, apiKey: {json.dumps(KEY)} }});
const unit = await makeUnit("TTLJS makeUnit {time.time_ns()}", {{ source: "ttl_v1_js" }});
const a = await cm.push(unit);
const b = await cm.push("TTLJS content only {time.time_ns()}", {{ source: "ttl_v1_js" }});
const c = await cm.push("TTLJS named {time.time_ns()}", {{ source: "ttl_v1_js", ttl: 900 }});
console.log(JSON.stringify({{ hasTtl: "ttl" in unit, cids: [a.cid, b.cid, c.cid] }}));
""")
    rv = subprocess.run([NODE, str(script)], capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stderr
    out = json.loads(rv.stdout.strip().splitlines()[-1])
    assert out["hasTtl"] is False
    assert [stored_ttl(server, cid) for cid in out["cids"]] == [SERVER_TTL, SERVER_TTL, 900]
