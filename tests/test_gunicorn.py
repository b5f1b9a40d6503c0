"""Integration: real gunicorn with 2 workers sharing shards; crash recovery of the durable queue."""
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import make_unit


def test_two_workers_2000_units_from_20_threads(live_server):
    url = live_server.url
    now = int(time.time())
    session_per_thread = {}

    def push(i):
        s = session_per_thread.setdefault(i % 20, requests.Session())
        # Three days, so several shards are written by both workers at once.
        unit = make_unit(f"concurrent unit {i} 并发 写入 {i * 7}", timestamp=now - (i % 3) * 86_400,
                         ttl=5 * 86_400, source=f"writer_{i % 20}")
        rv = s.post(url + "/mcp/push", json=unit, timeout=30)
        assert rv.status_code == 200, rv.text
        return i, rv.json()

    with ThreadPoolExecutor(20) as pool:
        acked = dict(pool.map(push, range(2000)))
    assert len({a["cid"] for a in acked.values()}) == 2000
    assert len({a["seq"] for a in acked.values()}) == 2000

    def read(item):
        i, ack = item
        rv = requests.get(f"{url}/mcp/units/{ack['cid']}", timeout=30)
        assert rv.status_code == 200, rv.text
        assert rv.json()["content"].startswith(f"concurrent unit {i} ")
        return 1

    with ThreadPoolExecutor(20) as pool:
        assert sum(pool.map(read, acked.items())) == 2000

    # The background indexer (one leader among the workers) makes all of them searchable.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = requests.get(url + "/readyz", timeout=10).json()
        if ready["index_pending"] == 0:
            break
        time.sleep(0.2)
    assert ready["index_pending"] == 0
    rv = requests.post(url + "/mcp/search", json={"query": "concurrent 并发", "top_k": 100,
                                                  "consistency": "strong"}, timeout=30).json()
    assert len(rv["results"]) == 100 and rv["shards_searched"] == 3
    for i in (0, 777, 1999):
        hits = requests.post(url + "/mcp/search", json={"query": str(i * 7), "consistency": "strong"},
                             timeout=30).json()["results"]
        assert acked[i]["cid"] in [h["cid"] for h in hits]


@pytest.mark.sqlite_only     # it reads the day file (PostgreSQL: tests/test_crash.py)
def test_crash_with_pending_rows_then_restart_indexes_them(live_server_factory, tmp_path):
    data = tmp_path / "crashdata"
    # Background maintenance off: every acked row stays pending until the crash.
    server = live_server_factory(data_dir=data, env={"CONTEXT_BACKGROUND": "false"})
    acked = []
    for i in range(50):
        rv = requests.post(server.url + "/mcp/push", json=make_unit(f"survivor {i} 幸存"), timeout=10)
        assert rv.status_code == 200
        acked.append(rv.json()["cid"])
    assert requests.get(server.url + "/readyz", timeout=10).json()["index_pending"] == 50
    server.kill()

    db = next((data / "tenants" / "default" / "primary").glob("*.db"))
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM units WHERE indexed = 0").fetchone()[0] == 50
    conn.close()

    restarted = live_server_factory(data_dir=data)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = requests.post(restarted.url + "/mcp/search", json={"query": "幸存", "top_k": 100},
                             timeout=10).json()
        if len(body["results"]) == 50:
            break
        time.sleep(0.2)
    assert sorted(r["cid"] for r in body["results"]) == sorted(acked)
    assert body["freshness"]["index_pending"] == 0
