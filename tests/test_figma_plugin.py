"""The Figma plugin (clients/figma, issue 27) under `node --test` against a real gunicorn set up as its README
says (keys, the design_note type, Origin null listed): Figma cannot run here, so code.js runs with a stand-in
`figma` global (see its test), and its key needs push and search (it reads back what it stored)."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT

NODE = shutil.which("node")
KEY = "figma-key-0123456789abcdef"


@pytest.mark.skipif(NODE is None, reason="node is not installed: the Figma plugin was not tested")
def test_figma_plugin_against_live_server(live_server_factory):
    server = live_server_factory(workers=1, keys={KEY: ("design", ["push", "search"])},
                                 env={"CONTEXT_EXTRA_TYPES": "design_note", "CONTEXT_ALLOWED_ORIGINS": "null"})
    env = dict(os.environ, CONTEXT_URL=server.url, CONTEXT_API_KEY=KEY)
    files = sorted(str(p) for p in (ROOT / "clients" / "figma" / "test").glob("*.test.mjs"))
    assert files, "no clients/figma/test/*.test.mjs found"
    rv = subprocess.run([NODE, "--test", *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rv.returncode == 0, rv.stdout[-4000:] + rv.stderr[-2000:]
    assert "# skipped 0" in rv.stdout and "# fail 0" in rv.stdout
    assert "# pass 3" in rv.stdout
