"""The change log of live context (service/store/sqlite/live.py, issue 16), in process: every change a listener can
hear is recorded exactly once, whichever door made it (DELETE, forget, re-push, the tool registry)."""
from __future__ import annotations

from collections import Counter

from conftest import make_unit
from service.state import app_state

TENANT = "default"          # no keys configured: the open tenant
# PostgreSQL writes the log in the change's own transaction (service/store/postgresql/live.py): the same rows there.
BACKENDS = ("sqlite", "postgresql")


def log_of(app) -> Counter:
    """(uri, kind) → how many rows the tenant's events.db holds."""
    changes = app_state(app).hub.changes
    return Counter((r["uri"], r["kind"]) for r in changes.since(TENANT, 0))


def test_a_delete_is_recorded_once(client, app):
    cid = client.post("/mcp/push", json=make_unit("delete me once, events")).get_json()["cid"]
    kept = client.post("/mcp/push", json=make_unit("a unit that stays, events")).get_json()["cid"]
    assert log_of(app) == Counter()                     # new units are in the feed, not the change log
    assert client.delete(f"/mcp/units/{cid}").status_code == 200
    assert log_of(app) == Counter({(f"context://units/{cid}", "deleted"): 1})
    # a second DELETE of the same unit is a 404 and records nothing
    assert client.delete(f"/mcp/units/{cid}").status_code == 404
    assert log_of(app) == Counter({(f"context://units/{cid}", "deleted"): 1})
    assert (f"context://units/{kept}", "deleted") not in log_of(app)


def test_a_forget_records_each_unit_once_and_a_re_push_once(client, app):
    units = [make_unit(f"zzonce forgettable unit {i}") for i in range(3)]
    cids = [client.post("/mcp/push", json=u).get_json()["cid"] for u in units]
    assert client.post("/mcp/push", json=dict(units[0], metadata={"rev": 2})).get_json()["status"] == "duplicate"
    assert log_of(app) == Counter({(f"context://units/{cids[0]}", "changed"): 1})
    body = {"cids": cids[:2]}
    dry = client.post("/mcp/forget", json=body).get_json()
    assert dry["count"] == 2
    assert client.post("/mcp/forget", json=dict(body, confirm=dry["confirm"])).get_json()["forgotten"] == 2
    assert log_of(app) == Counter({(f"context://units/{cids[0]}", "changed"): 1,
                                   (f"context://units/{cids[0]}", "deleted"): 1,
                                   (f"context://units/{cids[1]}", "deleted"): 1})
