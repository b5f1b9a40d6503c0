"""GET /mcp/stream (issue 16): new matching units as SSE, resumable with Last-Event-ID, against a live
gunicorn with 2 workers; raw HTTP and the Python client (iterator and callback)."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from conftest import LiveServer, make_unit, store_env
from live_support import push_via, stream, workers_of

KEY, OTHER, PUSH_ONLY = "stream-key-0123456789abcdef", "stream-other-0123456789abcdef", "stream-push-0123456789abcdef"
KEYS = {KEY: ("acme", ["push", "search"]), OTHER: ("globex", ["push", "search"]), PUSH_ONLY: ("acme", ["push"])}


def start(tmp_path_factory, name: str, **env) -> LiveServer:
    return LiveServer(tmp_path_factory.mktemp(name) / "data", keys=KEYS, env={"CONTEXT_RATE_LIMIT": "off", **env}).start()


# The shared server's tests run on both storage backends (issue 18): on PostgreSQL the feed is the
# catalog table and wake-ups come by LISTEN/NOTIFY (service/store/postgresql/live.py); the idle server's are the hub's alone.
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_store_config):
    srv = start(tmp_path_factory, "stream", CONTEXT_THREADS="12", **store_env(module_store_config))
    yield srv
    srv.stop()


def push(server, content: str, key: str = KEY, **kw) -> dict:
    rv = requests.post(server.url + "/mcp/push", json=make_unit(content, **kw), headers=server.headers(key), timeout=10)
    assert rv.status_code == 200, rv.text
    return rv.json()


def units_of(events) -> list[dict]:
    return [e for e in events if e.get("event") == "unit"]


def test_matching_units_arrive_in_seq_order_with_their_seq_as_id(server):
    sse = stream(server, "query=alphastream&types=tool_output,user_input&source=strm_*", key=KEY)
    try:
        assert sse.status == 200 and sse.headers["Content-Type"].startswith("text/event-stream")
        wanted = [push(server, "alphastream one", source="strm_a_v1"),
                  push(server, "alphastream two", type="user_input", source="strm_b_v1")]
        push(server, "alphastream but a notice", type="system_notice", source="strm_a_v1")   # type filtered
        push(server, "alphastream from elsewhere", source="other_v1")                         # source filtered
        push(server, "no matching word", source="strm_a_v1")                                  # query filtered
        push(server, "alphastream foreign", key=OTHER, source="strm_a_v1")                    # other tenant
        wanted.append(push(server, "alphastream three", source="strm_c_v1"))
        got = units_of(sse.until(lambda e: e.get("event") == "unit" and e["data"]["cid"] == wanted[-1]["cid"]))
        got += units_of(sse.quiet(1.0))
        assert [e["data"]["cid"] for e in got] == [w["cid"] for w in wanted]
        assert [int(e["id"]) for e in got] == [w["seq"] for w in wanted] == sorted(w["seq"] for w in wanted)
        first = got[0]["data"]
        assert first["uri"] == f"context://units/{first['cid']}" and first["content"] == "alphastream one"
        assert first["seq"] == wanted[0]["seq"] and first["type"] == "tool_output"
    finally:
        sse.close()


def test_resume_after_a_reconnect_loses_nothing_and_repeats_nothing(server):
    sse = stream(server, "query=resumeword", key=KEY)
    first = [push(server, f"resumeword early {i}") for i in range(3)]
    got = units_of(sse.until(lambda e: e.get("event") == "unit" and e["data"]["cid"] == first[-1]["cid"]))
    last_id = got[-1]["id"]
    assert [e["data"]["cid"] for e in got] == [u["cid"] for u in first]
    sse.close()
    # while nobody listens: units through both workers, and one that does not match
    workers = workers_of(server)
    missed = []
    for i in range(4):
        ack, _ = push_via(server, make_unit(f"resumeword missed {i}"), worker=workers[i % 2], key=KEY)
        missed.append(ack)
    push(server, "unrelated text")
    again = stream(server, "query=resumeword", key=KEY, last_event_id=last_id)
    try:
        got = units_of(again.until(lambda e: e.get("event") == "unit" and e["data"]["cid"] == missed[-1]["cid"]))
        got += units_of(again.quiet(1.0))
        assert [e["data"]["cid"] for e in got] == [u["cid"] for u in missed]
        # and it keeps going live after the replay
        live = push(server, "resumeword live")
        assert units_of(again.until(lambda e: e.get("event") == "unit"))[-1]["data"]["cid"] == live["cid"]
    finally:
        again.close()
    # last_event_id as a query parameter does the same (EventSource cannot set headers on its first connect)
    q = stream(server, f"query=resumeword&last_event_id={last_id}", key=KEY)
    try:
        assert units_of(q.until(lambda e: e.get("event") == "unit"))[0]["data"]["cid"] == missed[0]["cid"]
    finally:
        q.close()


@pytest.mark.parametrize("params,headers,code", [
    ("nope=1", {}, "unknown_field"),
    ("types=gossip", {}, "invalid_type"),
    ("operator=xor", {}, "invalid_field"),
    ("", {"Last-Event-ID": "12abc"}, "invalid_field"),
    ("last_event_id=-4", {}, "invalid_field"),
])
def test_bad_requests_get_the_error_shape(server, params, headers, code):
    rv = requests.get(server.url + "/mcp/stream?" + params, headers={**server.headers(KEY), **headers}, timeout=10)
    assert rv.status_code == 400 and rv.json()["code"] == code, rv.text
    assert set(rv.json()) <= {"error", "code", "field"}


def test_scopes(server):
    assert requests.get(server.url + "/mcp/stream", headers=server.headers(PUSH_ONLY), timeout=10).status_code == 403
    assert requests.get(server.url + "/mcp/stream", timeout=10).status_code == 401


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory):
    """Ends every stream that delivered nothing for 1 s: clients must reconnect all the time."""
    srv = start(tmp_path_factory, "stream-idle", CONTEXT_LISTEN_IDLE_S="1")
    yield srv
    srv.stop()


def test_the_server_ends_idle_streams_with_an_end_event(idle_server):
    sse = stream(idle_server, "query=x", key=KEY)
    try:
        end = sse.until(lambda e: e.get("event") == "end", timeout=10)[-1]
        assert end["data"] == {"reason": "idle"}
        assert sse.next(5) is None
    finally:
        sse.close()


def test_python_client_resumes_through_server_ends_and_drops(idle_server):
    """The client's iterator reconnects with Last-Event-ID whenever the stream ends (idle limit every
    second here) or drops: every unit arrives once, in order."""
    from context_mode_client import ContextModeClient
    cm = ContextModeClient(idle_server.url, api_key=KEY)
    start = cm.push("the stream starts after this one", source="client_v1")
    s = cm.stream("clientword", types=["tool_output"], last_event_id=start["seq"])
    got: list[dict] = []
    done = threading.Event()

    def consume():
        for unit in s:
            got.append(unit)
            if len(got) == 6:
                done.set()
                return
    threading.Thread(target=consume, daemon=True).start()
    pushed = []
    for i in range(6):
        pushed.append(cm.push(f"clientword {i}", source="client_v1"))
        if i == 2:
            s._drop()                        # a dropped connection in the middle
        time.sleep(0.6 if i % 2 else 1.6)    # long gaps: the server ends the idle stream in between
    assert done.wait(20), got
    s.close()
    assert [u["cid"] for u in got] == [p["cid"] for p in pushed]
    assert s.last_event_id == pushed[-1]["seq"]


def test_python_client_watch_calls_back(server):
    from context_mode_client import ContextModeClient
    cm = ContextModeClient(server.url, api_key=KEY)
    seen: list[str] = []
    arrived = threading.Event()

    def on_unit(unit):
        seen.append(unit["content"])
        arrived.set()
    start = cm.push("before the watch", source="client_v1")
    handle = cm.watch(on_unit, "watchword", last_event_id=start["seq"])
    try:
        cm.push("watchword called back", source="client_v1")
        assert arrived.wait(10)
        assert seen == ["watchword called back"]
    finally:
        handle.close()


@pytest.mark.sqlite_only      # (the client's example; the stream itself runs on both above)
def test_python_client_readme_live_example_runs(server, tmp_path):
    """clients/python/README.md's live-context block, verbatim but for the URL and key: it waits for a
    unit, so one is pushed while it waits."""
    import re
    from context_mode_client import ContextModeClient
    from conftest import ROOT
    [code] = re.findall(r"```py\n(.*?)```", (ROOT / "clients" / "python" / "README.md").read_text(), flags=re.S)
    admin = LiveServer(tmp_path / "data", workers=1, keys={"readme-admin-0123456789abcdef": ("acme", ["push", "search", "admin"])})
    admin.start()
    try:
        cm = ContextModeClient(admin.url, api_key="readme-admin-0123456789abcdef")
        stop = threading.Event()

        def pusher():
            i = 0
            while not stop.is_set():
                cm.push(f"ORD-7890 readme unit {i}", source="readme_v1")
                i += 1
                stop.wait(0.3)
        threading.Thread(target=pusher, daemon=True).start()
        scope = {"cm": cm}
        try:
            exec(compile(code, "clients/python/README.md", "exec"), scope)
        finally:
            stop.set()
        assert "ORD-7890" in cm.get(scope["unit"]["cid"])["content"]
        assert scope["best"]["name"] == "get_forecast" and scope["best"]["input_schema"]["type"] == "object"
        assert scope["names"] == ["get_forecast"]
        scope["later"].close()
    finally:
        admin.stop()


def test_stats_count_the_tenants_open_streams_over_every_worker(server):
    """Issue 51 (streams that tell): /mcp/stats says how many live streams the tenant holds open over every
    worker, beside the bounds they meet; a closed stream stops counting, another tenant's never counts. (The
    streams are the other tenant's: the shared server's other tests stream as the first, and a stream they
    closed counts until its worker notices, within a second.)"""
    def streams(key=OTHER):
        rv = requests.get(server.url + "/mcp/stats", headers=server.headers(key), timeout=10)
        assert rv.status_code == 200, rv.text
        return rv.json()["streams"]

    def settled(want, key=OTHER):
        deadline = time.monotonic() + 15
        while streams(key)["open"] != want and time.monotonic() < deadline:
            time.sleep(0.1)
        return streams(key)["open"]

    def opened(i, key=OTHER):
        deadline = time.monotonic() + 15              # (a worker's share per tenant: the next slot may be a moment away)
        while True:
            sse = stream(server, f"query=statcount{i}", key=key)
            if sse.status == 200 or time.monotonic() > deadline:
                return sse
            sse.close()
            time.sleep(0.5)
    first = streams()
    assert first["tenant_limit"] == 64 and first["per_worker"] >= 1 and 1 <= first["tenant_share_per_worker"]
    assert settled(0) == 0
    held = [opened(i) for i in range(3)]
    try:
        assert [s.status for s in held] == [200, 200, 200]
        assert settled(3) == 3                                  # whichever worker answers the stats
        held.append(opened("first", KEY))                       # (its share may hold a stream another test closed)
        assert held[-1].status == 200 and settled(1, KEY) >= 1 and streams()["open"] == 3   # not the other's
    finally:
        for s in held:
            s.close()
    assert settled(0) == 0                                       # (a closed client is noticed within a second)
