"""CORS for the origins an operator lists (CONTEXT_ALLOWED_ORIGINS): a web page on another origin, or a Figma
plugin's sandboxed window (``Origin: null``), can call the service with its key; any other origin still gets
403 and no CORS answer. Against a real gunicorn with keys; the browser case in headless Chromium: a page
served from another loopback port pushes and searches with fetch, as clients/figma/ui.html does.

``Origin: null`` (issue 39, finding 1) names no site: every sandboxed iframe, file:// page and data: URL sends
it. A start that lists it without keys is refused, and with keys it reaches the push route only: the
sandboxed iframe, the file:// page and the data: URL of the finding, in Chromium, with the tenant's admin key
in hand, push and read nothing (export, search, forget's dry run, the console session, metrics)."""
from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest
import requests

from conftest import LiveServer, free_port, make_unit

KEY = "cors-writer-0123456789abcdef01"
ADMIN = "cors-admin-0123456789abcdef012"
KEYS = {KEY: ("acme", ["push", "search"]), ADMIN: ("acme", ["push", "search", "admin"])}
PAGE_PORT = free_port()
PAGE_ORIGIN = f"http://127.0.0.1:{PAGE_PORT}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = LiveServer(tmp_path_factory.mktemp("cors") / "data", workers=1, keys=KEYS,
                   env={"CONTEXT_ALLOWED_ORIGINS": f"null,{PAGE_ORIGIN}", "CONTEXT_EXTRA_TYPES": "design_note"})
    try:
        yield s.start()
    finally:
        s.stop()


def preflight(server, origin: str, path: str = "/mcp/push"):
    return requests.options(server.url + path, timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_a_listed_origins_preflight_is_answered_without_a_key(server):
    for origin in ("null", PAGE_ORIGIN):
        rv = preflight(server, origin)
        assert rv.status_code == 204, rv.text
        assert rv.headers["Access-Control-Allow-Origin"] == origin
        allowed = {h.strip().lower() for h in rv.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "content-type"} <= allowed
        assert "POST" in rv.headers["Access-Control-Allow-Methods"]
        assert "Origin" in rv.headers.get("Vary", "")


def test_a_listed_origin_reads_answers_and_errors(server):
    unit = make_unit("鸬鹚 cormorant design note from a plugin", source="figma_plugin_v1.2", type="design_note")
    rv = requests.post(server.url + "/mcp/push", json=unit, timeout=10,
                       headers={**server.headers(KEY), "Origin": "null"})
    assert rv.status_code == 200, rv.text
    assert rv.headers["Access-Control-Allow-Origin"] == "null"
    assert "Retry-After" in rv.headers["Access-Control-Expose-Headers"]
    # a refusal names the origin too, so the page can read why
    rv = requests.post(server.url + "/mcp/push", json=unit, timeout=10, headers={"Origin": "null"})
    assert rv.status_code == 401 and rv.headers["Access-Control-Allow-Origin"] == "null"
    assert rv.json()["code"]


def test_an_unlisted_origin_gets_no_cors_and_is_refused(server):
    rv = preflight(server, "https://evil.example")
    assert rv.status_code == 403 and "Access-Control-Allow-Origin" not in rv.headers
    rv = requests.post(server.url + "/mcp/push", json=make_unit("x"), timeout=10,
                       headers={**server.headers(KEY), "Origin": "https://evil.example"})
    assert rv.status_code == 403 and "Access-Control-Allow-Origin" not in rv.headers
    # the service's own origin needs no CORS answer
    rv = requests.get(server.url + "/healthz", timeout=10, headers={"Origin": server.url})
    assert rv.status_code == 200 and "Access-Control-Allow-Origin" not in rv.headers


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

FETCH = """
const [url, key, done] = arguments;
const headers = {"Content-Type": "application/json", "Authorization": "Bearer " + key};
(async () => {
  try {
    const push = await fetch(url + "/mcp/push", {method: "POST", headers, body: JSON.stringify(
      {type: "design_note", source: "figma_plugin_v1.2", content: "checkout button 结账按钮 spacing 8px"})});
    const search = await fetch(url + "/mcp/search", {method: "POST", headers,
      body: JSON.stringify({query: "结账按钮", top_k: 3})});
    done({push: push.status, search: search.status, body: await search.json()});
  } catch (e) { done({error: String(e)}); }
})();
"""


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="chromium and chromedriver are not installed "
                    "(.ci/setup.d/chromium.sh)")
def test_a_page_on_a_listed_origin_pushes_and_searches_from_a_real_browser(server, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    (tmp_path / "index.html").write_text("<!doctype html><title>plugin</title>")
    page = ThreadingHTTPServer(("127.0.0.1", PAGE_PORT), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=page.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_script_timeout(30)
        driver.get(PAGE_ORIGIN + "/index.html")
        out = driver.execute_async_script(FETCH, server.url, KEY)
        assert out.get("push") == 200 and out.get("search") == 200, out
        assert any("结账按钮" in r["content"] for r in out["body"]["results"]), out
        # the same page with the wrong key: the browser lets it read the 401 (the answer names its origin)
        out = driver.execute_async_script(FETCH, server.url, "not-a-key-0123456789abcdef")
        assert out.get("push") == 401, out
    finally:
        driver.quit()
        page.shutdown()


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="chromium and chromedriver are not installed "
                    "(.ci/setup.d/chromium.sh)")
def test_a_page_on_an_unlisted_origin_is_blocked_by_the_browser(tmp_path):
    """The same page and server, with the page's origin not listed: the browser never hands the answer over."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    s = LiveServer(tmp_path / "data", workers=1, keys=KEYS).start()
    (tmp_path / "index.html").write_text("<!doctype html><title>elsewhere</title>")
    page = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=page.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_script_timeout(30)
        driver.get(f"http://127.0.0.1:{page.server_address[1]}/index.html")
        out = driver.execute_async_script(FETCH, s.url, KEY)
        assert "error" in out and "push" not in out, out
        assert requests.post(s.url + "/mcp/search", json={"query": "结账按钮"}, headers=s.headers(KEY),
                             timeout=10).json()["results"] == []       # the push never happened (403)
    finally:
        driver.quit()
        page.shutdown()
        s.stop()


# --- Origin: null (issue 39, finding 1) ------------------------------------------------------------------
# Every route a null-origin page must not reach, with the key that would otherwise be enough for it.
NULL_REFUSED = [("GET", "/mcp/export", None, ADMIN), ("POST", "/mcp/search", {"query": "cormorant"}, ADMIN),
                ("GET", "/mcp/units", None, ADMIN), ("GET", "/mcp/stats", None, ADMIN),
                ("POST", "/mcp/forget", {"query": "cormorant"}, ADMIN), ("GET", "/console/session", None, ADMIN),
                ("GET", "/metrics", None, ADMIN), ("POST", "/mcp/context", {"query": "cormorant"}, ADMIN),
                ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": "context_search", "arguments": {"query": "cormorant"}}}, ADMIN),
                ("POST", "/retrieval", {"knowledge_id": "", "query": "cormorant"}, ADMIN),
                ("GET", "/mcp/tools", None, ADMIN), ("DELETE", "/mcp/units/0123456789ab", None, ADMIN)]


@pytest.mark.parametrize("method,path,body,key", NULL_REFUSED, ids=[f"{m} {p}" for m, p, *_ in NULL_REFUSED])
def test_origin_null_reaches_nothing_but_the_push_route(server, method, path, body, key):
    rv = requests.request(method, server.url + path, json=body, timeout=10,
                          headers={**server.headers(key), "Origin": "null", "Accept": "application/json"})
    assert rv.status_code == 403, rv.text
    assert "cormorant" not in rv.text
    rv = preflight(server, "null", path)
    assert rv.status_code == 403 and "Access-Control-Allow-Methods" not in rv.headers
    # the same request from a listed web origin (or no browser at all) is answered
    rv = requests.request(method, server.url + path, json=body, timeout=10,
                          headers={**server.headers(key), "Origin": PAGE_ORIGIN, "Accept": "application/json"})
    assert rv.status_code != 403, rv.text


@pytest.mark.parametrize("origins", ["null", "*", "https://app.example,null"])
def test_origin_null_or_star_without_keys_is_refused_at_start(make_app, origins):
    with pytest.raises(RuntimeError, match="no API keys are configured"):
        make_app(allowed_origins=origins.split(","))
    make_app(allowed_origins=origins.split(","), api_keys="start-key-0123456789abcd:acme:push")    # keys: fine


PROBE = """<!doctype html><meta charset="utf-8"><title>probe</title><script>
// Runs the requests of the finding from wherever this document is (a sandboxed frame, file://, data:) and
// reports what it could read: each answer's status, or "blocked" when the browser withheld it.
async function probe(url, key, admin) {
  const out = {origin: String(self.origin)};
  const call = async (name, method, path, body, k) => {
    try {
      const headers = {"Authorization": "Bearer " + k};
      if (body) headers["Content-Type"] = "application/json";
      const rv = await fetch(url + path, {method, headers, body: body ? JSON.stringify(body) : undefined});
      const text = await rv.text();
      out[name] = rv.status + (text.includes("cormorant") ? " leaked" : "");
    } catch (e) { out[name] = "blocked"; }
  };
  await call("push", "POST", "/mcp/push", {type: "design_note", source: "figma_plugin_v1.2",
                                            content: "null origin push " + Date.now()}, key);
  await call("export", "GET", "/mcp/export", null, admin);
  await call("search", "POST", "/mcp/search", {query: "cormorant"}, admin);
  await call("forget", "POST", "/mcp/forget", {query: "cormorant"}, admin);
  await call("session", "GET", "/console/session", null, admin);
  await call("metrics", "GET", "/metrics", null, admin);
  await call("plain_export", "GET", "/mcp/export", null, "");
  return out;
}
const args = new URLSearchParams(location.hash.slice(1));
if (args.get("url")) probe(args.get("url"), args.get("key"), args.get("admin")).then((out) => {
  window.result = out;
  if (parent !== self) parent.postMessage(out, "*");
});
</script>"""
FRAMED = """<!doctype html><title>another site</title><script>
window.addEventListener("message", (ev) => { window.result = ev.data; });
</script><iframe sandbox="allow-scripts" src="probe.html#{args}"></iframe>"""


@contextlib.contextmanager
def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def result_of(driver, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = driver.execute_script("return window.result || null")
        if out:
            return out
        time.sleep(0.1)
    raise AssertionError("the page reported nothing")


def assert_pushes_only(out: dict, pushes: tuple = ("200",)) -> None:
    assert out["origin"] == "null", out
    assert out["push"] in pushes, out                    # the Figma plugin's one request
    for name in ("export", "search", "forget", "session", "metrics", "plain_export"):
        assert out[name] in ("blocked", "403"), (name, out)


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="chromium and chromedriver are not installed "
                    "(.ci/setup.d/chromium.sh)")
def test_a_sandboxed_frame_a_file_page_and_a_data_url_push_and_read_nothing(server, tmp_path):
    rv = requests.post(server.url + "/mcp/push", headers=server.headers(KEY), timeout=10,
                       json=make_unit("cormorant secret roadmap", source="figma_plugin_v1.2", type="design_note"))
    assert rv.status_code == 200
    args = f"url={quote(server.url)}&key={KEY}&admin={ADMIN}"
    (tmp_path / "probe.html").write_text(PROBE)
    (tmp_path / "framed.html").write_text(FRAMED.replace("{args}", args))
    page = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        with chromium() as driver:
            driver.set_script_timeout(30)
            # a sandboxed iframe on another site (that site's own origin is not listed)
            driver.get(f"http://127.0.0.1:{page.server_address[1]}/framed.html")
            assert_pushes_only(result_of(driver))
            # a file:// page
            driver.get((tmp_path / "probe.html").as_uri() + "#" + args)
            assert_pushes_only(result_of(driver))
            # a data: URL
            driver.get("data:text/html;charset=utf-8," + quote(PROBE.replace(
                "location.hash.slice(1)", json.dumps(args))))
            assert_pushes_only(result_of(driver), ("200", "blocked"))   # Chromium keeps data: pages off loopback
    finally:
        page.shutdown()


def test_vary_names_origin_once_beside_what_a_route_varies_on(make_app):
    """Every answer says it varies with Origin (a cache must not hand one origin's answer to another): written
    as Vary: Origin, or added to a Vary the route set."""
    from flask import Response

    from service.doors import allow_cross_origin
    app = make_app(allowed_origins=["https://console.example"])
    with app.test_request_context("/x", headers={"Origin": "https://console.example"}):
        rv = allow_cross_origin(Response("x"))
        assert rv.headers.get_all("Vary") == ["Origin"]
        assert rv.headers["Access-Control-Allow-Origin"] == "https://console.example"
        rv = allow_cross_origin(Response("x", headers={"Vary": "Accept-Encoding"}))
        assert rv.headers.get_all("Vary") == ["Accept-Encoding, Origin"]
        rv = allow_cross_origin(Response("x", headers={"Vary": "origin"}))
        assert rv.headers.get_all("Vary") == ["origin"]
    c = app.test_client()
    assert c.get("/healthz").headers.get_all("Vary") == ["Origin"]
    assert c.get("/healthz", headers={"Host": "LOCALHOST:5000"}).status_code == 200      # (any case, as before)
    assert c.get("/healthz", headers={"Host": "evil.example"}).status_code == 403
