"""CORS for the origins an operator lists (CONTEXT_ALLOWED_ORIGINS): a web page on another origin, or a Figma
plugin's sandboxed window (``Origin: null``), can call the service with its key; any other origin still gets
403 and no CORS answer. Against a real gunicorn with keys; the browser case in headless Chromium: a page
served from another loopback port pushes and searches with fetch, as clients/figma/ui.html does."""
from __future__ import annotations

import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from conftest import LiveServer, free_port, make_unit

KEY = "cors-writer-0123456789abcdef01"
KEYS = {KEY: ("acme", ["push", "search"])}
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
