"""Docs a newcomer reads stand alone in the repo, and their examples run (issue 14, item 8)."""
from __future__ import annotations

import json
import re
import time

import pytest
import requests
import yaml

from conftest import ROOT

GUIDES = [ROOT / "README.md", ROOT / "clients" / "MCP.md", *sorted((ROOT / "clients").glob("*/README.md")),
          *sorted((ROOT / "docs").glob("*.md"))]
KEY = "docs-key-0123456789abcdef"


def blocks(path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_guides_point_only_inside_the_repo(path):
    text = path.read_text(encoding="utf-8")
    assert "DESIGN.md" not in text, "DESIGN.md is not in this repository"
    for target in re.findall(r"\]\(([^)#]+)\)", text):            # markdown links
        assert not target.startswith(".."), target
        if not re.match(r"[a-z]+://", target):
            assert (path.parent / target).exists(), target
    for ref in re.findall(r"`((?:docs|clients|service|tests|bench|requirements)/[\w./-]+)`", text):
        assert (ROOT / ref).exists(), f"{path.name} mentions {ref}, which does not exist"


def test_continue_guide_is_markdown_and_the_readme_points_to_it():
    assert "`clients/continue/README.md`" in (ROOT / "README.md").read_text()
    assert not list((ROOT / "clients").glob("continue*/*.py"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import LiveServer
    s = LiveServer(tmp_path_factory.mktemp("docs") / "data", workers=1, keys={KEY: ("acme", ["push", "search"])})
    try:
        yield s.start()
    finally:
        s.stop()


def test_continue_config_examples_work_as_continue_sends_them(server):
    """Both config forms from clients/continue/README.md, posted the way Continue's http provider does."""
    guide = ROOT / "clients" / "continue" / "README.md"
    rv = requests.post(server.url + "/mcp/push", headers=server.headers(KEY), timeout=10, json={
        "type": "tool_output", "source": "docs_v1", "timestamp": int(time.time()),
        "content": "订单 ORD-7890 已发货 shipped"})
    assert rv.status_code == 200, rv.text
    [yml] = blocks(guide, "yaml")
    [js] = blocks(guide, "json")
    params = [yaml.safe_load(yml)["context"][0]["params"], json.loads(js)["contextProviders"][0]["params"]]
    for p in params:
        url = p["url"].replace("http://127.0.0.1:5000", server.url)
        options = dict(p["options"])     # a default search: read-your-writes finds the unit just pushed
        headers = {k: re.sub(r"\$\{\{ secrets\.CONTEXT_API_KEY \}\}|cms_your_key", KEY, v)
                   for k, v in options["headers"].items()}
        rv = requests.post(url, timeout=10, headers={"Content-Type": "application/json", **headers},
                           data=json.dumps({"query": "ORD-7890", "fullInput": "@Context Mode ORD-7890",
                                            "options": options}))
        assert rv.status_code == 200, rv.text
        items = rv.json()
        assert items and "ORD-7890" in items[0]["content"] and p["title"] == "context-mode"


def test_python_client_readme_runs_and_finds_what_it_pushed(server):
    """The issue: following clients/python/README top to bottom, context() and recall() came back empty."""
    [code] = blocks(ROOT / "clients" / "python" / "README.md", "python")
    code = code.replace('"http://localhost:5000"', repr(server.url)).replace('api_key="..."', f"api_key={KEY!r}")
    prelude = "units = [make_unit('README batch unit ' + str(i), source='readme_v1') for i in range(3)]\n"
    scope: dict = {}
    lines = code.splitlines()
    # Keep each statement's value, as a reader at a REPL would see it.
    for i, line in enumerate(lines):
        m = re.match(r"(cm\.(?:search|context|recall)\(.*)$", line.split("  #")[0].strip())
        if m:
            lines[i] = f"_{i} = " + m.group(1)
    exec(compile(prelude.join(["\n".join(lines[:1]) + "\n", "\n".join(lines[1:])]), "README", "exec"), scope)
    values = [scope[k] for k in sorted((k for k in scope if re.fullmatch(r"_\d+", k)), key=lambda k: int(k[1:]))]
    searched, context, recalled = values
    assert any("ORD-7890" in r["content"] for r in searched["results"])
    assert "ORD-7890" in context
    assert recalled and "ORD-7890" in recalled[0]["text"]
