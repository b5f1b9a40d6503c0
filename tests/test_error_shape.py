"""One error body everywhere on the REST surface: {"error", "code", "field"?} (docs/design.md §4)."""
import pytest

# The same contract on both storage backends (issue 18; tests/conftest.py, pytest_generate_tests).
BACKENDS = ("sqlite", "postgresql")

REST_ROUTES = [("POST", "/mcp/push"), ("POST", "/mcp/search"), ("GET", "/mcp/search"), ("POST", "/mcp/context"),
               ("GET", "/mcp/units/0123456789ab"), ("GET", "/mcp/units/0123456789ab/lineage"),
               ("DELETE", "/mcp/units/0123456789ab"), ("POST", "/mcp/forget"), ("GET", "/mcp/units"),
               ("GET", "/mcp/stats"), ("GET", "/mcp/export"),
               ("POST", "/mcp/tools"), ("GET", "/mcp/tools"), ("GET", "/mcp/tools/get_weather"),
               ("PUT", "/mcp/tools/get_weather"), ("DELETE", "/mcp/tools/get_weather")]
BAD_BODIES = [b"", b"{", b"null", b"[]", b'"text"', b"\xff", b'{"query": {"nested": [1]}}', b"1e999999",
              b'{"type": ' * 2000]


def check_shape(rv):
    assert 400 <= rv.status_code < 500, (rv.status_code, rv.get_data(as_text=True))
    body = rv.get_json()
    assert isinstance(body, dict) and set(body) <= {"error", "code", "field"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["code"], str) and body["code"].replace("_", "").isalpha()
    assert "Traceback" not in body["error"]


@pytest.mark.parametrize("method,path", REST_ROUTES)
@pytest.mark.parametrize("body", BAD_BODIES)
def test_bad_bodies_get_the_error_shape(client, method, path, body):
    rv = client.open(path, method=method, data=body, content_type="application/json")
    if rv.status_code == 200:   # GET/DELETE ignore bodies; those answered on the path alone
        assert method in ("GET", "DELETE")
        return
    check_shape(rv)


def test_every_registered_rule_answers_wrong_methods_with_the_shape(app, client):
    served: dict[str, set] = {}         # one path may be served by several rules (one per view)
    for rule in app.url_map.iter_rules():
        served.setdefault(rule.rule, set()).update(rule.methods)
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule in ("/mcp",) or "retrieval" in rule.rule:
            continue
        path = rule.rule.replace("<cid>", "0123456789ab").replace("<name>", "get_weather")
        for method in ("PUT", "PATCH"):
            if method in served[rule.rule]:
                continue
            rv = client.open(path, method=method)
            assert rv.status_code == 405, (path, method)
            check_shape(rv)


def test_unknown_paths_get_the_shape(client):
    for path in ("/mcp/", "/mcp/units/", "/console/x", "/../../etc/passwd", "/mcp/units/x/y/z", "/%00"):
        rv = client.get(path)
        check_shape(rv)
