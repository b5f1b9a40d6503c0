"""MCP subscriptions/listen (2026-07-28, issue 16) against a live gunicorn with 2 workers: the official
SDK client and raw HTTP. Listeners hear pushes taken by the *other* worker (found through /proc), and
updates are truthful: reading the URI after its event shows the change."""
from __future__ import annotations

import asyncio
import time

import pytest
import requests

from conftest import make_unit, store_env
from live_support import SUB_KEY, listen, method_of, push_via, stream, updated, worker_holding, workers_of
from mcp_support import LEGACY, McpServer, connect, rpc

KEY, ADMIN, OTHER = "listen-key-0123456789abcdef", "listen-admin-0123456789abcdef", "listen-other-0123456789abcdef"
PUSH_ONLY = "listen-push-0123456789abcdef"
LIMIT_A, LIMIT_B = "listen-limit-a-0123456789abcdef", "listen-limit-b-0123456789abcdef"
KEYS = {KEY: ("acme", ["push", "search"]), ADMIN: ("acme", ["push", "search", "admin"]),
        OTHER: ("globex", ["push", "search"]), PUSH_ONLY: ("acme", ["push"]),
        LIMIT_A: ("limits", ["search"]), LIMIT_B: ("limits", ["search"])}


# The shared server's tests run on both storage backends (issue 18): on PostgreSQL the feed, the change
# log, the stream slots and the registry are tables, and wake-ups come by LISTEN/NOTIFY (service/store/postgresql/live.py).
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_store_config):
    srv = McpServer(tmp_path_factory.mktemp("listen") / "data", keys=KEYS, env={
        **store_env(module_store_config), "CONTEXT_THREADS": "16", "CONTEXT_MAX_LISTENERS_PER_KEY": "3", "CONTEXT_MAX_LISTENERS_PER_TENANT": "4",
        "CONTEXT_MAX_SUBSCRIPTIONS": "5", "CONTEXT_LISTEN_HEARTBEAT_S": "1", "CONTEXT_RATE_LIMIT": "off"}).start()
    yield srv
    srv.stop()


def unit(content: str, **kw) -> dict:
    return make_unit(content, source="listen_test_v1", **kw)


def cid_of(u: dict) -> str:
    from service.units import compute_cid
    return compute_cid(u["content"], u["timestamp"], u["source"])


def ack_of(sse, request_id) -> dict:
    first = sse.next()
    assert method_of(first) == "notifications/subscriptions/acknowledged", first
    assert first["data"]["params"]["_meta"] == {SUB_KEY: request_id}
    assert "id" not in first["data"] and first["id"] is None        # no SSE ids: 2026-07-28 streams do not resume
    return first["data"]["params"]["notifications"]


@pytest.mark.sqlite_only            # no storage involved: one backend is enough (CI time)
def test_capabilities_are_truthful_in_both_revisions(server):
    modern = rpc(server, "server/discover", key=KEY).json()["result"]["capabilities"]["resources"]
    assert modern == {"subscribe": True, "listChanged": True}
    legacy = rpc(server, "initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                        "clientInfo": {"name": "t", "version": "1"}}, era=None, key=KEY)
    assert legacy.json()["result"]["capabilities"]["resources"] == {"subscribe": False, "listChanged": False}
    # 2025-11-25 has neither subscriptions/listen nor its own session-based subscribe here
    for method in ("subscriptions/listen", "resources/subscribe"):
        rv = rpc(server, method, {"notifications": {}} if "listen" in method else {"uri": "context://units/x"},
                 era=LEGACY, key=KEY)
        assert rv.json()["error"]["code"] == -32601, rv.text


@pytest.mark.sqlite_only            # no storage involved: one backend is enough (CI time)
def test_ack_holds_only_what_is_accepted(server):
    uris = ["context://units/0123456789ab", "context://search/ORD-7890%20shipped", "context://tools/get_weather",
            "context://units/NOT-A-CID", "file:///etc/passwd"]
    sse = listen(server, {"resourcesListChanged": True, "toolsListChanged": True, "promptsListChanged": True,
                          "resourceSubscriptions": uris}, key=KEY, id=42)
    try:
        assert sse.status == 200 and sse.headers["Content-Type"].startswith("text/event-stream")
        assert sse.headers.get("X-Accel-Buffering") == "no"
        honored = ack_of(sse, 42)
        assert honored == {"resourcesListChanged": True, "resourceSubscriptions": uris[:3]}
    finally:
        sse.close()


def test_a_listener_hears_a_unit_pushed_through_the_other_worker(server):
    u = unit("cross worker delivery ORD-4242")
    uri = f"context://units/{cid_of(u)}"
    sse = listen(server, {"resourcesListChanged": True, "resourceSubscriptions": [uri]}, key=KEY, id="x-1")
    try:
        ack_of(sse, "x-1")
        listener_worker = worker_holding(sse.sock, workers_of(server))
        assert listener_worker is not None
        acked, push_worker = push_via(server, u, avoid=listener_worker, key=KEY)
        assert push_worker != listener_worker and acked["cid"] == cid_of(u)
        events = sse.until(updated(uri))
        assert all(e["data"]["params"]["_meta"] == {SUB_KEY: "x-1"} for e in events)
        assert any(method_of(e) == "notifications/resources/list_changed" for e in sse.quiet(1.0) + events)
        # the update is truthful: the resource now reads as the pushed unit
        read = rpc(server, "resources/read", {"uri": uri}, key=KEY).json()["result"]
        assert read["contents"][0]["text"] == u["content"]
    finally:
        sse.close()


def test_re_push_delete_and_search_updates(server):
    u = unit("listenword release notes for the ORD-5151 rollout", ttl=3600)
    uri, search = f"context://units/{cid_of(u)}", "context://search/listenword"
    sse = listen(server, {"resourceSubscriptions": [uri, search]}, key=KEY, id=7)
    try:
        ack_of(sse, 7)
        requests.post(server.url + "/mcp/push", json=u, headers=server.headers(KEY), timeout=10).raise_for_status()
        seen = sse.until(lambda e: updated(search)(e), timeout=20)
        # the search update is truthful too: reading the search URI now shows the new unit
        read = rpc(server, "resources/read", {"uri": search}, key=KEY).json()["result"]
        assert f"context://units/{cid_of(u)}" in read["contents"][0]["text"]
        assert any(updated(uri)(e) for e in seen + sse.quiet(0.5))
        # a re-push changing its metadata is an update of the unit and of the search that shows it
        requests.post(server.url + "/mcp/push", json=dict(u, metadata={"rev": 2}), headers=server.headers(KEY),
                      timeout=10).raise_for_status()
        got = sse.until(updated(uri))
        got += sse.quiet(1.0)
        assert any(updated(search)(e) for e in got)
        # deleting it (admin) is one too
        requests.delete(f"{server.url}/mcp/units/{cid_of(u)}", headers=server.headers(ADMIN), timeout=10)\
            .raise_for_status()
        sse.until(updated(uri))
    finally:
        sse.close()


def test_a_unit_that_expires_is_an_update(server):
    u = unit("short lived unit for the expiry event", ttl=3, timestamp=int(time.time()))
    uri = f"context://units/{cid_of(u)}"
    requests.post(server.url + "/mcp/push", json=u, headers=server.headers(KEY), timeout=10).raise_for_status()
    sse = listen(server, {"resourceSubscriptions": [uri]}, key=KEY, id=8)
    try:
        ack_of(sse, 8)
        sse.until(updated(uri), timeout=10)
        assert rpc(server, "resources/read", {"uri": uri}, key=KEY).json()["error"]["code"] == -32602
    finally:
        sse.close()


def test_tool_registry_changes_are_updates(server):
    uri = "context://tools/listen_probe_tool"
    sse = listen(server, {"resourceSubscriptions": [uri]}, key=KEY, id=9)
    tool = {"name": "listen_probe_tool", "description": "A probe", "input_schema": {"type": "object"}}
    try:
        ack_of(sse, 9)
        requests.post(server.url + "/mcp/tools", json=tool, headers=server.headers(ADMIN), timeout=10).raise_for_status()
        sse.until(updated(uri))
        requests.put(server.url + "/mcp/tools/listen_probe_tool", json=dict(tool, description="A better probe"),
                     headers=server.headers(ADMIN), timeout=10).raise_for_status()
        sse.until(updated(uri))
        read = rpc(server, "resources/read", {"uri": uri}, key=KEY).json()["result"]["contents"][0]
        assert read["mimeType"] == "application/json" and "A better probe" in read["text"]
        requests.delete(server.url + "/mcp/tools/listen_probe_tool", headers=server.headers(ADMIN), timeout=10)
        sse.until(updated(uri))
    finally:
        sse.close()


def test_bulk_forget_and_stats_are_heard(server):
    """Units forgotten in bulk (issue 15's POST /mcp/forget) are updates too; context://stats changes with
    every stored or forgotten unit."""
    units = [unit(f"zzforgetme bulk unit {i}") for i in range(2)]
    for u in units:
        requests.post(server.url + "/mcp/push", json=u, headers=server.headers(KEY), timeout=10).raise_for_status()
    uri = f"context://units/{cid_of(units[0])}"
    sse = listen(server, {"resourcesListChanged": True, "resourceSubscriptions": [uri, "context://stats"]},
                 key=KEY, id="fg")
    try:
        assert ack_of(sse, "fg")["resourceSubscriptions"] == [uri, "context://stats"]
        body = {"query": "zzforgetme"}
        dry = requests.post(server.url + "/mcp/forget", json=body, headers=server.headers(ADMIN), timeout=10).json()
        assert dry["count"] == 2
        done = requests.post(server.url + "/mcp/forget", json=dict(body, confirm=dry["confirm"]),
                             headers=server.headers(ADMIN), timeout=10).json()
        assert done["forgotten"] == 2
        events = sse.until(updated(uri)) + sse.quiet(1.0)
        assert any(updated("context://stats")(e) for e in events)
        assert any(method_of(e) == "notifications/resources/list_changed" for e in events)
        # a new unit changes the stats too
        requests.post(server.url + "/mcp/push", json=unit("after the forget"), headers=server.headers(KEY),
                      timeout=10).raise_for_status()
        sse.until(updated("context://stats"))
    finally:
        sse.close()


def test_tenants_hear_only_their_own_changes(server):
    u = unit("same unit pushed by another tenant", timestamp=int(time.time()))
    uri = f"context://units/{cid_of(u)}"
    marker = unit("acme marker after the foreign push")
    marker_uri = f"context://units/{cid_of(marker)}"
    sse = listen(server, {"resourcesListChanged": True, "resourceSubscriptions": [uri, marker_uri]}, key=KEY, id=10)
    try:
        ack_of(sse, 10)
        requests.post(server.url + "/mcp/push", json=u, headers=server.headers(OTHER), timeout=10).raise_for_status()
        time.sleep(0.5)
        requests.post(server.url + "/mcp/push", json=marker, headers=server.headers(KEY), timeout=10)\
            .raise_for_status()
        events = sse.until(updated(marker_uri)) + sse.quiet(1.5)
        assert not any(updated(uri)(e) for e in events), events
        # ... and exactly one list change, from acme's own push
        assert sum(method_of(e) == "notifications/resources/list_changed" for e in events) == 1
    finally:
        sse.close()


@pytest.mark.sqlite_only            # no storage involved: one backend is enough (CI time)
def test_errors_are_clear_json_rpc(server):
    # a key without the search scope
    sse = listen(server, {"resourcesListChanged": True}, key=PUSH_ONLY, id=11)
    assert sse.status == 403 and sse.body["error"]["code"] == -32011 and sse.body["id"] == 11
    # too many subscriptions in one listen
    many = [f"context://units/{i:012x}" for i in range(6)]
    sse = listen(server, {"resourceSubscriptions": many}, key=KEY, id=12)
    assert sse.status == 400 and sse.body["error"]["code"] == -32602
    assert sse.body["error"]["data"] == {"max_subscriptions": 5}
    # a filter that is not one
    sse = listen(server, {"resourceSubscriptions": "context://units/0123456789ab"}, key=KEY, id=13)
    assert sse.status == 400 and sse.body["error"]["code"] == -32602
    # no credentials at all
    sse = listen(server, {"resourcesListChanged": True}, id=14)
    assert sse.status == 401


def test_limits_per_key_and_per_tenant_and_closing_frees_a_slot(server):
    opened = []
    try:
        for i in range(3):
            sse = listen(server, {"resourcesListChanged": True}, key=LIMIT_A, id=f"a{i}")
            ack_of(sse, f"a{i}")
            opened.append(sse)
        refused = listen(server, {"resourcesListChanged": True}, key=LIMIT_A, id="a3")
        assert refused.status == 429, refused.body
        assert refused.body["error"]["code"] == -32012 and refused.body["error"]["data"] == {"scope": "key", "limit": 3}
        b = listen(server, {"resourcesListChanged": True}, key=LIMIT_B, id="b0")
        ack_of(b, "b0")
        opened.append(b)
        refused = listen(server, {"resourcesListChanged": True}, key=LIMIT_B, id="b1")
        assert refused.status == 429 and refused.body["error"]["data"] == {"scope": "tenant", "limit": 4}
        # closing a stream cancels it: its slot is free again within a few seconds, whichever worker held it
        opened.pop(0).close()
        deadline = time.monotonic() + 10
        while True:
            again = listen(server, {"resourcesListChanged": True}, key=LIMIT_B, id="b2")
            if again.status == 200:
                ack_of(again, "b2")
                opened.append(again)
                break
            assert again.status == 429 and time.monotonic() < deadline, again.body
            time.sleep(0.2)
    finally:
        for sse in opened:
            sse.close()


def test_official_sdk_client_listens_across_workers(server):
    """mcp's Client.listen(): acknowledged subset, then events for units pushed through both workers."""
    from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated
    pushes = [unit(f"sdk listener unit {i} ORD-{7000 + i}") for i in range(6)]
    uris = [f"context://units/{cid_of(u)}" for u in pushes]
    workers = workers_of(server)

    async def body():
        async with connect(server, "http-auto", key=KEY) as client:
            async with client.listen(resources_list_changed=True, resource_subscriptions=uris[:4] + ["bad://x"]) as sub:
                assert sub.honored.resource_subscriptions == uris[:4] and sub.honored.resources_list_changed
                # half through each worker: whichever holds the stream, some pushes come from the other one
                landed = await asyncio.to_thread(
                    lambda: [push_via(server, u, worker=workers[i % 2], key=KEY)[1] for i, u in enumerate(pushes)])
                assert set(landed) == set(workers)
                got: set[str] = set()
                lists = 0
                async with asyncio.timeout(20):
                    async for event in sub:
                        if isinstance(event, ResourceUpdated):
                            got.add(event.uri)
                        elif isinstance(event, ResourcesListChanged):
                            lists += 1
                        if got >= set(uris[:4]) and lists:
                            break
                assert got == set(uris[:4])          # the unsubscribed units 5 and 6 were not announced
                read = await client.read_resource(uris[0])
                assert read.contents[0].text == pushes[0]["content"]
    asyncio.run(body())


def test_sdk_sees_a_graceful_end_as_the_end_of_the_loop(tmp_path):
    """The server's final result (idle limit) ends the SDK's iteration without SubscriptionLost."""
    srv = McpServer(tmp_path / "data", workers=1, keys=KEYS, env={"CONTEXT_LISTEN_IDLE_S": "1.5"}).start()
    try:
        async def body():
            async with connect(srv, "http-auto", key=KEY) as client:
                async with client.listen(resources_list_changed=True) as sub:
                    start = time.monotonic()
                    async with asyncio.timeout(15):
                        events = [e async for e in sub]
                    assert events == [] and time.monotonic() - start >= 1.0
        asyncio.run(body())
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def short_server(tmp_path_factory):
    """Tight slow-client guard (1 s silence, 2 s per request), quick heartbeats and idle limit."""
    srv = McpServer(tmp_path_factory.mktemp("listen-short") / "data", keys=KEYS, env={
        "CONTEXT_READ_TIMEOUT_S": "1", "CONTEXT_REQUEST_DEADLINE_S": "2", "CONTEXT_LISTEN_HEARTBEAT_S": "0.5",
        "CONTEXT_LISTEN_IDLE_S": "5"}).start()
    yield srv
    srv.stop()


def test_streams_outlive_the_slow_client_guard_and_send_heartbeats(short_server):
    """A legitimate stream is no slow client: it lives past the request deadline, gets an event pushed
    after it, and quiet moments carry SSE comments."""
    u = unit("pushed after the request deadline passed")
    uri = f"context://units/{cid_of(u)}"
    sse = listen(short_server, {"resourceSubscriptions": [uri]}, key=KEY, id="g")
    try:
        ack_of(sse, "g")
        start = time.monotonic()
        beats = 0
        while time.monotonic() - start < 3.0:
            item = sse.next(2.0, comments=True)
            assert item is not None and "comment" in item, item
            beats += 1
        assert beats >= 3
        requests.post(short_server.url + "/mcp/push", json=u, headers=short_server.headers(KEY),
                      timeout=10).raise_for_status()
        sse.until(updated(uri), timeout=10)
    finally:
        sse.close()


def test_idle_limit_ends_with_a_complete_result(short_server):
    sse = listen(short_server, {"resourcesListChanged": True}, key=KEY, id="idle")
    ack_of(sse, "idle")
    start = time.monotonic()
    last = sse.until(lambda e: "result" in e["data"], timeout=15)[-1]["data"]
    assert time.monotonic() - start >= 4.0
    assert last == {"jsonrpc": "2.0", "id": "idle",
                    "result": {"_meta": {SUB_KEY: "idle"}, "resultType": "complete"}}
    assert sse.next(5) is None                   # and the stream ends there
    sse.close()


def test_streams_cannot_starve_workers_and_end_gracefully_on_shutdown(tmp_path):
    """2 workers x 4 threads, at most 2 streams each: the 5th stream is refused (503, retry later)
    while requests are still served; stopping gunicorn ends every stream with its final message.
    (One tenant may hold every slot here: the fair shares are tests/test_fair_shares.py's.)"""
    srv = McpServer(tmp_path / "data", keys=KEYS, env={"CONTEXT_THREADS": "4", "CONTEXT_MAX_STREAMS": "2",
                                                       "CONTEXT_STREAM_SHARE": "2"}).start()
    opened = []
    try:
        # Which worker accepts a connection is the kernel's choice, and a worker still starting
        # accepts none: retry for a while (bounded in time) rather than a fixed number of times.
        deadline = time.monotonic() + 60
        while len(opened) < 4:
            assert time.monotonic() < deadline, f"only {len(opened)} of 4 streams opened in 60 s"
            sse = listen(srv, {"resourcesListChanged": True}, key=KEY, id=f"s{len(opened)}") if len(opened) % 2 \
                else stream(srv, "query=anything", key=KEY)
            if sse.status == 200:
                opened.append(sse)
            else:
                assert sse.status == 503, sse.body     # this worker is full; the next connection may not be
                sse.conn.close()
                time.sleep(0.05)
        for _ in range(3):
            refused = listen(srv, {"resourcesListChanged": True}, key=ADMIN, id="full")
            assert refused.status == 503 and refused.headers.get("Retry-After")
            assert refused.body["error"]["code"] == -32012 and refused.body["error"]["data"]["scope"] == "server"
            rest = stream(srv, "", key=ADMIN)
            assert rest.status == 503 and rest.body["code"] == "too_many_streams"
        # every thread that is not a stream still answers requests
        for _ in range(8):
            assert requests.get(srv.url + "/healthz", timeout=5).status_code == 200
            assert requests.post(srv.url + "/mcp/search", json={"query": "x"}, headers=srv.headers(KEY),
                                 timeout=5).status_code == 200
        srv.stop()
        for sse in opened:
            events = sse.quiet(5)
            final = [e for e in events if e.get("event") == "end" or (isinstance(e["data"], dict) and "result" in e["data"])]
            assert final, events
            if final[0].get("event") == "end":
                assert final[0]["data"] == {"reason": "shutdown"}
            else:
                assert final[0]["data"]["result"]["resultType"] == "complete"
    finally:
        for sse in opened:
            sse.close()
        srv.stop()
