"""`context-mode mcp-stdio` as a host launches it: only protocol on stdout, logs on stderr, exit 0 on EOF.
(The SDK's stdio client drives the bridge in tests/test_mcp_sdk.py.)"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import requests

from conftest import ROOT
from mcp_support import KEY, KEYS, MODERN, context_mode_bin, free_port_url, meta, start_server
from service.cli.stdio import PROTOCOL_VERSION_META_KEY as PROTOCOL_KEY


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory, "mcp-stdio", keys=KEYS)
    yield srv
    srv.stop()


def bridge(url: str | None, lines: list, key: str | None = KEY, env: dict | None = None) -> subprocess.CompletedProcess:
    args = [str(context_mode_bin()), "mcp-stdio", "--timeout", "20"]
    if url:
        args += ["--url", url]
    if key:
        args += ["--api-key", key]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_")}
    environ.update(env or {})
    data = "".join((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n" for line in lines)
    return subprocess.run(args, input=data.encode(), capture_output=True, timeout=60, env=environ)


def replies(proc) -> list[dict]:
    out = proc.stdout.decode("utf-8")
    assert out.endswith("\n") or out == ""
    return [json.loads(line) for line in out.splitlines()]     # every stdout line is one JSON-RPC message


def test_handshake_session_through_the_bridge(server):
    proc = bridge(server.mcp, [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "h", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        "this is not json",
        "",
        {"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": "context://units/000000000000"}},
    ])
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in replies(proc)}
    assert set(got) == {1, 2, 3, None}                  # nothing for the notification or the blank line
    assert got[1]["result"]["protocolVersion"] == "2025-06-18"
    assert got[2]["result"] == {}
    assert got[3]["error"]["code"] == -32002          # the negotiated 2025 revision rode along in the header
    assert got[None]["error"]["code"] == -32700
    assert b"forwarding stdio" in proc.stderr


def test_stateless_requests_get_their_headers_from_the_envelope(server):
    proc = bridge(server.mcp, [
        {"jsonrpc": "2.0", "id": "d", "method": "server/discover", "params": {"_meta": meta()}},
        {"jsonrpc": "2.0", "id": "r", "method": "resources/read",
         "params": {"_meta": meta(), "uri": "context://search/%E8%AE%A2%E5%8D%95"}},
        {"jsonrpc": "2.0", "id": "x", "method": "resources/read",
         "params": {"_meta": meta(), "uri": "context://units/000000000000"}},
    ])
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in replies(proc)}
    assert got["d"]["result"]["supportedVersions"] == [MODERN]
    assert got["r"]["result"]["contents"][0]["mimeType"] == "text/markdown"   # non-ASCII Mcp-Name, base64-wrapped
    assert got["x"]["error"]["code"] == -32602


def test_auth_failure_and_unreachable_server_are_reported_in_band(server):
    proc = bridge(server.mcp, [{"jsonrpc": "2.0", "id": 5, "method": "ping"}], key="wrong")
    assert proc.returncode == 0
    [reply] = replies(proc)
    assert reply["id"] == 5 and reply["error"]["code"] == -32010

    proc = bridge(free_port_url(), [{"jsonrpc": "2.0", "id": 6, "method": "ping"},
                                    {"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert proc.returncode == 0
    [reply] = replies(proc)
    assert reply["id"] == 6 and reply["error"]["code"] == -32603
    assert b"failed" in proc.stderr


PING = {"jsonrpc": "2.0", "id": 7, "method": "ping"}


@pytest.mark.parametrize("suffix", ["", "/", "/mcp", "/mcp/"])
def test_base_url_or_mcp_endpoint_both_work(server, suffix):
    """Issue 14, item 3: the CLI takes the base URL, the bridge took /mcp; now either works."""
    proc = bridge(server.url + suffix, [PING])
    assert proc.returncode == 0, proc.stderr
    assert replies(proc) == [{"jsonrpc": "2.0", "id": 7, "result": {}}]


def test_a_non_json_rpc_answer_becomes_a_json_rpc_error(server):
    """A wrong URL answers REST JSON ({"error": "No such route."}); stdout must still be JSON-RPC."""
    proc = bridge(server.url + "/nowhere/mcp", [PING, {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}])
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in replies(proc)}
    assert set(got) == {7, 8}
    for reply in got.values():
        assert reply["jsonrpc"] == "2.0" and set(reply) == {"jsonrpc", "id", "error"}
        assert reply["error"]["code"] == -32603
        assert "HTTP 404" in reply["error"]["message"] and "/nowhere/mcp" in reply["error"]["message"]


@pytest.mark.parametrize("line", ["[1,2,3]", "42", "{}", "null", '"x"', "[]"])
def test_what_is_no_request_gets_the_servers_error(server, line):
    """Issue 50, I1: the bridge said nothing to these, where /mcp answers -32600; it now forwards that answer."""
    direct = requests.post(server.mcp, data=line, timeout=20, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})
    expected = direct.json()
    assert (expected if isinstance(expected, list) else [expected])[0]["error"]["code"] == -32600, expected
    proc = bridge(server.mcp, [line])
    assert proc.returncode == 0, proc.stderr
    assert replies(proc) == [expected]


def test_shares_the_cli_variable_names(server):
    """CONTEXT_URL and CONTEXT_API_KEY, as `context-mode push/search/import` use them."""
    proc = bridge(None, [PING], key=None, env={"CONTEXT_URL": server.url, "CONTEXT_API_KEY": KEY})
    assert proc.returncode == 0, proc.stderr
    assert replies(proc) == [{"jsonrpc": "2.0", "id": 7, "result": {}}]
    assert b"deprecated" not in proc.stderr


def test_old_variable_names_still_work_with_a_warning_on_stderr(server):
    proc = bridge(None, [PING], key=None, env={"CONTEXT_MODE_MCP_URL": server.mcp, "CONTEXT_MODE_API_KEY": KEY})
    assert proc.returncode == 0, proc.stderr
    assert replies(proc) == [{"jsonrpc": "2.0", "id": 7, "result": {}}]
    assert b"CONTEXT_MODE_API_KEY is deprecated" in proc.stderr
    assert b"CONTEXT_MODE_MCP_URL is deprecated" in proc.stderr


def test_no_key_answers_json_rpc_errors(server):
    proc = bridge(server.url, [PING], key=None)
    assert proc.returncode == 0
    [reply] = replies(proc)
    assert reply["id"] == 7 and "error" in reply


def test_exits_cleanly_on_immediate_eof(server):
    proc = bridge(server.mcp, [])
    assert proc.returncode == 0 and proc.stdout == b""


def _expand(value: str, env: dict) -> str:
    """Claude Code's ${VAR} / ${VAR:-default} expansion, enough for our config file."""
    return re.sub(r"\$\{([A-Z_]+)(?::-([^}]*))?\}", lambda m: env.get(m.group(1), m.group(2) or ""), value)


def test_client_configs_point_at_the_endpoint_and_the_bridge(server):
    cursor = json.loads((ROOT / "clients" / ".cursor" / "mcp.json").read_text())["mcpServers"]
    vscode = json.loads((ROOT / "clients" / ".vscode" / "mcp.json").read_text())
    claude = json.loads((ROOT / "clients" / "claude-code" / ".mcp.json").read_text())["mcpServers"]
    assert cursor["context-mode"]["url"].endswith("/mcp")
    assert cursor["context-mode"]["headers"]["Authorization"] == "Bearer ${env:CONTEXT_API_KEY}"
    assert vscode["servers"]["context-mode"]["type"] == "http"
    assert {i["id"] for i in vscode["inputs"]} == {"context-mode-api-key"}
    assert vscode["servers"]["context-mode-stdio"]["type"] == "stdio"
    assert claude["context-mode"]["type"] == "http" and claude["context-mode-stdio"]["type"] == "stdio"
    for entry in (cursor["context-mode-stdio"], vscode["servers"]["context-mode-stdio"], claude["context-mode-stdio"]):
        assert entry["command"] == "context-mode" and entry["args"][:2] == ["mcp-stdio", "--url"]

    # Launch the Claude Code stdio entry as Claude Code would, against the live server.
    env = {"CONTEXT_URL": server.url, "CONTEXT_API_KEY": KEY}
    entry = claude["context-mode-stdio"]
    args = [_expand(a, env) for a in entry["args"]]
    child_env = {**os.environ, **{k: _expand(v, env) for k, v in entry["env"].items()}}
    proc = subprocess.run([str(context_mode_bin()), *args], env=child_env, capture_output=True, timeout=60,
                          input=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode() + b"\n")
    assert proc.returncode == 0, proc.stderr
    [reply] = replies(proc)
    assert {t["name"] for t in reply["result"]["tools"]} == {"context_search", "context_push", "context_forget",
                                                             "tool_search"}
    assert _expand(claude["context-mode"]["url"], env) == server.mcp
    assert "CONTEXT_MODE_" not in json.dumps([cursor, vscode, claude])     # the CLI's names everywhere


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """A server with one worker: every stream a test opens shares one hub, which hands an event to all
    of them in one look (with two, each worker's hub looks on its own and no stream's order binds another's)."""
    # a quiet stream hears a heartbeat every second: a stream the bridge closes ends within one, and so
    # does the bridge's exit (a read that waits for the server's next bytes holds the close)
    srv = start_server(tmp_path_factory, "mcp-stdio-one-worker", keys=KEYS, workers=1,
                       env={"CONTEXT_LISTEN_HEARTBEAT_S": "1"})
    yield srv
    srv.stop()


def test_a_listen_stream_through_the_bridge_and_its_cancellation(one_worker):
    """subscriptions/listen over stdio (issue 16): the bridge relays the stream's messages as lines, and the
    host's notifications/cancelled for the listen id closes it (on Streamable HTTP, closing is cancelling)."""
    import queue
    import threading

    import requests

    from conftest import make_unit
    from service.units import compute_cid

    def uri_of(unit: dict) -> str:
        return f"context://units/{compute_cid(unit['content'], unit['timestamp'], unit['source'])}"

    def sub_id(line: dict):
        return line.get("params", {}).get("_meta", {}).get("io.modelcontextprotocol/subscriptionId")

    def updated(line: dict, uri: str) -> bool:
        return line.get("method") == "notifications/resources/updated" and line["params"]["uri"] == uri

    server = one_worker
    u = make_unit("stdio listener unit ORD-3131", source="stdio_listen_v1")
    marker = make_unit("stdio listener marker ORD-3132", source="stdio_listen_v1")
    uri, marker_uri = uri_of(u), uri_of(marker)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_")}
    proc = subprocess.Popen([str(context_mode_bin()), "mcp-stdio", "--url", server.url, "--api-key", KEY],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(json.loads(x)) for x in proc.stdout], daemon=True).start()

    def send(msg):
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
    try:
        send({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen",
              "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": [uri]}}})
        ack = lines.get(timeout=15)
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": "sub-1"}
        send({"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": meta()}})
        assert lines.get(timeout=15)["id"] == 2            # other requests still flow beside the open stream
        requests.post(server.url + "/mcp/push", json=u, headers=server.headers(KEY), timeout=10).raise_for_status()
        update = lines.get(timeout=15)
        assert update["method"] == "notifications/resources/updated" and update["params"]["uri"] == uri
        # A second subscription, to the same unit and to a marker, hears what the cancelled one must not.
        send({"jsonrpc": "2.0", "id": "sub-2", "method": "subscriptions/listen",
              "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": [uri, marker_uri]}}})
        ack = lines.get(timeout=15)
        assert ack["method"] == "notifications/subscriptions/acknowledged" and sub_id(ack) == "sub-2"
        send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "sub-1"}})
        requests.post(server.url + "/mcp/push", json=dict(u, metadata={"v": 2}), headers=server.headers(KEY),
                      timeout=10).raise_for_status()
        send(dict(PING, id=3))
        pong = {"jsonrpc": "2.0", "id": 3, "result": {}}
        seen: list[dict] = []
        # the bridge reads its stdin in order (the ping is answered once the cancel is done), and sub-2
        # hearing the re-push says the server announced it to the listeners
        while not (pong in seen and any(updated(x, uri) for x in seen)):
            seen.append(lines.get(timeout=15))
        requests.post(server.url + "/mcp/push", json=marker, headers=server.headers(KEY), timeout=10).raise_for_status()
        while not updated(seen[-1], marker_uri):   # by the marker's update sub-1 would have spoken
            seen.append(lines.get(timeout=15))
        assert [sub_id(x) for x in seen if "method" in x] == ["sub-2", "sub-2"], seen   # nothing for sub-1
        send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "sub-2"}})
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0


def test_a_lone_surrogate_in_a_method_or_tool_name_is_answered(server):
    # json.dumps writes "\ud83d" as that escape: the host's line is valid JSON, its string no valid Unicode
    proc = bridge(server.mcp, [json.dumps(m) for m in (
        {"jsonrpc": "2.0", "id": 1, "method": "tools/\ud83dx"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "context_\ud83d", "arguments": {},
                                                                        "_meta": {PROTOCOL_KEY: "2026-07-28"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
    )])
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in replies(proc)}
    assert set(got) == {1, 2, 3}
    assert got[1]["error"]["code"] == -32600 and got[2]["error"]["code"] == -32600
    assert "result" in got[3] or got[3]["error"]["code"] != -32600


def test_a_line_over_the_cap_is_answered_and_read_in_bounded_chunks(server):
    import io
    from service.cli.stdio import Bridge
    out = io.BytesIO()
    ping = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping",
                       "params": {"_meta": {PROTOCOL_KEY: "2026-07-28"}}}).encode()
    long_line = b'{"jsonrpc": "2.0", "id": 6, "method": "ping", "params": {"pad": "' + b"x" * 5_000_000 + b'"}}'
    stdin = io.BytesIO(long_line + b"\n" + ping + b"\n")
    reads = []
    readline = stdin.readline
    stdin.readline = lambda size=-1: reads.append(size) or readline(size)
    Bridge(server.mcp, KEY, out, timeout=20).run(stdin, max_line=64 * 1024)
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    assert got[0] == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": got[0]["error"]["message"]}}
    assert "65536 bytes" in got[0]["error"]["message"]
    assert got[1]["id"] == 7 and got[1]["jsonrpc"] == "2.0"           # the next line was forwarded and answered
    assert all(0 < size <= 1024 * 1024 + 1 for size in reads)        # never an unbounded readline()
