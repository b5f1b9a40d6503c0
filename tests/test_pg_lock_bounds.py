"""Every PostgreSQL wait is bounded (issue 50, M2): behind a table lock held by another client, each door answers
503 storage_unavailable with Retry-After within CONTEXT_PG_LOCK_TIMEOUT_MS (a live gunicorn on a real cluster),
instead of waiting for as long as the lock is held with its thread, and /healthz answers meanwhile."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
import requests

from conftest import make_unit

BACKENDS = ("postgresql",)
HOLD_S = 25.0          # the lock is held until every door answered, or this long (each would wait all of it)
TOOL = {"name": "ship_tracker", "description": "Track where a parcel is and when it will be delivered.",
        "auth_type": "none", "input_schema": {"type": "object", "properties": {"tracking_id": {"type": "string"}}}}


def _doors(url: str, cid: str, n: int) -> dict:
    """name: a call of that door (the push and the batch with new content, so neither is a duplicate)."""
    return {
        "push": lambda: requests.post(f"{url}/mcp/push", json=make_unit(f"a heron by lock {n}"), timeout=60),
        "batch": lambda: requests.post(f"{url}/mcp/push", json={"units": [make_unit(f"a wren by lock {n} {i}")
                                                                          for i in range(3)]}, timeout=60),
        "get": lambda: requests.get(f"{url}/mcp/units/{cid}", timeout=60),
        "lineage": lambda: requests.get(f"{url}/mcp/units/{cid}/lineage", timeout=60),
        "list": lambda: requests.get(f"{url}/mcp/units", timeout=60),
        "export": lambda: requests.get(f"{url}/mcp/export", timeout=60),
        "stats": lambda: requests.get(f"{url}/mcp/stats", timeout=60),
        "strong search": lambda: requests.post(f"{url}/mcp/search", json={"query": "heron", "consistency": "strong"},
                                               timeout=60),
        "register tool": lambda: requests.post(f"{url}/mcp/tools", json={**TOOL, "name": f"ship_tracker_{n}"},
                                               timeout=60),
        "tools": lambda: requests.get(f"{url}/mcp/tools", timeout=60),
    }


# the doors that must read or write the locked table (the others may answer 200 without it)
MUST_WAIT = {"units": {"push", "batch", "get", "export", "strong search"},
             "catalog": {"push", "batch"},
             "tools": {"register tool", "tools"}}


@pytest.mark.parametrize("table", sorted(MUST_WAIT))
def test_every_door_answers_503_within_its_bound_behind_a_table_lock(live_server_factory, store_config, table):
    server = live_server_factory(env={"CONTEXT_PG_LOCK_TIMEOUT_MS": "500", "CONTEXT_RATE_LIMIT": "off"})
    url = server.url
    rv = requests.post(f"{url}/mcp/push", json=make_unit("a heron before the lock"), timeout=30)
    assert rv.status_code == 200, rv.text
    cid = rv.json()["cid"]
    answers: dict[str, requests.Response] = {}
    with psycopg.connect(store_config["store"]) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        threads = [threading.Thread(target=lambda n=n, call=call: answers.__setitem__(n, call()), daemon=True)
                   for n, call in _doors(url, cid, hash(table) % 1000).items()]
        for t in threads:
            t.start()
        health = requests.get(f"{url}/healthz", timeout=5)          # (before the fix: every thread held)
        deadline = time.monotonic() + HOLD_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        answered_under_the_lock = dict(answers)
        holder.rollback()
    for t in threads:
        t.join(60)
    assert health.status_code == 200
    assert set(answered_under_the_lock) == set(answers), \
        f"waited for the whole lock: {sorted(set(answers) - set(answered_under_the_lock))}"
    for name, rv in answers.items():
        if name in MUST_WAIT[table] or rv.status_code != 200:
            assert rv.status_code == 503, (name, rv.status_code, rv.text)
            body = rv.json()
            assert body["code"] == "storage_unavailable" and body["error"], (name, body)
            assert int(rv.headers["Retry-After"]) >= 1, name
    # the lock gone, the same doors answer again
    assert requests.post(f"{url}/mcp/push", json=make_unit("a heron after the lock"), timeout=30).status_code == 200
    assert requests.post(f"{url}/mcp/tools", json=TOOL, timeout=30).status_code in (200, 201)
