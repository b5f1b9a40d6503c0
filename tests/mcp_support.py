"""Shared helpers for the MCP tests (imported by tests/test_mcp_*.py and others; no tests here, hence no
``test_`` prefix).

One gunicorn per test module keeps the MCP suite fast; the helpers speak raw JSON-RPC with
requests where a test must control every header and byte, and ``connect`` opens the official MCP
Python SDK's client over Streamable HTTP or the stdio bridge.
"""
from __future__ import annotations

import base64
import json
import time
from contextlib import asynccontextmanager
from pathlib import Path

import requests
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import VENV_BIN, LiveServer, free_port, make_unit

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
KEY, OTHER_KEY, PUSH_ONLY_KEY = "mcp-test-key-0123456789abcdef", "mcp-other-key-0123456789abcdef", "mcp-push-only-0123456789abcdef"
KEYS = {KEY: ("acme", ["push", "search"]), OTHER_KEY: ("globex", ["push", "search"]),
        PUSH_ONLY_KEY: ("acme", ["push"])}


class McpServer(LiveServer):
    """A live gunicorn with the MCP endpoint's URL at hand."""

    @property
    def mcp(self) -> str:
        return self.url + "/mcp"


def start_server(tmp_path_factory, name: str, **kw) -> McpServer:
    base = tmp_path_factory.mktemp(name)
    return McpServer(base / "data", **kw).start()


def meta(version: str = MODERN) -> dict:
    return {"io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"}}


def rpc(server: McpServer, method: str, params: dict | None = None, *, era: str = MODERN, key: str | None = None,
        id=1, headers: dict | None = None) -> requests.Response:
    """POST one request the way a conforming client of ``era`` would (headers mirrored for 2026-07-28)."""
    body: dict = {"jsonrpc": "2.0", "id": id, "method": method}
    params = dict(params or {})
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    if era == MODERN:
        params["_meta"] = {**meta(), **params.get("_meta", {})}
        h.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": method})
        name = params.get("uri") if method == "resources/read" else params.get("name")
        if isinstance(name, str) and method in ("resources/read", "tools/call", "prompts/get"):
            h["Mcp-Name"] = name if name.isascii() and name.isprintable() else \
                "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
    elif era:
        h["MCP-Protocol-Version"] = era
    if params:
        body["params"] = params
    h.update(headers or {})
    return requests.post(server.mcp, data=json.dumps(body), headers=h, timeout=30)


def post_raw(server: McpServer, data: bytes | str, headers: dict | None = None, key: str | None = None):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    return requests.post(server.mcp, data=data, headers=h, timeout=30)


def push(server: McpServer, content: str, key: str | None = KEY, **fields) -> dict:
    rv = requests.post(server.url + "/mcp/push", json=make_unit(content, **fields),
                       headers=server.headers(key), timeout=30)
    assert rv.status_code == 200, rv.text
    return rv.json()


def wait_searchable(server: McpServer, query: str, cids: set[str], key: str | None = KEY, timeout: float = 20) -> None:
    """Wait until the default (replica) search sees every CID: resources and prompts search the replica."""
    h = server.headers(key)
    requests.post(server.url + "/mcp/search", json={"query": query, "consistency": "strong"}, headers=h,
                  timeout=30).raise_for_status()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rv = requests.post(server.url + "/mcp/search", json={"query": query, "top_k": 100}, headers=h, timeout=30)
        if cids <= {r["cid"] for r in rv.json()["results"]}:
            return
        time.sleep(0.1)
    raise AssertionError(f"replica search for {query!r} never returned {cids}")


def free_port_url() -> str:
    """An MCP URL nobody listens on."""
    return f"http://127.0.0.1:{free_port()}/mcp"


def context_mode_bin() -> Path:
    return VENV_BIN / "context-mode"


@asynccontextmanager
async def connect(server: McpServer, conn: str, key: str = KEY):
    """The SDK's client, connected: ``conn`` is ``{http|stdio}-{auto|legacy}`` (auto: 2026-07-28's
    server/discover; legacy: the 2025-11-25 initialize handshake)."""
    transport, mode = conn.split("-")
    if transport == "stdio":
        params = StdioServerParameters(command=str(context_mode_bin()),
                                       args=["mcp-stdio", "--url", server.mcp, "--api-key", key])
        async with Client(params, mode=mode) as client:
            yield client
        return
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(server.mcp, http_client=http), mode=mode) as client:
            yield client
