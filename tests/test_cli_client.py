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


def test_the_old_key_variable_still_works_with_a_warning(server):
    env = {k: v for k, v in os.environ.items() if k != "CONTEXT_API_KEY"}
    env.update(CONTEXT_URL=server.url, CONTEXT_MODE_API_KEY="clikey-0123456789abcdef")
    rv = subprocess.run([str(CLI), "search", "x"], env=env, capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stderr
    assert "CONTEXT_MODE_API_KEY is deprecated; set CONTEXT_API_KEY" in rv.stderr
    # The current name wins over the old one, silently.
    env["CONTEXT_API_KEY"], env["CONTEXT_MODE_API_KEY"] = "clikey-0123456789abcdef", "wrong"
    rv = subprocess.run([str(CLI), "search", "x"], env=env, capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0 and "deprecated" not in rv.stderr, rv.stderr


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


def test_push_without_source_uses_a_default(server):
    rv = run(server, "push", "NOSRCTAG no source given")
    assert rv.returncode == 0, rv.stderr
    cid = rv.stdout.split()[0]
    rv = run(server, "search", "NOSRCTAG", "--strong", "--json")
    assert [(r["cid"], r["source"]) for r in json.loads(rv.stdout)["results"]] == [(cid, "context-mode_cli")]


def _found(server, query):
    rv = run(server, "search", query, "--strong", "--json", "--top-k", "50")
    assert rv.returncode == 0, rv.stderr
    return json.loads(rv.stdout)["results"]


def test_import_minimal_jsonl_lines_gets_defaults(server, tmp_path):
    """Issue 14, item 5: {"content"} alone is enough; type, source, timestamp and ttl get defaults."""
    path = tmp_path / "minimal.jsonl"
    path.write_text("\n".join(json.dumps(u) for u in [
        {"content": "MINTAG one"}, {"content": "MINTAG two", "source": "notes_v1"},
        {"content": "MINTAG three", "type": "user_input", "ttl": 120}]) + "\n", encoding="utf-8")
    before = int(time.time())
    rv = run(server, "import", str(path))
    assert rv.returncode == 0, rv.stdout + rv.stderr
    assert "imported 3 new, 0 duplicate, 0 failed" in rv.stdout
    got = {r["content"]: r for r in _found(server, "MINTAG")}
    assert got["MINTAG one"]["source"] == "import_minimal.jsonl" and got["MINTAG one"]["type"] == "tool_output"
    assert got["MINTAG one"]["ttl"] == 2_592_000                                   # the server's default
    assert got["MINTAG two"]["source"] == "notes_v1"
    assert got["MINTAG three"]["type"] == "user_input" and got["MINTAG three"]["ttl"] == 120
    assert len({r["timestamp"] for r in got.values()}) == 1 and got["MINTAG one"]["timestamp"] >= before


def test_import_progress_bar_shows_counts_on_a_terminal(server, tmp_path):
    import pty
    path = tmp_path / "bar.jsonl"
    path.write_text("".join(json.dumps({"content": f"BARTAG {i}"}) + "\n" for i in range(5)) + "{bad\n")
    master, slave = pty.openpty()
    env = dict(os.environ, CONTEXT_URL=server.url, CONTEXT_API_KEY="clikey-0123456789abcdef")
    proc = subprocess.run([str(CLI), "import", str(path), "--batch-size", "2"], env=env, stdout=subprocess.PIPE,
                          stderr=slave, text=True, timeout=60)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    bar = b"".join(chunks).decode()
    assert proc.returncode == 1
    assert "importing jsonl" in bar and "6/6" in bar and "5 new, 0 duplicate, 1 failed" in bar, bar


def test_import_markdown_is_split_at_headings(server, tmp_path):
    path = tmp_path / "guide.md"
    path.write_text("Intro MDTAG before any heading.\n\n# Orders\n\nMDTAG 订单 ORD-1 shipped.\n\n"
                    "## Refunds\n\nMDTAG refunds take five days.\n\n```sh\n# not a heading MDTAG\n```\n\n"
                    "# Returns\n\nMDTAG returns within 30 days.\n", encoding="utf-8")
    rv = run(server, "import", str(path), "--source", "docs_v1", "--type", "system_notice")
    assert rv.returncode == 0, rv.stdout + rv.stderr
    assert "imported 4 new" in rv.stdout and "importing markdown" in rv.stderr
    got = sorted(_found(server, "MDTAG"), key=lambda r: r["metadata"]["line"])
    assert [r["metadata"].get("section") for r in got] == [None, "Orders", "Orders > Refunds", "Returns"]
    assert got[2]["content"].startswith("## Refunds") and "# not a heading MDTAG" in got[2]["content"]
    assert {(r["source"], r["type"]) for r in got} == {("docs_v1", "system_notice")}
    assert got[1]["metadata"] == {"file": "guide.md", "line": 3, "section": "Orders"}


def test_import_plain_text_is_split_into_paragraph_units(server, tmp_path):
    path = tmp_path / "notes.txt"
    paragraphs = [f"TXTTAG paragraph {i} " + "word " * 60 for i in range(6)]
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    rv = run(server, "import", str(path), "--max-chars", "700")
    assert rv.returncode == 0, rv.stdout + rv.stderr
    got = _found(server, "TXTTAG")
    assert len(got) == 3 and all(len(r["content"]) <= 700 for r in got)
    assert sorted(" ".join(r["content"] for r in got).split()) == sorted(" ".join(paragraphs).split())


def test_unreachable_server(tmp_path):
    from conftest import free_port
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(make_unit("x")) + "\n")
    env = dict(os.environ, CONTEXT_URL=f"http://127.0.0.1:{free_port()}")
    env.pop("CONTEXT_API_KEY", None)
    rv = subprocess.run([str(CLI), "search", "x"], env=env, capture_output=True, text=True, timeout=120)
    assert rv.returncode == 1 and "connection_error" in rv.stderr


def test_push_to_a_project_or_everywhere(server):
    """--project sets metadata.project, --global metadata.global: search --project then sees that project's
    units and the global ones, never another project's."""
    cids = {}
    for name, args in (("alpha", ["--project", "/repo/alpha"]), ("beta", ["--project", "/repo/beta"]),
                       ("everywhere", ["--global", "--metadata", '{"k": 2}'])):
        rv = run(server, "push", "--source", "cli_v1_ci", *args, f"SCOPETAG note {name}")
        assert rv.returncode == 0, rv.stderr
        cids[name] = rv.stdout.split()[0]
    for project, want in (("/repo/alpha", {"alpha", "everywhere"}), ("/repo/beta", {"beta", "everywhere"})):
        rv = run(server, "search", "SCOPETAG", "--strong", "--project", project, "--json")
        assert rv.returncode == 0, rv.stderr
        assert {r["cid"] for r in json.loads(rv.stdout)["results"]} == {cids[n] for n in want}
    rv = run(server, "search", "SCOPETAG", "--strong", "--json")
    found = {r["cid"]: r["metadata"] for r in json.loads(rv.stdout)["results"]}
    assert found[cids["everywhere"]] == {"k": 2, "global": True}
    assert found[cids["alpha"]] == {"project": "/repo/alpha"}
    rv = run(server, "push", "--global", "--metadata", "[1]", "x")
    assert rv.returncode == 2 and "--metadata" in rv.stderr
