"""The README as a newcomer follows it: `make run`, then its curl block verbatim (issue 14).

`make run` runs for real on a free port (`-o` keeps make from re-installing the venv the tests
already run in); the README's shell block is executed by bash with only the port changed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from conftest import ROOT, free_port, stop_group, wait_healthy

VENV = Path(sys.executable).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


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
        yield {"url": url, "port": port, "log": base / "make-run.log"}
    finally:
        stop_group(proc, timeout=30)
        log.close()


def curl_blocks() -> tuple[str, str]:
    """Try it's block (no keys, as `make run` on loopback) and the Docker section's keyed twin."""
    [plain, keyed] = [b for b in sh_blocks(README) if "curl" in b]
    assert "Authorization" not in plain and keyed.count('Authorization: Bearer $CONTEXT_API_KEY') == 3
    return plain, keyed


def run_try_it(block: str, port: int, env: dict | None = None) -> None:
    script = block.replace("localhost:5000", f"127.0.0.1:{port}")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    push, strong, chinese = out.stdout.splitlines()
    assert '"status":"ok"' in push.replace(" ", "")
    cid = re.search(r'"cid":\s*"([0-9a-f]{12})"', push).group(1)
    assert cid in strong and "ORD-7890" in strong
    assert cid in chinese and "**订单**" in chinese


def test_readme_curls_run_verbatim_against_make_run(make_run):
    run_try_it(curl_blocks()[0], make_run["port"])


def test_the_keyed_curls_run_verbatim_against_a_server_with_keys(tmp_path):
    """Issue 26, item 11: under compose (keys required) Try it's curls got 401; the README gives the keyed form."""
    from conftest import LiveServer
    key = "readme-key-0123456789abcdef"
    server = LiveServer(tmp_path / "data", workers=1, keys={key: ("default", ["push", "search"])})
    try:
        server.start()
        plain, keyed = curl_blocks()
        run_try_it(keyed, server.port, env=dict(os.environ, CONTEXT_API_KEY=key))
        script = plain.replace("localhost:5000", f"127.0.0.1:{server.port}")
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        assert out.stdout.count('"code":"missing_api_key"') == 3          # what the user saw: 401 each
    finally:
        server.stop()


def test_make_run_publishes_its_own_address_and_warns_that_dify_cannot_use_it(make_run):
    doc = requests.get(make_run["url"] + "/openapi.json", timeout=10).json()
    assert doc["servers"] == [{"url": make_run["url"]}]
    assert "names a loopback" in make_run["log"].read_text() or "loopback address" in make_run["log"].read_text()
