"""`context-mode push | search | import` against a real gunicorn, run as the installed console script."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import make_unit

CLI = Path(sys.executable).parent / "context-mode"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import LiveServer
    s = LiveServer(tmp_path_factory.mktemp("cli") / "data", workers=1, keys={"clikey-0123456789abcdef": ("acme", ["push", "search"])})
    try:
        s.start()
        yield s
    finally:
        s.stop()


def run(server, *args, key="clikey-0123456789abcdef", stdin=None):
    env = dict(os.environ, CONTEXT_URL=server.url, CONTEXT_API_KEY=key)
    return subprocess.run([str(CLI), *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)


def test_push_then_search(server):
    rv = run(server, "push", "--source", "cli_v1_ci", "--type", "user_input", "--metadata", '{"k": 1}',
             "订单 CLITAG-1 查询")
    assert rv.returncode == 0, rv.stderr
    cid, status, seq = rv.stdout.split()
    assert len(cid) == 12 and status == "ok" and seq.startswith("seq=")
    rv = run(server, "push", "--source", "cli_v1_ci", "-", stdin="CLITAG-1 answer from stdin")
    assert rv.returncode == 0, rv.stderr
    rv = run(server, "search", "CLITAG-1", "--strong")
    assert rv.returncode == 0, rv.stderr
    lines = rv.stdout.strip().splitlines()
    assert len(lines) == 2 and any(cid in line for line in lines)
    rv = run(server, "search", "CLITAG-1", "--strong", "--type", "user_input", "--json")
    assert [r["cid"] for r in json.loads(rv.stdout)["results"]] == [cid]


def test_errors_are_reported_with_the_servers_code(server):
    rv = run(server, "search", "x", key="wrong")
    assert rv.returncode == 1
    assert "invalid_api_key" in rv.stderr
    rv = run(server, "push", "--source", "cli_v1_ci", "--ttl", "0", "text")
    assert rv.returncode == 1 and "ttl" in rv.stderr
    rv = run(server, "push", "--source", "s", "--metadata", "{bad", "text")
    assert rv.returncode == 2 and "--metadata" in rv.stderr


def test_import_jsonl_with_bad_lines(server, tmp_path):
    now = int(time.time())
    good = [make_unit(f"IMPORTTAG row {i}", timestamp=now - i) for i in range(7)]
    lines = [json.dumps(u) for u in good[:3]]
    lines += ["{not json", "", "[1, 2]"]
    lines += [json.dumps(dict(good[3], cid="000000000000"))]               # wrong CID
    lines += [json.dumps(make_unit("expired", timestamp=now - 7200, ttl=60))]  # already expired
    lines += [json.dumps(u) for u in good[4:]]
    lines += [json.dumps(good[0])]                                          # duplicate
    path = tmp_path / "units.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    rv = run(server, "import", str(path), "--batch-size", "3")
    assert rv.returncode == 1, rv.stdout + rv.stderr
    out = rv.stdout
    assert "imported 6 new, 1 duplicate, 4 failed" in out
    assert "line 4: invalid_json" in out
    assert "line 6: invalid_unit" in out
    assert "line 7: invalid_cid" in out
    assert "line 8: already_expired" in out
    assert "importing" in rv.stderr                                         # the progress bar

    rv = run(server, "search", "IMPORTTAG", "--strong", "--top-k", "20")
    assert len(rv.stdout.strip().splitlines()) == 6

    # The good units again (good[3] was refused for its CID, so it is new now); a clean file exits 0.
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(json.dumps(u) for u in good) + "\n", encoding="utf-8")
    rv = run(server, "import", str(clean))
    assert rv.returncode == 0, rv.stdout + rv.stderr
    assert "imported 1 new, 6 duplicate, 0 failed" in rv.stdout


def test_unreachable_server(tmp_path):
    from conftest import free_port
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(make_unit("x")) + "\n")
    env = dict(os.environ, CONTEXT_URL=f"http://127.0.0.1:{free_port()}")
    env.pop("CONTEXT_API_KEY", None)
    rv = subprocess.run([str(CLI), "search", "x"], env=env, capture_output=True, text=True, timeout=120)
    assert rv.returncode == 1 and "connection_error" in rv.stderr
