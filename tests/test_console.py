"""The web console's server side (issue 15): what /console serves, with which headers, and the sign-in check.
The console itself is driven in a real browser by tests/test_console_browser.py."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT

STATIC = ROOT / "service" / "console" / "static"
KEY = "console-key-0123456789abcdef"
KEYS = {KEY: ("acme", ["push", "search"])}          # the ``keyed`` client's (tests/conftest.py)


def csp(rv) -> dict[str, str]:
    policy = rv.headers["Content-Security-Policy"]
    return {d.split()[0]: " ".join(d.split()[1:]) for d in (x.strip() for x in policy.split(";")) if d}


@pytest.mark.parametrize("path,mimetype", [("/console", "text/html"), ("/console/", "text/html"),
                                           ("/console/console.js", "text/javascript"),
                                           ("/console/console.css", "text/css"),
                                           ("/console/favicon.svg", "image/svg+xml")])
def test_every_console_file_has_a_strict_policy(keyed, path, mimetype):
    rv = keyed.get(path)              # no key needed: the files hold no tenant data
    assert rv.status_code == 200 and rv.mimetype == mimetype
    policy = csp(rv)
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'" and policy["connect-src"] == "'self'"
    assert "unsafe" not in rv.headers["Content-Security-Policy"]
    assert policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'" and policy["form-action"] == "'none'"
    assert policy["require-trusted-types-for"] == "'script'"
    assert rv.headers["X-Content-Type-Options"] == "nosniff" and rv.headers["Referrer-Policy"] == "no-referrer"
    assert rv.headers["X-Frame-Options"] == "DENY"
    assert "Set-Cookie" not in rv.headers


def test_the_root_leads_to_the_console(keyed):
    rv = keyed.get("/")
    assert rv.status_code == 302 and rv.headers["Location"] == "/console/"


def test_only_the_console_files_are_served(keyed):
    for name in ("index.html.bak", "..%2F__init__.py", "%2e%2e", "console.js.map", "x"):
        rv = keyed.get(f"/console/{name}")
        assert rv.status_code == 404 and rv.get_json()["code"] == "not_found"


def test_session_says_who_the_key_is_and_needs_one(keyed):
    assert keyed.get("/console/session").status_code == 401
    assert keyed.get("/console/session", headers={"Authorization": "Bearer wrong-key-0123456789abc"}).status_code == 401
    rv = keyed.get("/console/session", headers={"Authorization": f"Bearer {KEY}"})
    assert rv.status_code == 200 and rv.headers["Cache-Control"] == "no-store"
    assert rv.get_json() == {"tenant": "acme", "scopes": ["push", "search"], "open": False,
                             "types": ["user_input", "model_thinking", "tool_output", "system_notice"]}


def test_session_in_no_keys_mode_opens_directly(client):
    body = client.get("/console/session").get_json()
    assert body["open"] is True and body["tenant"] == "default" and "admin" in body["scopes"]


def test_the_page_has_no_inline_code_and_loads_nothing_from_elsewhere():
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline <script>"
    assert "<style" not in html and " style=" not in html and not re.search(r"\son[a-z]+=", html)
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert url.startswith("/console/") or url.startswith("#"), url
    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), f"{path.name} names another origin"


def test_the_script_never_parses_markup_or_code():
    """Belt to the policy's braces: the script has no sink that would turn a string into HTML or code."""
    source = (STATIC / "console.js").read_text(encoding="utf-8")
    js = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))   # code, not comments
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setTimeout(\"", "createContextualFragment", "srcdoc", "javascript:"):
        assert sink not in js, sink
    assert "localStorage.setItem(KEY_SLOT" not in js and "sessionStorage.setItem(KEY_SLOT" in js
    assert "document.cookie" not in js
