"""`context-mode install <agent>` and `uninstall` (issue 51): the hooks and the MCP entry merged into the agent's
own settings, with an absolute hook command that works, idempotent, a dry run that writes nothing, and an
uninstall that leaves every other setting as it was; the events are those of the shipped clients/*/settings.json."""
import json
import shlex
import subprocess

import pytest
import requests
from click.testing import CliRunner

from conftest import ROOT
from hooks_support import claude
from service.cli import main
from service.cli.install import AGENTS

OTHER_HOOK = {"matcher": "Bash", "hooks": [{"type": "command", "command": "/usr/local/bin/audit-log", "timeout": 3}]}


def run(*args):
    rv = CliRunner().invoke(main, list(map(str, args)))
    assert rv.exit_code == 0, rv.output
    return rv.output


def read(path):
    return json.loads(path.read_text())


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CONTEXT_URL", raising=False)
    (tmp_path / "proj" / ".claude").mkdir(parents=True)
    (tmp_path / "proj" / ".claude" / "settings.json").write_text(json.dumps(
        {"permissions": {"allow": ["Bash(ls)"]}, "hooks": {"PostToolUse": [OTHER_HOOK]}}))
    (tmp_path / "proj" / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "other-mcp"}}}))
    return tmp_path / "proj"


def test_install_merges_is_idempotent_and_uninstall_restores(project):
    settings, mcp = project / ".claude" / "settings.json", project / ".mcp.json"
    before = (read(settings), read(mcp))
    assert "would write" in run("install", "claude-code", "--project", project, "--dry-run")
    assert (read(settings), read(mcp)) == before                        # a dry run writes nothing
    out = run("install", "claude-code", "--project", project)
    assert f"wrote {settings}" in out and f"wrote {mcp}" in out
    got = read(settings)
    assert got["permissions"] == {"allow": ["Bash(ls)"]} and OTHER_HOOK in got["hooks"]["PostToolUse"]
    assert sorted(got["hooks"]) == sorted(e for e, _ in AGENTS["claude-code"].events)
    command = got["hooks"]["Stop"][0]["hooks"][0]["command"]
    executable = shlex.split(command)[0]
    assert executable.startswith("/") and subprocess.run([executable, "--help"], capture_output=True).returncode in (0, 2)
    assert read(mcp)["mcpServers"]["other"] == {"command": "other-mcp"}
    assert read(mcp)["mcpServers"]["context-mode"]["url"] == "http://127.0.0.1:5000/mcp"
    once = (settings.read_text(), mcp.read_text())
    assert "nothing to install" in run("install", "claude-code", "--project", project)
    assert (settings.read_text(), mcp.read_text()) == once              # twice is once
    run("uninstall", "claude-code", "--project", project)
    assert (read(settings), read(mcp)) == before                        # only what install wrote is gone


@pytest.mark.parametrize("agent", ["claude-code", "gemini-cli"])
def test_the_events_are_the_shipped_files(agent, project):
    """One truth: the installer's events, matchers and timeouts are clients/<agent>/settings.json's."""
    shipped = read(ROOT / "clients" / agent / "settings.json")["hooks"]
    run("install", agent, "--project", project)
    folder = AGENTS[agent].folder
    installed = read(project / folder / "settings.json")["hooks"]

    def shape(hooks):
        return {event: [(g.get("matcher"), [(h["command"].split()[-2:], h["timeout"], h.get("name")) for h in g["hooks"]
                                            if "context-mode-hook" in h["command"]]) for g in groups]
                for event, groups in hooks.items()}
    mine = {e: [g for g in gs if g[1]] for e, gs in shape(installed).items()}
    assert mine == shape(shipped)


def test_user_scope_keeps_the_rest_of_claudes_own_file(project, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text(json.dumps({"numStartups": 7, "projects": {"/x": {"a": 1}}}))
    run("install", "claude-code", "--scope", "user", "--url", "http://10.0.0.5:5000/")
    state = read(home / ".claude.json")
    assert state["numStartups"] == 7 and state["projects"] == {"/x": {"a": 1}}
    assert state["mcpServers"]["context-mode"]["url"] == "http://10.0.0.5:5000/mcp"
    hook = read(home / ".claude" / "settings.json")["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    assert hook.startswith("CONTEXT_URL=http://10.0.0.5:5000 /")


def test_a_settings_file_that_is_not_json_is_left_alone(project):
    settings = project / ".claude" / "settings.json"
    settings.write_text("{not json")
    rv = CliRunner().invoke(main, ["install", "claude-code", "--project", str(project)])
    assert rv.exit_code == 1 and "is not JSON" in rv.output and settings.read_text() == "{not json"


def test_the_installed_hook_command_stores_a_session(project, live_server, monkeypatch):
    """The command install wrote, run as Claude Code runs it (a shell, the event on stdin), stores the prompt."""
    run("install", "claude-code", "--project", project, "--url", live_server.url)
    hooks = read(project / ".claude" / "settings.json")["hooks"]
    for event, fields in (("SessionStart", {"source": "startup"}),
                          ("UserPromptSubmit", {"prompt": "installed hooks store this prompt"})):
        command = hooks[event][0]["hooks"][0]["command"]
        rv = subprocess.run(command, shell=True, input=json.dumps(claude(event, "sess-i", str(project), **fields)),
                            capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(project.parent / "home")})
        assert rv.returncode == 0, rv.stderr
    found = requests.post(live_server.url + "/mcp/search", json={"query": "installed hooks prompt",
                                                                 "consistency": "strong"}, timeout=10).json()
    assert [r["source"] for r in found["results"]][:1] == ["claude-code_prompt"]
