"""Live context across service nodes on one PostgreSQL (issue 16's streams on issue 18's backend).

Two gunicorn servers (two "nodes", 2 workers each, their own data directories) share one primary and
standby. Whatever one node changes, listeners on the other hear: MCP subscriptions/listen (raw HTTP and
the official SDK client), GET /mcp/stream with its Last-Event-ID resume taken to the other node, the tool
registry, and the stream limits counted over both. NOTIFY only wakes: a listening connection killed
by PostgreSQL loses nothing (service/store/postgresql/live.py).
"""
from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
import requests

from conftest import make_unit, store_env
from live_support import SUB_KEY, listen, method_of, stream, updated
from mcp_support import McpServer, connect, rpc

KEY, ADMIN = "nodes-key-0123456789abcdef", "nodes-admin-0123456789abcdef"
OTHER = "nodes-other-0123456789abcdef"
KEYS = {KEY: ("acme", ["push", "search"]), ADMIN: ("acme", ["push", "search", "admin"]),
        OTHER: ("globex", ["push", "search"])}
TOOL = {"name": "ship_tracker", "description": "Track where a parcel is and when it will be delivered.",
        "auth_type": "none", "input_schema": {"type": "object", "properties": {"tracking_id": {"type": "string"}}}}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, pg_cluster):
    """Two servers on one schema: (a, b)."""
    from conftest import pg_schema
    with pg_schema(pg_cluster) as (primary, standby):
        env = {**store_env({"store": primary, "store_replica": standby}), "CONTEXT_RATE_LIMIT": "off",
               "CONTEXT_THREADS": "12", "CONTEXT_MAX_LISTENERS_PER_TENANT": "6", "CONTEXT_LISTEN_HEARTBEAT_S": "1",
               # one worker may hold all of its 6 stream slots for one tenant/key: the limit under test is the
               # tenant's across both nodes, not a worker's fair share (which worker accepts is up to the kernel)
               "CONTEXT_STREAM_SHARE": "6", "CONTEXT_STREAM_KEY_SHARE": "6",
               # no look without a wake-up within any test's wait: only NOTIFY (or a reconnect) delivers here
               "CONTEXT_LISTEN_POLL_MS": "120000"}
        servers = []
        try:
            for name in ("node-a", "node-b"):
                servers.append(McpServer(tmp_path_factory.mktemp(name) / "data", keys=KEYS, env=env).start())
            yield servers[0], servers[1]
        finally:
            for s in servers:
                s.stop()


def unit(content: str, **kw) -> dict:
    return make_unit(content, source="nodes_test_v1", **kw)


def cid_of(u: dict) -> str:
    from service.units import compute_cid
    return compute_cid(u["content"], u["timestamp"], u["source"])


def push(node, u: dict, key: str = KEY) -> dict:
    rv = requests.post(node.url + "/mcp/push", json=u, headers=node.headers(key), timeout=10)
    assert rv.status_code == 200, rv.text
    return rv.json()


def listening(node, notifications: dict, *, key: str = KEY, id="L1"):
    """listen(), retried while the tenant is at its limit (earlier tests' closed streams free their slots
    within ~1 s)."""
    deadline = time.monotonic() + 15
    while True:
        sse = listen(node, notifications, key=key, id=id)
        if sse.status != 429 or time.monotonic() > deadline:
            assert sse.status == 200, sse.body
            return sse
        time.sleep(0.2)


def acked(sse, request_id) -> dict:
    first = sse.next()
    assert method_of(first) == "notifications/subscriptions/acknowledged", first
    return first["data"]["params"]["notifications"]


def test_a_listener_on_one_node_hears_changes_made_on_the_other(nodes):
    a, b = nodes
    u = unit("nodewide delivery of the ORD-8181 parcel")
    uri, search = f"context://units/{cid_of(u)}", "context://search/nodewide"
    sse = listening(a, {"resourcesListChanged": True,
                        "resourceSubscriptions": [uri, search, "context://tools/ship_tracker"]}, id="n1")
    feed = stream(a, "query=nodewide", key=KEY)
    try:
        assert acked(sse, "n1")["resourceSubscriptions"] == [uri, search, "context://tools/ship_tracker"]
        first = push(b, u)
        assert first["status"] == "ok"
        seen = sse.until(updated(uri))
        seen += sse.until(updated(search)) if not any(updated(search)(e) for e in seen) else []
        assert all(e["data"]["params"]["_meta"] == {SUB_KEY: "n1"} for e in seen)
        # truthful: node a reads the unit and the search shows it
        assert rpc(a, "resources/read", {"uri": uri}, key=KEY).json()["result"]["contents"][0]["text"] == u["content"]
        assert uri in rpc(a, "resources/read", {"uri": search}, key=KEY).json()["result"]["contents"][0]["text"]
        got = feed.until(lambda e: e.get("event") == "unit")
        assert got[-1]["data"]["cid"] == cid_of(u) and int(got[-1]["id"]) == first["seq"]
        # a re-push on b that changes the unit, then a delete on b: updates on a
        assert push(b, dict(u, metadata={"rev": 2}))["status"] == "duplicate"
        sse.until(updated(uri))
        requests.delete(f"{b.url}/mcp/units/{cid_of(u)}", headers=b.headers(ADMIN), timeout=10).raise_for_status()
        sse.until(updated(uri))
        # the tool registry: registered on b, heard and found on a
        requests.post(b.url + "/mcp/tools", json=TOOL, headers=b.headers(ADMIN), timeout=10).raise_for_status()
        sse.until(updated("context://tools/ship_tracker"))
        found = requests.get(a.url + "/mcp/tools", params={"q": "where is my parcel"}, headers=a.headers(KEY),
                             timeout=10).json()["tools"]
        assert found[0]["name"] == "ship_tracker" and found[0]["input_schema"] == TOOL["input_schema"]
        requests.delete(b.url + "/mcp/tools/ship_tracker", headers=b.headers(ADMIN), timeout=10).raise_for_status()
        sse.until(updated("context://tools/ship_tracker"))
    finally:
        sse.close()
        feed.close()


def test_the_stream_resumes_on_the_other_node_without_loss(nodes):
    a, b = nodes
    first = stream(a, "query=resumeword", key=KEY)
    try:
        one = push(b, unit("resumeword first unit"))
        got = first.until(lambda e: e.get("event") == "unit")
        last = int(got[-1]["id"])
        assert last == one["seq"]
    finally:
        first.close()
    # disconnected: more units through both nodes, some not matching
    later = [push(n, unit(f"resumeword later unit {i}" if i % 3 else f"unrelated later unit {i}"))
             for i, n in enumerate([a, b] * 3)]
    wanted = [r["seq"] for i, r in enumerate(later) if i % 3]
    again = stream(b, "query=resumeword", key=KEY, last_event_id=last)
    try:
        ids = []
        while len(ids) < len(wanted):
            ids += [int(e["id"]) for e in again.until(lambda e: e.get("event") == "unit")
                    if e.get("event") == "unit"]
        assert ids == wanted
        assert [e for e in again.quiet(1.0) if e.get("event") == "unit"] == []
    finally:
        again.close()


def test_the_official_sdk_client_on_one_node_hears_pushes_on_the_other(nodes):
    from mcp.client.subscriptions import ResourceUpdated
    a, b = nodes
    pushes = [unit(f"sdk across nodes unit {i}") for i in range(4)]
    uris = [f"context://units/{cid_of(u)}" for u in pushes]

    async def body():
        async with connect(a, "http-auto", key=KEY) as client:
            async with client.listen(resource_subscriptions=uris) as sub:
                assert sub.honored.resource_subscriptions == uris
                await asyncio.to_thread(lambda: [push(b, u) for u in pushes])
                got: set[str] = set()
                async with asyncio.timeout(20):
                    async for event in sub:
                        if isinstance(event, ResourceUpdated):
                            got.add(event.uri)
                        if got == set(uris):
                            break
                assert got == set(uris)
    asyncio.run(body())


def test_limits_count_the_streams_of_both_nodes(nodes):
    a, b = nodes
    opened = []
    try:
        for i in range(6):
            sse = listening((a, b)[i % 2], {"resourcesListChanged": True}, id=f"l{i}")
            acked(sse, f"l{i}")
            opened.append(sse)
        for node in (a, b):
            refused = listen(node, {"resourcesListChanged": True}, key=KEY, id="over")
            assert refused.status == 429, refused.body
            assert refused.body["error"]["data"] == {"scope": "tenant", "limit": 6}
        other = listen(b, {"resourcesListChanged": True}, key=OTHER, id="g1")     # another tenant: its own count
        acked(other, "g1")
        opened.append(other)
    finally:
        for sse in opened:
            sse.close()


def test_a_killed_listening_connection_loses_nothing(nodes, pg_cluster):
    """PostgreSQL ends node a's listening connections; a push on b meanwhile is still heard (the hub
    reconnects and reads the tables from where it was: NOTIFY only wakes)."""
    a, b = nodes
    u = unit("heard after the listening connection was killed")
    uri = f"context://units/{cid_of(u)}"
    sse = listening(a, {"resourceSubscriptions": [uri]}, id="k1")
    try:
        acked(sse, "k1")
        with psycopg.connect(pg_cluster.primary_url, autocommit=True) as c:
            deadline = time.monotonic() + 10
            while not c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cms-live'"
                                ).fetchone()[0]:
                assert time.monotonic() < deadline, "no listening connection"
                time.sleep(0.05)
            killed = {r[0] for r in c.execute(
                "WITH live AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE application_name = 'cms-live') "
                "SELECT pid FROM live WHERE pg_terminate_backend(pid)")}
            assert killed
            push(b, u)
            sse.until(updated(uri), timeout=20)
            # heard through a new listening connection of node a's hub (nodes' looks are 2 minutes apart)
            now = {r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'cms-live'")}
            assert now and not now & killed
    finally:
        sse.close()
