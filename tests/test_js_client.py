"""The JavaScript client (clients/js) under `node --test` against a real gunicorn."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT

NODE = shutil.which("node")
JS_TESTS = ROOT / "clients" / "js" / "test"


@pytest.mark.skipif(NODE is None, reason="node is not installed: the JS client was not tested")
def test_js_client_against_live_server(live_server_factory):
    server = live_server_factory(workers=1, keys={"jskey-0123456789abcdef": ("jsteam", ["push", "search", "admin"])})
    env = dict(os.environ, CONTEXT_URL=server.url, CONTEXT_API_KEY="jskey-0123456789abcdef")
    files = sorted(str(p) for p in JS_TESTS.glob("*.test.mjs"))
    assert files, "no clients/js/test/*.test.mjs found"
    rv = subprocess.run([NODE, "--test", *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rv.returncode == 0, rv.stdout[-4000:] + rv.stderr[-2000:]
    assert "# skipped 0" in rv.stdout, rv.stdout[-2000:]
    assert "# fail 0" in rv.stdout
