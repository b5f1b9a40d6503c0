"""Docs a newcomer reads stand alone in the repo, and their examples run; every document the code and the
guides cite exists, and every section of docs/design.md they cite is one of its headings."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import requests
import yaml

from conftest import ROOT
from pathlib import Path

GUIDES = [ROOT / "README.md", ROOT / "clients" / "MCP.md", *sorted((ROOT / "clients").glob("*/README.md")),
          *sorted((ROOT / "docs").glob("*.md"))]
KEY = "docs-key-0123456789abcdef"


def blocks(path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_guides_point_only_inside_the_repo(path):
    text = path.read_text(encoding="utf-8")
    assert BARE_DESIGN not in text, "the design document is docs/design.md"
    for target in re.findall(r"\]\(([^)#]+)\)", text):            # markdown links
        assert not target.startswith(".."), target
        if not re.match(r"[a-z]+://", target):
            assert (path.parent / target).exists(), target
    for ref in re.findall(r"`((?:docs|clients|service|tests|bench|requirements)/[\w./-]+)`", text):
        assert (ROOT / ref).exists(), f"{path.name} mentions {ref}, which does not exist"


# --- citations: documents and sections of the design document ----------------------------------------
# What is scanned: the code, the SQL, the tests, the benchmarks, the clients, the guides, and the files at the
# top of the repository (Makefile, compose files, ...). Generated benchmark output under bench/results/tmp/ is not.
CITING_DIRS = ("service", "sql", "tests", "bench", "clients", "docs", "tools", ".ci")
TEXT_SUFFIXES = {".py", ".sql", ".md", ".js", ".mjs", ".html", ".css", ".sh", ".toml", ".yml", ".yaml", ".json",
                 ".txt", ".example", ""}
# A repository document named by its path: docs/<name>.md, bench/README.md, clients/python/README.md, ...
DOC_REF = re.compile(r"(?<![\w./-])((?:docs|bench|clients|tests|service|sql|tools)/(?:[\w.-]+/)*[\w.-]+\.md)(?![\w/-])")
# A file of code named by its path: service/store/push.py, sql/sqlite/queries.sql, tools/pg_cluster.py, ...
SOURCE_REF = re.compile(r"(?<![\w./-])((?:service|sql|tests|bench|clients|tools|\.ci)/(?:[\w.-]+/)*[\w.-]+"
                        r"\.(?:py|sql|sh|mjs|js))(?![\w/-])")
# Records of past runs name the files of their day: bench/README.md is a log, bench/results/ its output.
RECORDS = ("bench/README.md", "bench/results/")
# Paths in test data that name no file of ours: a made-up test run the hooks' tests store as tool output.
NOT_OURS = {"tests/test_orders.py"}
DESIGN = "docs/design.md"
BARE_DESIGN = "DESIGN" + ".md"          # the name of a design file outside the repo (spelled apart: scanned too)
# "docs/design.md §4", "docs/design.md §7, §8", "docs/design.md §3 and §5", "docs/design.md §5.1", ...
SECTION_CITE = re.compile(re.escape(DESIGN) + r"((?:[ ,]*(?:and |or )?§\d+(?:\.\d+)?(?:'s)?)+)")
SECTION_NUMBER = re.compile(r"§(\d+(?:\.\d+)?)")
HEADING = re.compile(r"^#{2,4} +(\d+(?:\.\d+)?)\.? ", re.M)


def citing_files(root: Path):
    """Every text file of the repository (under ``root``) that may cite a document."""
    tops = [p for p in root.iterdir() if p.is_file()]
    for top in tops + [p for d in CITING_DIRS if (root / d).is_dir() for p in sorted((root / d).rglob("*"))]:
        rel = top.relative_to(root)
        if not top.is_file() or top.suffix not in TEXT_SUFFIXES or "__pycache__" in rel.parts \
                or "node_modules" in rel.parts or rel.parts[:3] == ("bench", "results", "tmp"):
            continue
        try:
            yield rel, top.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def missing_documents(root: Path) -> list[tuple[str, str]]:
    """(file, cited path) for every cited document or file of code that does not exist under ``root``."""
    out = []
    for rel, text in citing_files(root):
        refs = DOC_REF.findall(text)
        if not str(rel).startswith(RECORDS):
            refs += [ref for ref in SOURCE_REF.findall(text) if ref not in NOT_OURS]
        out += [(str(rel), ref) for ref in refs if not (root / ref).is_file()]
    return out


def bare_design_citations(root: Path) -> list[str]:
    """Files that cite the design document by a name it does not have (it is docs/design.md)."""
    return [str(rel) for rel, text in citing_files(root) if BARE_DESIGN in text]


def design_sections(root: Path) -> set[str]:
    """The section numbers of the design document: its headings "## 5. ...", "### 5.1 ..."."""
    path = root / DESIGN
    return set(HEADING.findall(path.read_text(encoding="utf-8"))) if path.is_file() else set()


def missing_sections(root: Path) -> list[tuple[str, str]]:
    """(file, §N) for every cited section of the design document that is none of its headings; the design
    document's own "§N" references count as citations too."""
    sections = design_sections(root)
    out = []
    for rel, text in citing_files(root):
        cited = [n for group in SECTION_CITE.findall(text) for n in SECTION_NUMBER.findall(group)]
        if str(rel) == DESIGN:
            cited += SECTION_NUMBER.findall(text)
        out += [(str(rel), "§" + n) for n in cited if n not in sections]
    return out


def test_every_cited_document_exists():
    assert missing_documents(ROOT) == []


def test_the_design_document_is_cited_by_its_path():
    assert bare_design_citations(ROOT) == []


def test_every_cited_section_of_the_design_document_is_a_heading_of_it():
    assert design_sections(ROOT), f"{DESIGN} has no numbered headings"
    assert missing_sections(ROOT) == []


def test_the_design_document_keeps_its_numbering():
    """Code comments cite sections by number: §1 to §14 in order, and the two storage and two search parts."""
    text = (ROOT / DESIGN).read_text(encoding="utf-8")
    top = [int(n) for n in re.findall(r"^## +(\d+)\. ", text, flags=re.M)]
    assert top == list(range(1, 15))
    assert {"5.1", "5.2", "6.1", "6.2"} <= design_sections(ROOT)
    for needle in (BARE_DESIGN, "../" + "shared"):        # (spelled apart: this file is scanned too)
        assert needle not in text


def test_the_citation_checks_fail_on_a_bogus_citation(tmp_path):
    """The scans above on a small tree: a missing document or file of code, a section the design document lacks
    and the design document by another name are found, cited the ways the code cites them; what exists is not
    reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "service").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Design\n\n## 1. One\n\n### 1.1 Part\n\nSee §1.1 and §3.\n")
    (tmp_path / "docs" / "other.md").write_text("A guide.\n")
    other, bogus = "docs/" + "other.md", "docs/" + "missing.md"   # (spelled apart: this file is scanned too)
    own, gone, a_py = "service/" + "a.py", "service/store/" + "gone.py", "service/" + "a.py"
    cite = DESIGN + " §"
    (tmp_path / "service" / "a.py").write_text(
        f'"""Cites {cite}1, {cite}1.1 and {cite}1, §2; {cite}4\'s lever; {DESIGN} §1 and §5.\n'
        f'Reads {other} and {bogus}; {own} and {gone}; see {BARE_DESIGN} section 3."""\n')
    (tmp_path / "README.md").write_text(f"The design: `{DESIGN}`; benchmarks: `bench/" + 'README.md`.\n')
    assert design_sections(tmp_path) == {"1", "1.1"}
    assert sorted(missing_documents(tmp_path)) == [("README.md", "bench/README.md"), (a_py, bogus), (a_py, gone)]
    assert sorted(missing_sections(tmp_path)) == [("docs/design.md", "§3"), (a_py, "§2"), (a_py, "§4"), (a_py, "§5")]
    assert bare_design_citations(tmp_path) == [a_py]


# --- every variable and file a guide names is real ---------------------------------------
# Read by the clients, not the service (service/cli/env.py, clients/): allowed by name, and each must
# really be read there. CONTEXT_HOOK_* are the agent hooks' settings (clients/python).
CLIENT_SETTINGS = ("CONTEXT_URL", "CONTEXT_API_KEY", "CONTEXT_MODE_API_KEY", "CONTEXT_MODE_MCP_URL")
CLIENT_PREFIXES = ("CONTEXT_HOOK_",)
# Read by the test suite (tests/conftest.py), named in the README's test section.
TEST_SETTINGS = ("CONTEXT_TEST_BACKEND",)
ENV_DOCS = [*GUIDES, ROOT / ".env.example"]      # (bench/README.md is a log: its history names what was)
REPO_TOP = {p.split("/", 1)[0] for p in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                                       check=True).stdout.splitlines()}


def service_settings() -> set[str]:
    import dataclasses
    from service.config import ENV_PREFIX, REMOVED, Config
    # (and the removed ones it refuses: a guide may say they are gone)
    return {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Config)} | set(REMOVED)


def compose_settings() -> set[str]:
    """What the compose files interpolate from .env (e.g. CONTEXT_API_KEY, CONTEXT_HOST_BIND, POSTGRES_PASSWORD)."""
    return {m for path in ROOT.glob("docker-compose*.yml")
            for m in re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", path.read_text(encoding="utf-8"))}


def client_sources() -> str:
    files = [ROOT / "service" / "cli" / "env.py", *(p for p in (ROOT / "clients").rglob("*")
                                                 if p.is_file() and p.suffix in (".py", ".mjs", ".js", ".json", ".ts"))]
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


@pytest.mark.parametrize("path", ENV_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_variable_a_guide_names_is_read_by_something(path):
    """The README named CONTEXT_ALLOWED_HOSTS, three other guides CONTEXT_MCP_ALLOWED_HOSTS (issue 26, item 6):
    a CONTEXT_* name in a guide is one service/config.py reads, a client setting the clients read, a
    compose variable, or the test suite's own."""
    service, compose, clients = service_settings(), compose_settings(), client_sources()
    tests_read = (ROOT / "tests" / "conftest.py").read_text()
    for name in sorted(set(re.findall(r"\bCONTEXT_[A-Z][A-Z0-9_]*", path.read_text(encoding="utf-8")))):
        if name.endswith("_"):                                # a prefix such as CONTEXT_HOOK_*
            assert name in CLIENT_PREFIXES, f"{path.name} names the prefix {name}*"
            continue
        if name in service or name in compose:
            continue
        if name in CLIENT_SETTINGS or name.startswith(CLIENT_PREFIXES):
            assert re.search(rf"\b{name}\b", clients), f"{path.name}: no client reads {name}"
            continue
        assert name in TEST_SETTINGS and name in tests_read, \
            f"{path.name} names {name}, which neither service/config.py nor a client nor compose reads"


def test_the_allow_lists_have_one_name_in_the_guides():
    """CONTEXT_MCP_ALLOWED_* still work (added, with a warning) but every guide says CONTEXT_ALLOWED_*."""
    for path in ENV_DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"CONTEXT_MCP_ALLOWED_\w+", text):
            around = text[max(0, m.start() - 120):m.end() + 120].lower()
            assert "older" in around, f"{path.name} uses {m.group()} as if it were the current name"


def repo_paths(text: str) -> set[str]:
    """Backticked paths whose first part is a top-level entry of this repository (others name the user's or
    another project's files: ``~/.cursor/mcp.json``, Dify's ``docker/.env``)."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in span.split():
            word = word.rstrip(",;:)").lstrip("(")
            if re.fullmatch(r"tools/(list|call)", word):
                continue                                      # MCP methods, not the tools/ folder
            if re.fullmatch(r"\.?[\w.*-]+(/[\w.*<>-]*)*", word) and word.split("/", 1)[0] in REPO_TOP:
                found.add(word)
    return found


@pytest.mark.parametrize("path", ENV_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_guide_names_exists(path):
    for ref in sorted(repo_paths(path.read_text(encoding="utf-8"))):
        if "<" in ref:
            continue                                          # a placeholder: `clients/<host>/...`
        matches = list(ROOT.glob(ref)) if "*" in ref else [ROOT / ref] if (ROOT / ref).exists() else []
        assert matches, f"{path.name} names {ref}, which is not in the repository"


def test_the_path_check_sees_paths():
    assert repo_paths("see `tools/container_base.sh`, `Dockerfile` and `~/.cursor/mcp.json` or `/data` "
                      "(`tools/list`)") == {"tools/container_base.sh", "Dockerfile"}


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
    scope: dict = {}
    lines = code.splitlines()
    # Keep each statement's value, as a reader at a REPL would see it.
    for i, line in enumerate(lines):
        m = re.match(r"(cm\.(?:search|context|recall)\(.*)$", line.split("  #")[0].strip())
        if m:
            lines[i] = f"_{i} = " + m.group(1)
    exec(compile("\n".join(lines), "README", "exec"), scope)      # as written: it defines its own `units`
    values = [scope[k] for k in sorted((k for k in scope if re.fullmatch(r"_\d+", k)), key=lambda k: int(k[1:]))]
    searched, context, recalled = values
    assert any("ORD-7890" in r["content"] for r in searched["results"])
    assert "ORD-7890" in context
    assert recalled and "ORD-7890" in recalled[0]["text"]
