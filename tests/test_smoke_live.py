"""make run's gunicorn serves a push and a search (the README's curl example, with requests)."""
import requests

from conftest import make_unit


def test_push_then_search_on_gunicorn(live_server):
    rv = requests.post(live_server.url + "/mcp/push", json=make_unit("订单 ORD-7890 shipped"), timeout=10)
    assert rv.status_code == 200, rv.text
    cid = rv.json()["cid"]
    rv = requests.post(live_server.url + "/mcp/search", json={"query": "ORD-7890", "consistency": "strong"}, timeout=10)
    assert rv.status_code == 200
    assert [r["cid"] for r in rv.json()["results"]] == [cid]
    assert requests.get(live_server.url + "/readyz", timeout=10).json()["storage_writable"] is True
