"""Fair shares (service/shares/; issue 25, findings 3, 4, 5, 10): one tenant at its limit leaves room for the others.

- stream slots: one key (or tenant) holds at most its share of a worker's (half), refused with 429 +
  Retry-After, so the other tenant's stream still opens;
- search slots: one tenant's slow strong searches over many day files hold at most its share of a
  worker's, so the other tenant's default searches keep answering;
- the open-shard cache: one tenant keeps at most its share of the open day files, and a search over more
  days opens the rest for itself without evicting the other tenants';
- read-your-writes after large pending units reads only what its budget allows, and says what it left;
- tool search runs inside the search slots, reads a bounded number of token bytes and answers a bounded
  number of bytes.

The gunicorn tests use bounded loads (counts and time) on loopback.
"""
from __future__ import annotations

import threading
import time

import pytest
import requests

from conftest import drain, make_unit, replayed
from live_support import listen, stream
from service.state import app_state

A, A2, B = "fair-acme-0123456789abcdef", "fair-acme2-0123456789abcdef", "fair-globex-0123456789abcdef"
KEYS = {A: ("acme", ["push", "search", "admin"]), A2: ("acme", ["push", "search", "admin"]),
        B: ("globex", ["push", "search", "admin"])}
BACKENDS = ("sqlite", "postgresql")
DAY = 86_400


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


# --- finding 3: stream slots ----------------------------------------------------------------------------
def test_one_key_at_its_stream_share_leaves_the_other_tenants_stream_200(live_server_factory):
    """2 workers x 4 stream slots (8 threads): 20 streams asked with one key get at most 2 per worker; the
    rest are 429 too_many_streams with Retry-After (REST and MCP alike); the other tenant's stream opens."""
    server = live_server_factory(keys=KEYS, env={"CONTEXT_RATE_LIMIT": "off", "CONTEXT_THREADS": "8"})
    held, refused = [], []
    try:
        for _ in range(20):
            sse = stream(server, "query=anything", key=A, timeout=10)
            if sse.status == 200:
                held.append(sse)
            else:
                refused.append((sse.status, sse.headers.get("Retry-After"), sse.body))
                sse.conn.close()
        assert 2 <= len(held) <= 4, (len(held), refused[:2])
        for status, retry, body in refused:
            assert status == 429 and retry and body["code"] == "too_many_streams", (status, retry, body)
        # the same key's MCP listen is refused the same way once its worker share is taken (or opens on a
        # worker where it has room: either way never the server's last slots)
        for i in range(4):
            sse = listen(server, {"resourcesListChanged": True}, key=A2, id=f"l{i}", timeout=10)
            if sse.status == 200:
                held.append(sse)
            else:
                assert sse.status == 429 and sse.headers.get("Retry-After"), sse.body
                assert sse.body["error"]["code"] == -32012 and sse.body["error"]["data"]["scope"] in ("tenant", "key")
                sse.conn.close()
        # acme (both keys) holds at most its share of each worker: globex's stream always finds a slot
        other = stream(server, "query=anything", key=B, timeout=10)
        held.append(other)
        assert other.status == 200, other.body
    finally:
        for sse in held:
            sse.close()


def test_a_keyless_start_lets_its_one_tenant_hold_every_stream_slot(live_server_factory):
    """With no keys there is one tenant and nobody to leave room for: it held half a worker's slots (2 of 4), so a
    local start refused the third agent session's MCP stream with 429 naming an API key (issue 51). Now it holds
    all 4; the fifth is told which settings bound it."""
    server = live_server_factory(workers=1, env={"CONTEXT_RATE_LIMIT": "off", "CONTEXT_THREADS": "8"})
    held, refused = [], []
    try:
        for _ in range(6):
            sse = stream(server, "query=anything", timeout=10)
            if sse.status == 200:
                held.append(sse)
            else:
                refused.append((sse.status, sse.body))
                sse.conn.close()
        assert len(held) == 4, refused
        assert [status for status, _ in refused] == [503, 503]
        for _, body in refused:
            assert body["code"] == "too_many_streams" and "CONTEXT_MAX_STREAMS" in body["error"], body
            assert "API key" not in body["error"]
    finally:
        for sse in held:
            sse.close()


# --- finding 4: search slots and the open-shard cache ------------------------------------------------------
def _push_days(url: str, key: str, days: int, word: str) -> None:
    now = int(time.time())
    filler = " ".join(f"{word} harbour tide {d}" for d in range(2000))     # ~50 KB: a day costs real scoring
    units = [make_unit(f"{word} note of day {d} about the harbour " + filler, timestamp=now - d * DAY - 60,
                       ttl=365 * DAY) for d in range(days)]
    for start in range(0, days, 90):      # one push touches at most 100 days
        rv = requests.post(f"{url}/mcp/push", json={"units": units[start:start + 90]}, headers=bearer(key),
                           timeout=120)
        assert rv.status_code == 200, rv.text
        assert all(item["status"] == "ok" for item in rv.json()["results"]), rv.text[:300]


def test_one_tenants_slow_strong_searches_leave_the_others_default_searches_2xx(live_server_factory):
    """acme runs 8 strong searches at once over 360 day files, in a loop (bounded: 15 s); globex's default
    searches, one at a time, all answer 200: acme holds at most 2 of each worker's 4 search slots (its
    surplus waits CONTEXT_SEARCH_WAIT_S without a thread, then 429 too_many_searches)."""
    server = live_server_factory(keys=KEYS, env={"CONTEXT_RATE_LIMIT": "off", "CONTEXT_SEARCH_WAIT_S": "0.1",
                                                 "CONTEXT_SEARCH_CPU_MS": "0"})
    _push_days(server.url, A, 360, "lighthouse")
    requests.post(f"{server.url}/mcp/push", json=make_unit("globex keeps a harbour log"), headers=bearer(B),
                  timeout=30).raise_for_status()
    stop = threading.Event()
    statuses: list[int] = []

    def strong():
        s = requests.Session()
        for _ in range(200):
            if stop.is_set():
                return
            rv = s.post(f"{server.url}/mcp/search", json={"query": "lighthouse harbour", "consistency": "strong",
                                                           "top_k": 50}, headers=bearer(A), timeout=60)
            statuses.append(rv.status_code)
            if rv.status_code in (429, 503):
                time.sleep(0.05)
    threads = [threading.Thread(target=strong) for _ in range(8)]
    for t in threads:
        t.start()
    answers = []
    try:
        time.sleep(2)                          # acme's searches under way
        s = requests.Session()
        deadline = time.monotonic() + 15
        while len(answers) < 30 and time.monotonic() < deadline:
            rv = s.post(f"{server.url}/mcp/search", json={"query": "harbour"}, headers=bearer(B), timeout=30)
            answers.append((rv.status_code, rv.json()))
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
    assert len(answers) >= 10
    assert [a for a in answers if a[0] != 200] == []
    assert all(len(body["results"]) == 1 for _, body in answers)
    # acme's own searches were shared out (some refused with 429 past its share, never a 5xx)
    assert set(statuses) <= {200, 429} and 200 in statuses


@pytest.mark.sqlite_only
def test_a_tenants_search_over_many_days_does_not_evict_the_others_day_files(make_app):
    """max_open_shards 8: globex's two days stay open while acme pushes and strongly searches 40 days;
    acme keeps at most its share (4) and the process at most 8."""
    from service.params import parse_search
    app = make_app(max_open_shards=8)
    store = app_state(app).store
    now = int(time.time())
    assert store.push_many("globex", [make_unit("globex day one", timestamp=now - 60),
                                      make_unit("globex day two", timestamp=now - DAY - 60)])
    globex = store.tenant("globex")
    kept = set(globex._shards)
    assert len(kept) == 2
    results = store.push_many("acme", [make_unit(f"acme beacon {d}", timestamp=now - d * DAY - 60, ttl=60 * DAY)
                                       for d in range(40)])
    assert all(r["status"] == "ok" for r in results)
    drain(app)
    for _ in range(3):
        found = store.search("acme", parse_search({"query": "beacon", "consistency": "strong", "top_k": 50},
                                                  store.config))
        assert len(found["results"]) == 40
    assert set(globex._shards) == kept                      # nothing of globex's was evicted
    assert len(store.tenant("acme")._shards) <= 4
    assert store.open_shards.held("acme") <= 4 and store.open_shards.held("globex") == 2
    # globex's days still serve it
    found = store.search("globex", parse_search({"query": "globex", "consistency": "strong"}, store.config))
    assert len(found["results"]) == 2


# --- finding 5: read-your-writes within its budget ----------------------------------------------------------
def test_read_your_writes_after_large_pending_units_reads_only_its_budget(make_app):
    """20 pending units of 1 MB each (the indexer has not run): the next default search reads what
    read_your_writes_ms (500) and search_cpu_ms admit, unit by unit, and reports the rest as pending,
    instead of tokenizing them all (before: every one, in batches of 64, whatever the deadline)."""
    app = make_app(replica_debounce_ms=0)
    client = app.test_client()
    assert client.post("/mcp/push", json=make_unit("an indexed walrus note")).status_code == 200
    drain(app)
    replayed(app)
    store = app_state(app).store
    filler = ("walrus tusk ice floe " * 60_000)[:1_000_000]
    for i in range(20):
        rv = client.post("/mcp/push", json=make_unit(f"walrus {i} " + filler))
        assert rv.status_code == 200, rv.get_json()
    made_before = _tokenized(store)
    rv = client.post("/mcp/search", json={"query": "walrus"})
    assert rv.status_code == 200, rv.get_json()
    body = rv.get_json()
    made = _tokenized(store) - made_before
    assert made <= 5, made                                  # ~3 MB/s of tokenizing in 500 ms, not 20 MB
    assert body["freshness"]["index_pending"] >= 20 - made  # what it did not read is said, not hidden
    assert body["results"], body                            # the read index (and what was read) answers


def _tokenized(store) -> int:
    """Units whose tokens this process made for searches (SQLite's TokenCache, PostgreSQL's tail texts)."""
    searcher = store.searcher
    n = len(searcher.tokens._items)
    tail = getattr(searcher, "tail", None)
    texts = getattr(tail, "texts", None)
    return n + (len(texts._items) if texts is not None else 0)


# --- finding 10: tool search inside the slots, bounded ------------------------------------------------------
def _big_tool(i: int) -> dict:
    props = {f"field_{j}": {"type": "string", "description": f"forecast rain wind humidity reading {j} " * 12}
             for j in range(300)}
    return {"name": f"weather_{i}", "description": f"Weather forecast station {i}: rain and wind.",
            "auth_type": "none", "tags": ["weather"], "input_schema": {"type": "object", "properties": props}}


def test_tool_search_takes_a_search_slot(make_app):
    app = make_app(max_concurrent_searches=1, search_wait_s=0.2)
    client = app.test_client()
    assert client.post("/mcp/tools", json=_big_tool(0)).status_code == 200
    store = app_state(app).store
    assert client.get("/mcp/tools?q=forecast").status_code == 200
    with store.search_slot("default"):                    # another search holds the worker's only slot
        rv = client.get("/mcp/tools?q=forecast")
    assert rv.status_code == 503 and rv.get_json()["code"] == "search_busy" and rv.headers["Retry-After"]


def test_tool_search_reads_and_answers_bounded_bytes(make_app, monkeypatch):
    """30 tools of ~200 KB of schema tokens: one search scores at most tool_search_bytes (here 1 MiB) of
    token text, 64 KiB per column, and its answer stops growing past 4 MiB."""
    from service.ranking import tools as ranking
    app = make_app(tool_search_bytes=1 << 20)
    client = app.test_client()
    for i in range(30):
        rv = client.post("/mcp/tools", json=_big_tool(i))
        assert rv.status_code == 200, rv.get_json()
    seen = []
    real = ranking.bm25

    def counting(rows, *args):
        seen.append([sum(len(r[f"t_{c}"]) for c in ranking.WEIGHTS) for r in rows])
        return real(rows, *args)
    monkeypatch.setattr(ranking, "bm25", counting)
    rv = client.get("/mcp/tools?q=humidity+forecast&top_k=50")
    assert rv.status_code == 200
    tools = rv.get_json()["tools"]
    sizes = seen[-1]
    assert all(size <= 3 * ranking.COLUMN_BYTES for size in sizes)
    assert sum(sizes) <= (1 << 20) + 3 * ranking.COLUMN_BYTES
    assert 0 < len(tools) < 30 and len(rv.data) <= ranking.ANSWER_BYTES + 512 * 1024
    assert all(t["name"].startswith("weather_") and t["score"] > 0 for t in tools)


# --- issue 42: a slot given back is handed to the first search its shares let in, which alone wakes ------
def _holder(slots, tenant, key, started, release, log, name):
    """A thread holding a slot until ``release`` is set; ``log`` gets (name, "in") once it has one."""
    def run():
        started.set()
        try:
            with slots.hold(tenant, key):
                log.append((name, "in"))
                release.wait(10)
        except Exception as e:  # noqa: BLE001 - the test reads what happened
            log.append((name, type(e).__name__))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    started.wait(5)
    time.sleep(0.05)                # (until it holds, or waits, in arrival order)
    return t


def test_search_slots_are_handed_over_in_arrival_order_within_the_shares():
    from service.shares.searches import SearchSlots
    slots = SearchSlots(total=2, per_tenant=1, per_key=1, wait_s=5)
    log, gates = [], {n: threading.Event() for n in ("a1", "a2", "a3", "b1")}
    threads = {n: _holder(slots, t, None, threading.Event(), gates[n], log, n)
               for n, t in (("a1", "acme"), ("a2", "acme"), ("a3", "acme"), ("b1", "globex"))}
    assert log == [("a1", "in"), ("b1", "in")]          # globex passes acme's waiters: their share is full
    gates["b1"].set()
    threads["b1"].join(5)
    time.sleep(0.1)
    assert log == [("a1", "in"), ("b1", "in")]          # a free slot, but acme still at its share
    gates["a1"].set()
    threads["a1"].join(5)
    time.sleep(0.1)
    assert log[2:] == [("a2", "in")]                    # the first acme waiter, a3 still waits
    assert [w.tenant for w in slots._waiting] == ["acme"]
    gates["a2"].set()
    gates["a3"].set()
    for n in ("a2", "a3"):
        threads[n].join(5)
    assert log[3:] == [("a3", "in")]
    assert (slots.used, slots.tenants, list(slots._waiting)) == (0, {}, [])


def test_a_search_that_waits_past_its_time_is_busy_and_leaves_no_trace():
    from service.errors import Busy
    from service.shares.searches import SearchSlots
    slots = SearchSlots(total=2, per_tenant=1, per_key=1, wait_s=0.2)
    release, log = threading.Event(), []
    holder = _holder(slots, "acme", "k1", threading.Event(), release, log, "first")
    t0 = time.monotonic()
    with pytest.raises(Busy, match="share"):
        with slots.hold("acme", "k2"):
            pass
    assert 0.15 < time.monotonic() - t0 < 3
    assert list(slots._waiting) == []
    release.set()
    holder.join(5)
    assert (slots.used, slots.tenants, slots.keys) == (0, {}, {})
    with slots.hold("acme", "k2"):                    # and the slot is there for the next
        assert slots.used == 1


# --- issue 39, finding 3: a share of the worker's CPU ----------------------------------------------------------
def test_a_tenants_cpu_share_holds_it_only_while_another_tenant_searches():
    """CpuShares: what a tenant spent decays over the window; past share x window it waits the time the decay
    takes to bring it back, but only while a lighter tenant (within its share) has searched in the last three
    windows."""
    from service.shares.cpu import CpuShares
    cpu = CpuShares(share=0.25, window_s=1.0)
    cpu.charge("acme", 1.0, now=100.0)
    assert cpu.wait_for("acme", now=100.0) == 0             # alone: the whole worker is acme's
    cpu.charge("globex", 0.002, now=100.0)
    wait = cpu.wait_for("acme", now=100.0)
    assert wait == pytest.approx(1.3863, abs=1e-3)          # ln(1.0 / 0.25) windows
    assert cpu.wait_for("acme", now=100.0 + wait + 1e-6) == 0
    assert cpu.wait_for("globex", now=100.0) == 0           # globex is within its share
    assert cpu.wait_for("acme", now=103.5) == 0             # globex quiet for three windows: acme alone again
    cpu.charge("acme", 3.0, now=103.5)
    assert cpu.wait_for("acme", now=103.5) == 0
    cpu.charge("globex", 2.0, now=103.5)                    # both past their shares: neither is held
    assert cpu.wait_for("acme", now=103.5) == 0 and cpu.wait_for("globex", now=103.5) == 0
    cpu.charge("initech", 0.01, now=103.5)                  # a lighter tenant searches: both are
    assert cpu.wait_for("acme", now=103.5) > 0 and cpu.wait_for("globex", now=103.5) > 0


def test_a_search_past_its_tenants_cpu_share_waits_without_a_slot_then_is_busy():
    from service.errors import Busy
    from service.shares.cpu import CpuShares
    from service.shares.searches import SearchSlots
    slots = SearchSlots(total=2, per_tenant=2, per_key=2, wait_s=0.3, cpu=CpuShares(share=0.25))
    now = time.monotonic()
    slots.cpu.charge("globex", 0.001, now)
    slots.cpu.charge("acme", 0.3, now)                     # ln(0.3 / 0.25) = 0.18 s to wait: it waits
    t0 = time.monotonic()
    with slots.hold("acme"):
        assert slots.used == 1
    assert 0.12 < time.monotonic() - t0 < 2
    slots.cpu.charge("acme", 5.0, time.monotonic())         # ln(20) = 3 s: past wait_s, refused at once
    t0 = time.monotonic()
    with pytest.raises(Busy, match="share of this server's CPU"):
        with slots.hold("acme"):
            pass
    assert time.monotonic() - t0 < 0.2
    assert (slots.used, slots.tenants, list(slots._waiting)) == (0, {}, [])
    with slots.hold("globex"):                              # the other tenant passes meanwhile
        assert slots.tenants == {"globex": 1}


def test_a_tenant_past_its_cpu_share_gets_429_while_the_other_tenant_answers(live_server_factory):
    """On one worker with a small share (5 % of its CPU) and no wait: once globex has searched, acme's searches
    back to back (each answering ~1 MB) go past its share and are refused with 429 too_many_searches + Retry-After
    (the CPU charged includes encoding its answer), while globex's few small ones answer 200; with no other
    tenant searching, acme is never held."""
    server = live_server_factory(workers=1, keys=KEYS, env={
        "CONTEXT_RATE_LIMIT": "off", "CONTEXT_SEARCH_CPU_SHARE": "0.05", "CONTEXT_SEARCH_WAIT_S": "0"})
    s = requests.Session()
    for i in range(40):
        s.post(f"{server.url}/mcp/push", json=make_unit(f"acme lighthouse log {i} " + "beam " * 5000),
               headers=bearer(A), timeout=30).raise_for_status()
    s.post(f"{server.url}/mcp/push", json=make_unit("globex harbour log"), headers=bearer(B),
           timeout=30).raise_for_status()
    for key, query, n in ((A, "lighthouse", 40), (B, "harbour", 1)):
        deadline = time.monotonic() + 30
        while len(s.post(f"{server.url}/mcp/search", json={"query": query, "top_k": 50}, headers=bearer(key),
                         timeout=30).json()["results"]) < n and time.monotonic() < deadline:
            time.sleep(0.2)
    time.sleep(3.1)                                          # globex's searches above out of the window
    alone = [s.post(f"{server.url}/mcp/search", json={"query": "lighthouse beam", "top_k": 40}, headers=bearer(A),
                    timeout=30).status_code for _ in range(10)]
    assert alone == [200] * 10
    assert s.post(f"{server.url}/mcp/search", json={"query": "harbour"}, headers=bearer(B),
                  timeout=30).status_code == 200
    acme = [s.post(f"{server.url}/mcp/search", json={"query": "lighthouse beam", "top_k": 40}, headers=bearer(A),
                   timeout=30) for _ in range(12)]
    globex = [s.post(f"{server.url}/mcp/search", json={"query": "harbour"}, headers=bearer(B),
                     timeout=30).status_code for _ in range(3)]
    assert globex == [200] * 3
    refused = [rv for rv in acme if rv.status_code != 200]
    assert refused and {rv.status_code for rv in refused} == {429}
    assert all(rv.json()["code"] == "too_many_searches" and int(rv.headers["Retry-After"]) >= 1 for rv in refused)
    assert "share of this server's CPU" in refused[0].json()["error"]


def test_a_request_is_charged_its_searches_and_its_answer_once(monkeypatch):
    """The CPU charged for a request that searches twice: each search inside its slot, and from the last search
    to the answer built (not again from the first), on a clock the test turns."""
    import flask

    from service.shares import searches
    from service.shares.cpu import CpuShares
    from service.shares.searches import SearchSlots
    clock = {"cpu": 0.0}
    monkeypatch.setattr(searches.time, "thread_time", lambda: clock["cpu"])
    monkeypatch.setattr(searches.time, "monotonic", lambda: 100.0)
    slots = SearchSlots(total=2, per_tenant=2, per_key=2, wait_s=0, cpu=CpuShares(share=1.0))
    app = flask.Flask(__name__)
    with app.test_request_context("/mcp/context"):
        for cost, then in ((1.0, 5.0), (1.0, 2.0)):
            with slots.hold("acme"):
                clock["cpu"] += cost           # the search
            clock["cpu"] += then               # after it: another step, then the answer
        assert slots.cpu.spent["acme"][0] == pytest.approx(2.0)
        app.process_response(flask.Response("{}"))
    assert slots.cpu.spent["acme"][0] == pytest.approx(4.0)


# --- issue 50, H1: a request that must wait gives its thread back ----------------------------------------------
def _in_flight(requests_to_send) -> tuple[list, list[threading.Thread]]:
    """Send each (callable) on its own thread; the answers (status codes) are appended as they come."""
    done: list = []
    threads = [threading.Thread(target=lambda f=f: done.append(f()), daemon=True) for f in requests_to_send]
    for t in threads:
        t.start()
    return done, threads


def test_searches_held_past_their_cpu_share_hold_no_thread(live_server_factory):
    """One worker of 4 threads; acme far past a small CPU share (1 %) while globex searches, with a long wait
    allowed: 8 of acme's searches must each wait seconds. They wait without a thread, so /healthz and globex's
    search answer while every one of them still waits (they slept in the 4 threads before, and both waited
    behind them); then acme's answer 200 or 429 (none waits past CONTEXT_SEARCH_WAIT_S)."""
    server = live_server_factory(workers=1, keys=KEYS, env={
        "CONTEXT_THREADS": "4", "CONTEXT_RATE_LIMIT": "off", "CONTEXT_SEARCH_CPU_SHARE": "0.01",
        "CONTEXT_SEARCH_WAIT_S": "20"})
    s = requests.Session()
    for i in range(40):
        s.post(f"{server.url}/mcp/push", json=make_unit(f"acme lighthouse log {i} " + "beam " * 20000),
               headers=bearer(A), timeout=30).raise_for_status()
    s.post(f"{server.url}/mcp/push", json=make_unit("globex harbour log"), headers=bearer(B), timeout=30)
    search = lambda: requests.post(f"{server.url}/mcp/search", json={"query": "lighthouse beam", "top_k": 40},  # noqa: E731
                                   headers=bearer(A), timeout=60).status_code
    deadline = time.monotonic() + 30
    while len(s.post(f"{server.url}/mcp/search", json={"query": "lighthouse", "top_k": 40}, headers=bearer(A),
                     timeout=30).json()["results"]) < 40 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [search() for _ in range(3)] == [200] * 3     # alone, never held: acme's CPU piles up
    assert s.post(f"{server.url}/mcp/search", json={"query": "harbour"}, headers=bearer(B), timeout=30).ok
    acme, threads = _in_flight([search] * 8)             # globex searched: acme waits ln(spent / 10 ms) s
    time.sleep(0.5)
    health = s.get(f"{server.url}/healthz", timeout=60)
    done_at_health = len(acme)
    other = s.post(f"{server.url}/mcp/search", json={"query": "harbour"}, headers=bearer(B), timeout=60)
    done_at_other = len(acme)
    for t in threads:
        t.join(60)
    assert health.status_code == 200 and other.status_code == 200
    assert (done_at_health, done_at_other) == (0, 0)
    assert len(acme) == 8 and set(acme) <= {200, 429}


@pytest.mark.sqlite_only
def test_one_keys_requests_hold_at_most_its_share_of_a_workers_threads(live_server_factory):
    """One worker of 4 threads: acme's catalog is locked by another process, and 6 pushes with acme's key wait for
    it (SQLite's busy wait, in their threads). The key holds at most 2 threads (half); the others wait without
    one, so /healthz and globex's search answer while the lock is held (before: all 4 threads waited on it, and
    so did they). Once the lock goes, every push is stored."""
    import sqlite3
    server = live_server_factory(workers=1, keys=KEYS, env={
        "CONTEXT_THREADS": "4", "CONTEXT_RATE_LIMIT": "off", "CONTEXT_BUSY_TIMEOUT_MS": "60000",
        "CONTEXT_THREAD_WAIT_S": "60"})
    s = requests.Session()
    s.post(f"{server.url}/mcp/push", json=make_unit("acme first"), headers=bearer(A), timeout=30).raise_for_status()
    s.post(f"{server.url}/mcp/push", json=make_unit("globex harbour log"), headers=bearer(B), timeout=30)
    lock = sqlite3.connect(server.data_dir / "tenants" / "acme" / "catalog.db", timeout=30, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    released = threading.Event()
    try:
        push = lambda i: lambda: requests.post(f"{server.url}/mcp/push", json=make_unit(f"acme waits {i}"),  # noqa: E731
                                               headers=bearer(A), timeout=120).status_code
        pushes, threads = _in_flight([push(i) for i in range(6)])
        time.sleep(1)
        answered = []
        for ask in (lambda: s.get(f"{server.url}/healthz", timeout=60),
                    lambda: s.post(f"{server.url}/mcp/search", json={"query": "harbour"}, headers=bearer(B),
                                   timeout=60)):
            rv = ask()
            answered.append((rv.status_code, released.is_set(), len(pushes)))
    finally:
        released.set()
        lock.execute("ROLLBACK")
        lock.close()
    for t in threads:
        t.join(90)
    assert answered == [(200, False, 0), (200, False, 0)]
    assert pushes == [200] * 6
