"""The READMEs as a newcomer follows them: `make run`, then every command of their code blocks, in order.

README.md and every clients/*/README.md: each fenced block is either data (json, yaml, toml, text,
mermaid: configs, answers, a diagram) or commands (sh, console, python, js), and every command block
runs here against the service `make run` started, top to bottom, with only the port changed, unless
the line just before it names why it cannot run here:

    <!-- readme-test: not run: docker -->

(the reasons are NOT_RUN below, each saying what tests that part instead). Shell blocks run in bash with
`-euo pipefail` and a PATH holding nothing of the virtualenv, as in a newcomer's shell, where a bare
`context-mode` is "command not found"; each runs in a fresh shell in one scratch folder per document
whose top-level entries link into this repository (files carry over from block to block, exports do
not). Python blocks run in one namespace per document, as a REPL session would, and JavaScript blocks
as one node module per document.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from conftest import ROOT, LiveServer, free_port, stop_group, wait_healthy

VENV = Path(sys.executable).parent.parent
NODE = shutil.which("node")
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "clients").glob("*/README.md"))]

SHELL, PYTHON, JS = ("sh", "console", "bash"), ("python", "py"), ("js", "javascript")
DATA = ("json", "yaml", "toml", "text", "mermaid")
# <!-- readme-test: not run: <reason> --> right before a block: the block must hold the reason's sign.
NOT_RUN = {
    "make": ("make run", "`make run` is what the make_run fixture below starts, and `make test` is this suite"),
    "docker": ("docker", "needs a Docker engine; tests/test_docker_files.py lints the Dockerfile, validates the "
                         "compose files and runs the image's commands against a local gunicorn"),
    "keyed": ("Authorization: Bearer $CONTEXT_API_KEY", "needs a server with keys: "
              "test_the_keyed_curls_run_verbatim_against_a_server_with_keys runs it against one"),
    "lock": ("make lock", "re-resolves the lock files from PyPI and rewrites them"),
    "pip": ("pip install", "installs into the reader's own environment; `make` installed it into the "
                           "virtualenv these tests run in"),
    "package": ("context-mode run", "installs the package into the reader's own environment (pipx, uv); "
                "tests/test_wheel.py builds the wheels, installs them into a fresh venv, runs the server and "
                "`context-mode install claude-code`, whose hooks then store a session and give it back"),
    "dataset": ("make memory", "needs LoCoMo's locomo10.json, which the reader fetches (CC BY-NC 4.0, never "
                               "shipped here), and the bench tools; bench/README.md has the runs' figures"),
}
MARKER = re.compile(r"<!-- readme-test: not run: (\w+) -->")
FENCE = re.compile(r"^[ \t]*```(\S*)\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)


@dataclass
class Block:
    doc: str
    index: int
    lang: str
    text: str
    not_run: str | None        # a key of NOT_RUN

    @property
    def name(self) -> str:
        return f"{self.doc} block {self.index + 1} ({self.lang})"


def blocks(doc: str, text: str | None = None) -> list[Block]:
    text = (ROOT / doc).read_text(encoding="utf-8") if text is None else text
    out = []
    for i, m in enumerate(FENCE.finditer(text)):
        before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        out.append(Block(doc, i, m.group(1), m.group(2), marker.group(1) if marker else None))
    return out


# --- what the reader brings, as the test gives it ------------------------------------------------------
# The reader's own files that a block imports (clients/python/README.md's `context-mode import ...`).
USER_FILES = {
    "units.jsonl": '{"content": "ORD-7890 label printed"}\n{"content": "订单 ORD-7891 已签收", "type": "tool_output"}\n',
    "guide.md": "# Shipping\n\nOrders ship within a day.\n\n## Returns\n\nReturns take 14 days.\n",
    "notes.txt": "Call the carrier about ORD-7890.\n\nThe label printer jams on Mondays.\n",
}
# The reader answers "y" when `context-mode forget` asks to confirm.
ANSWERS = "y\ny\ny\n"
# Stand-ins for what the reader reads off an earlier answer: (document, text, replacement, why).
SUBSTITUTIONS = [
    ("README.md", "keys revoke 1f0c2a9be7d4",
     'keys revoke "$(.venv/bin/context-mode keys list | head -n 1 | cut -d " " -f 1)"',
     "an example id: the reader revokes one that `keys list` printed"),
]
# A stream stays open until Ctrl-C: the test gives each `curl -N` 5 s (curl's exit 28 is that timeout).
CURL_STREAM = re.compile(r"^(curl -N .*?)(\s+#.*)?$", re.M)


def for_this_server(block: Block, url: str) -> str:
    text = block.text
    for doc, old, new, _why in SUBSTITUTIONS:
        if doc == block.doc:
            text = text.replace(old, new)
    if block.lang in SHELL:
        text = CURL_STREAM.sub(lambda m: f"{m.group(1)} --max-time 5 || [ $? -eq 28 ]{m.group(2) or ''}", text)
    host = url.removeprefix("http://")
    return text.replace("localhost:5000", host).replace("127.0.0.1:5000", host)


def newcomer_env(url: str) -> dict:
    """A shell with nothing of the virtualenv on PATH and no CONTEXT_* settings but the server's address
    (what `make run` serves on 127.0.0.1:5000 is here on another port: the CLI's default, moved)."""
    venv_bin = str(VENV / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != Path(venv_bin).resolve())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXT_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PATH=path, CONTEXT_URL=url)
    return env


def scratch_checkout(base: Path) -> Path:
    """A folder whose top-level entries link into this repository (.venv to the virtualenv in use): what a
    block reads resolves, what it writes (keys.json, exports) stays out of the repository."""
    base.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in (".venv", ".git") and not (base / entry.name).exists():
            (base / entry.name).symlink_to(entry)
    if not (base / ".venv").exists():
        (base / ".venv").symlink_to(VENV)
    return base


@contextlib.contextmanager
def pushing_while(url: str, wanted: bool):
    """For blocks that wait on a stream for new units: a matching unit pushed every half second meanwhile."""
    stop = threading.Event()

    def run():
        for i in itertools.count():
            if stop.wait(0.5):
                return
            requests.post(url + "/mcp/push", timeout=10, json={
                "type": "tool_output", "source": "readme_test_pusher",
                "content": f"ORD-7890 out for delivery, update {i} {time.time_ns()}"})
    thread = threading.Thread(target=run, daemon=True)
    if wanted:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if wanted:
            thread.join(timeout=15)


def error_bodies(output: str) -> list[str]:
    """Lines of an answer that are this service's error shape (a curl prints a 4xx body and exits 0)."""
    return [line for line in output.splitlines() if re.search(r'"error"\s*:', line) and re.search(r'"code"\s*:', line)]


def run_shell(block: Block, url: str, cwd: Path) -> subprocess.CompletedProcess:
    script = for_this_server(block, url)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=newcomer_env(url), input=ANSWERS,
                          capture_output=True, text=True, timeout=120)


def run_python(code: str, scope: dict, timeout: float = 90) -> str:
    """``code`` executed in ``scope`` (the document's session) with a time bound; what it printed."""
    out, failure = io.StringIO(), []

    def run():
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, "README", "exec"), scope)
        except BaseException as e:    # noqa: BLE001  (reported below, with the block)
            failure.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout:.0f} s:\n{code}"
    if failure:
        raise AssertionError(f"{failure[0]!r} in:\n{code}") from failure[0]
    return out.getvalue()


# --- what some blocks must show, beyond running cleanly ------------------------------------------------
def check_try_it(output: str, cwd: Path) -> None:
    push, strong, chinese = output.splitlines()
    assert '"status":"ok"' in push.replace(" ", "")
    cid = re.search(r'"cid":\s*"([0-9a-f]{12})"', push).group(1)
    assert cid in strong and "ORD-7890" in strong
    assert cid in chinese and "**订单**" in chinese


def check_keys(output: str, cwd: Path) -> None:
    keys = json.loads((cwd / "keys.json").read_text())["keys"]       # two added (hashes only), one revoked
    assert len(keys) == 1 and "key" not in keys[0] and keys[0]["tenant"] == "acme"
    revoked = re.search(r"^revoked ([0-9a-f]{12}) \(tenant acme, ", output, re.M).group(1)
    assert not keys[0]["key_sha256"].startswith(revoked) and len(re.findall(r"^cms_", output, re.M)) == 2


def check_manage(output: str, cwd: Path) -> None:
    exported = (cwd / "all.jsonl").read_text(encoding="utf-8").splitlines()
    assert exported and all(json.loads(line)["cid"] for line in exported)
    assert re.search(r"^days stored [1-9]", output, re.M), output


def check_live(output: str, cwd: Path) -> None:
    assert "event: unit" in output and "ORD-7890 out for delivery" in output     # the stream got a pushed unit
    assert '"name":"get_weather"' in output.replace(" ", "")                      # and the tool search found it


def check_python_cli(output: str, cwd: Path) -> None:
    assert "ORD-7890" in output and re.search(r"^days stored [1-9]", output, re.M), output
    assert (cwd / "backup.jsonl").stat().st_size > 0


CHECKS = {  # (document, a text only that block holds) -> check(output, folder)
    ("README.md", "mcp/search?q=ORD-7890&consistency=strong'\n"): check_try_it,
    ("README.md", "keys revoke"): check_keys,
    ("README.md", "export all.jsonl"): check_manage,
    ("README.md", "mcp/stream?query=ORD-7890"): check_live,
    ("clients/python/README.md", "import notes.txt"): check_python_cli,
}


def checks_for(block: Block):
    return [check for (doc, sign), check in CHECKS.items() if doc == block.doc and sign in block.text]


# --- the service, as `make run` starts it ----------------------------------------------------------------
@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    base = tmp_path_factory.mktemp("make-run")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_")}
    env.update(CONTEXT_BIND=f"127.0.0.1:{port}", CONTEXT_DATA_DIR=str(base / "data"), CONTEXT_WORKERS="1")
    log = open(base / "make-run.log", "wb")
    proc = subprocess.Popen(["make", "--no-print-directory", "-o", f"{VENV}/.installed", f"VENV={VENV}", "run"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 120, lambda: (base / "make-run.log").read_text())
        yield {"url": url, "port": port, "log": base / "make-run.log", "scratch": tmp_path_factory.mktemp("reader")}
    finally:
        stop_group(proc, timeout=30)
        log.close()


# --- the documents' blocks are classified -----------------------------------------------------------------
@pytest.mark.parametrize("doc", DOCS)
def test_every_block_is_data_or_commands_and_every_skip_says_why(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = blocks(doc)
    assert text.count("```") == 2 * len(found), f"{doc}: a fence is not closed or not at a line start"
    for b in found:
        assert b.lang in SHELL + PYTHON + JS + DATA, f"{b.name}: unknown language (data or commands?)"
        if b.not_run is not None:
            assert b.not_run in NOT_RUN, f"{b.name}: say why in NOT_RUN: {b.not_run}"
            assert NOT_RUN[b.not_run][0] in b.text, f"{b.name} is marked '{b.not_run}' but holds no {NOT_RUN[b.not_run][0]!r}"
            assert b.lang not in DATA, f"{b.name}: data is never run; no marker needed"
    assert len(MARKER.findall(text)) == sum(b.not_run is not None for b in found), f"{doc}: a marker is not right before a block"


def test_the_stand_ins_still_match_what_they_stand_in_for():
    for doc, old, _new, why in SUBSTITUTIONS:
        assert sum(old in b.text for b in blocks(doc)) == 1, f"{doc} no longer holds {old!r} ({why})"
    for (doc, sign), check in CHECKS.items():
        assert sum(sign in b.text for b in blocks(doc)) == 1, f"{check.__name__}: {doc} has no single block with {sign!r}"
    shipped = " ".join(b.text for doc in DOCS for b in blocks(doc))
    for name in USER_FILES:
        assert name in shipped, f"USER_FILES: no block imports {name} any more"


# --- every command block runs, in order, against `make run` -------------------------------------------------
def run_document(doc: str, server: dict, text: str | None = None) -> list[str]:
    """Every block of ``doc`` that runs here, in order; the names of those that did."""
    url, ran = server["url"], []
    cwd = scratch_checkout(server["scratch"] / doc.replace("/", "_"))
    for name, content in USER_FILES.items():
        (cwd / name).write_text(content, encoding="utf-8")
    scope: dict = {}
    code = [b for b in blocks(doc, text) if b.not_run is None and b.lang in SHELL + PYTHON + JS]
    for b in (b for b in code if b.lang not in JS):
        with pushing_while(url, "stream" in b.text):
            if b.lang in SHELL:
                rv = run_shell(b, url, cwd)
                assert rv.returncode == 0, f"{b.name} failed ({rv.returncode}):\n{b.text}\n{rv.stdout[-3000:]}{rv.stderr[-3000:]}"
                output = rv.stdout
            else:
                output = run_python(for_this_server(b, url), scope)
        assert not error_bodies(output), f"{b.name} was answered with an error:\n{error_bodies(output)}"
        for check in checks_for(b):
            check(output, cwd)
        ran.append(b.name)
    if any(b.lang in JS for b in code):
        ran += run_javascript([b for b in code if b.lang in JS], url, cwd)
    return ran


def run_javascript(js: list[Block], url: str, cwd: Path) -> list[str]:
    if NODE is None:
        pytest.skip("node is not installed: the JavaScript blocks were not run")
    module = (ROOT / "clients" / "js" / "context-mode.mjs").as_uri()
    script = cwd / "readme.mjs"
    script.write_text("\n".join(for_this_server(b, url).replace('"./context-mode.mjs"', json.dumps(module)) for b in js))
    with pushing_while(url, any("stream" in b.text for b in js)):
        rv = subprocess.run([NODE, str(script)], cwd=cwd, env=newcomer_env(url), capture_output=True, text=True,
                            timeout=90)
    assert rv.returncode == 0, f"{js[0].doc}'s JavaScript failed:\n{rv.stdout[-3000:]}{rv.stderr[-3000:]}"
    assert not error_bodies(rv.stdout)
    return [b.name for b in js]


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_of_the_readmes_runs_in_order_against_make_run(make_run, doc):
    ran = run_document(doc, make_run)
    runnable = [b for b in blocks(doc) if b.lang not in DATA and b.not_run is None]
    assert len(ran) == len(runnable)


def test_a_bare_context_mode_fails_here_as_it_does_for_a_newcomer(make_run, tmp_path):
    """The check that caught the README's bare `context-mode` after `make run` (command not found): it still
    fails such a block, and passes the same with .venv/bin/."""
    url = make_run["url"]
    assert shutil.which("context-mode", path=newcomer_env(url)["PATH"]) is None, \
        "a context-mode outside the virtualenv is on PATH: this shell is not a newcomer's"
    text = "Try:\n\n```sh\ncontext-mode stats\n```\n\nAnd:\n\n```sh\n.venv/bin/context-mode stats\n```\n"
    bare, prefixed = blocks("README.md", text)
    cwd = scratch_checkout(tmp_path / "reader")
    rv = run_shell(bare, url, cwd)
    assert rv.returncode == 127 and "context-mode: command not found" in rv.stderr
    rv = run_shell(prefixed, url, cwd)
    assert rv.returncode == 0 and "days stored" in rv.stdout, rv.stderr


# --- the keyed twin of Try it, and what `make run` publishes ------------------------------------------------
def test_the_keyed_curls_run_verbatim_against_a_server_with_keys(tmp_path):
    """Under compose (keys required) Try it's curls got 401; the README gives the keyed form, which works."""
    key = "readme-key-0123456789abcdef"
    server = LiveServer(tmp_path / "data", workers=1, keys={key: ("default", ["push", "search"])})
    [plain] = [b for b in blocks("README.md") if "mcp/push" in b.text and b.not_run is None]
    [keyed] = [b for b in blocks("README.md") if b.not_run == "keyed"]
    assert keyed.text.count("Authorization: Bearer $CONTEXT_API_KEY") == 3
    try:
        server.start()
        env = dict(os.environ, CONTEXT_API_KEY=key)
        rv = subprocess.run(["bash", "-euo", "pipefail", "-c", for_this_server(keyed, server.url)], env=env,
                            capture_output=True, text=True, timeout=60)
        assert rv.returncode == 0, rv.stderr
        check_try_it(rv.stdout, tmp_path)
        rv = subprocess.run(["bash", "-c", for_this_server(plain, server.url)], capture_output=True, text=True,
                            timeout=60)
        assert rv.stdout.count('"code":"missing_api_key"') == 3          # what the reader saw: 401 each
    finally:
        server.stop()


def test_make_run_publishes_its_own_address_and_warns_that_dify_cannot_use_it(make_run):
    doc = requests.get(make_run["url"] + "/openapi.json", timeout=10).json()
    assert doc["servers"] == [{"url": make_run["url"]}]
    assert "names a loopback" in make_run["log"].read_text() or "loopback address" in make_run["log"].read_text()


# --- user-facing text carries no internal history --------------------------------------------------------
HISTORY = [r"\bissues? \d+", r"\bthis build machine\b", r"\bthis 2-core machine\b", r"\bat [0-9a-f]{7,40}\b"]


@pytest.mark.parametrize("doc", DOCS)
def test_user_facing_readmes_carry_no_internal_history(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    for pattern in HISTORY:
        assert not re.search(pattern, text, flags=re.I), f"{doc}: {re.search(pattern, text, flags=re.I).group()}"
