"""`context-mode install <agent>` and `uninstall` (issue 51): the hooks and the MCP entry merged into the agent's
own settings, with an absolute hook command that works, idempotent, a dry run that writes nothing, and an
uninstall that leaves every other setting as it was; the events are those of the shipped clients/*/settings.json."""
import json
import shlex
import subprocess
import sys

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
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)                # (install's record of the files it made)
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
    installed = read(AGENTS[agent].settings("project", project))["hooks"]

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


@pytest.mark.parametrize("agent", ["claude-code", "gemini-cli", "codex"])
def test_uninstall_removes_a_file_only_if_install_created_it(agent, tmp_path, project):
    """Review of issue 51: uninstall removed every settings file it left empty, a user's own ``{}`` too. Only a
    file install created goes; one that was there before, empty, is written back empty and kept."""
    fresh, home = tmp_path / "fresh", tmp_path / "home"
    fresh.mkdir()
    mcp = AGENTS[agent].mcp_file("project", fresh)
    hooks = AGENTS[agent].settings("project", fresh)
    mcp.parent.mkdir(exist_ok=True)
    mcp.write_text("\n" if mcp.suffix == ".toml" else "{}")                     # the user's, before install
    made = {hooks} - {None, mcp}                                                # (Gemini CLI: one file for both)
    out = run("install", agent, "--project", fresh)
    assert all(f"wrote {p}" in out and p.exists() for p in {mcp} | made), out
    record = home / ".local" / "state" / "context-mode" / "installed-files.json"
    assert (read(record)["created"] if record.exists() else []) == sorted(map(str, made))
    dry = run("uninstall", agent, "--project", fresh, "--dry-run")
    assert f"would write {mcp}" in dry and all(f"would remove {p}" in dry for p in made), dry
    out = run("uninstall", agent, "--project", fresh)
    assert f"wrote {mcp}" in out and all(f"removed {p}" in out and not p.exists() for p in made), out
    assert mcp.read_text().strip() in ("{}", "")                                # kept, as empty as it was
    run("install", agent, "--project", fresh)
    run("uninstall", agent, "--project", fresh)
    assert mcp.exists() and not any(p.exists() for p in made)


def test_a_settings_file_that_is_not_json_is_left_alone(project):
    settings = project / ".claude" / "settings.json"
    settings.write_text("{not json")
    rv = CliRunner().invoke(main, ["install", "claude-code", "--project", str(project)])
    assert rv.exit_code == 1 and "is not JSON" in rv.output and settings.read_text() == "{not json"


def test_a_hook_command_written_before_the_hooks_package_is_still_ours(project):
    """Where no context-mode-hook was beside the interpreter, install wrote ``python -m context_mode_client.hook``,
    the module before the hooks became a package: it still runs them, and install and uninstall still know it."""
    settings = project / ".claude" / "settings.json"
    old = f"{shlex.quote(sys.executable)} -m context_mode_client.hook"
    written = read(settings)
    written["hooks"]["Stop"] = [{"hooks": [{"type": "command", "command": f"{old} claude-code Stop", "timeout": 5}]}]
    settings.write_text(json.dumps(written))
    rv = subprocess.run(shlex.split(old) + ["--help"], capture_output=True, text=True, timeout=30)
    assert rv.returncode == 0 and rv.stderr.startswith("usage: context-mode-hook <client> <event>")
    run("install", "claude-code", "--project", project)
    stops = [h["command"] for group in read(settings)["hooks"]["Stop"] for h in group["hooks"]]
    assert len(stops) == 1 and "context_mode_client.hook " not in stops[0]        # replaced, not doubled
    run("uninstall", "claude-code", "--project", project)
    assert "Stop" not in read(settings)["hooks"] and OTHER_HOOK in read(settings)["hooks"]["PostToolUse"]


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


def _ours(entries):
    """(event's hook, its matcher, its timeout) of our entries in a flat hooks file (Cursor, VS Code)."""
    return {event: [(h["command"].split()[-2:], h.get("matcher"), h["timeout"]) for h in hooks
                    if "context-mode-hook" in h["command"]] for event, hooks in entries.items()}


def test_cursor_hooks_and_mcp_merge_match_the_shipped_files_and_uninstall_restores(project):
    """Cursor (issue 51): its hooks.json (flat entries, ``version``) and mcp.json, merged with another tool's,
    the events those of clients/.cursor/hooks.json, the MCP entry that of clients/.cursor/mcp.json."""
    hooks, mcp = project / ".cursor" / "hooks.json", project / ".cursor" / "mcp.json"
    hooks.parent.mkdir()
    other = {"command": "/usr/local/bin/audit", "timeout": 2}
    hooks.write_text(json.dumps({"version": 1, "hooks": {"postToolUse": [other]}}))
    mcp.write_text(json.dumps({"mcpServers": {"other": {"command": "other-mcp"}}}))
    before = (read(hooks), read(mcp))
    run("install", "cursor", "--project", project)
    got = read(hooks)
    assert got["version"] == 1 and other in got["hooks"]["postToolUse"]
    assert _ours(got["hooks"]) == _ours(read(ROOT / "clients" / ".cursor" / "hooks.json")["hooks"])
    assert all(shlex.split(h["command"])[0].startswith("/") for hs in got["hooks"].values() for h in hs)
    shipped = read(ROOT / "clients" / ".cursor" / "mcp.json")["mcpServers"]["context-mode"]
    assert read(mcp)["mcpServers"] == {"other": {"command": "other-mcp"}, "context-mode": shipped}
    assert "nothing to install" in run("install", "cursor", "--project", project)
    run("uninstall", "cursor", "--project", project)
    assert (read(hooks), read(mcp)) == before


def test_vscode_hooks_are_a_file_of_their_own_and_the_key_is_asked_once(project):
    """VS Code Copilot: .github/hooks/context-mode.json (ours alone: uninstall removes it) and .vscode/mcp.json's
    ``servers`` with the ``inputs`` prompt for the key, as clients/.vscode/mcp.json."""
    hooks, mcp = project / ".github" / "hooks" / "context-mode.json", project / ".vscode" / "mcp.json"
    mcp.parent.mkdir()
    mcp.write_text(json.dumps({"servers": {"other": {"type": "stdio", "command": "x"}}}))
    out = run("install", "vscode-copilot", "--project", project)
    assert f"wrote {hooks}" in out
    assert _ours(read(hooks)["hooks"]) == _ours(read(ROOT / "clients" / ".github" / "hooks" / "context-mode.json")["hooks"])
    shipped = read(ROOT / "clients" / ".vscode" / "mcp.json")
    got = read(mcp)
    assert got["servers"]["context-mode"] == shipped["servers"]["context-mode"] and "other" in got["servers"]
    assert [i["id"] for i in got["inputs"]] == [i["id"] for i in shipped["inputs"]]
    run("install", "vscode-copilot", "--project", project)
    assert len(read(mcp)["inputs"]) == 1                                # twice is once
    run("uninstall", "vscode-copilot", "--project", project)
    assert not hooks.exists() and read(mcp) == {"servers": {"other": {"type": "stdio", "command": "x"}}}


def test_vscode_user_scope_writes_the_user_hooks_folder_and_the_profiles_mcp_json(project, tmp_path):
    """VS Code's user scope: ~/.copilot/hooks (a file of ours in it) and the user profile's mcp.json
    (~/.config/Code/User on Linux), merged with the profile's other servers; the project is not touched, and
    uninstall takes out what install wrote, removing the hooks file."""
    home = tmp_path / "home"
    hooks, mcp = home / ".copilot" / "hooks" / "context-mode.json", home / ".config" / "Code" / "User" / "mcp.json"
    mcp.parent.mkdir(parents=True)
    mcp.write_text(json.dumps({"servers": {"other": {"type": "stdio", "command": "x"}}}))
    before = {p: p.read_text() for p in project.rglob("*") if p.is_file()}
    out = run("install", "vscode-copilot", "--scope", "user", "--url", "http://10.0.0.5:5000")
    assert f"wrote {hooks}" in out and f"wrote {mcp}" in out
    assert _ours(read(hooks)["hooks"]) == _ours(read(ROOT / "clients" / ".github" / "hooks" / "context-mode.json")["hooks"])
    got = read(mcp)
    assert got["servers"]["context-mode"]["url"] == "http://10.0.0.5:5000/mcp" and "other" in got["servers"]
    assert {p: p.read_text() for p in project.rglob("*") if p.is_file()} == before
    assert f"would remove {hooks}" in run("uninstall", "vscode-copilot", "--scope", "user", "--dry-run")
    assert hooks.exists()                                               # a dry run removes nothing either
    assert f"removed {hooks}" in run("uninstall", "vscode-copilot", "--scope", "user")
    assert not hooks.exists() and read(mcp) == {"servers": {"other": {"type": "stdio", "command": "x"}}}


def test_codex_gets_the_mcp_entry_in_its_toml_with_its_comments_kept(project, tmp_path):
    """Codex gets no hooks: install writes [mcp_servers.context-mode] into ~/.codex/config.toml (or a project's),
    as clients/codex/config.toml has it, keeping the file's other tables and comments; uninstall takes it out."""
    import tomllib
    config = tmp_path / "home" / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    original = '# my Codex settings\nmodel = "gpt-5"\n\n[mcp_servers.other]\ncommand = "other-mcp"  # keep me\n'
    config.write_text(original)
    out = run("install", "codex", "--scope", "user")
    assert f"wrote {config}" in out and "the MCP entry alone" in out
    got = tomllib.loads(config.read_text())
    shipped = tomllib.loads((ROOT / "clients" / "codex" / "config.toml").read_text())["mcp_servers"]["context-mode"]
    assert got["mcp_servers"]["context-mode"] == shipped and got["mcp_servers"]["other"] == {"command": "other-mcp"}
    assert got["model"] == "gpt-5" and "# my Codex settings" in config.read_text() and "# keep me" in config.read_text()
    assert "nothing to install" in run("install", "codex", "--scope", "user")
    run("uninstall", "codex", "--scope", "user")
    assert tomllib.loads(config.read_text()) == tomllib.loads(original) and "# keep me" in config.read_text()
    dry = run("install", "codex", "--scope", "user", "--dry-run")       # what would be written, as TOML
    assert "[mcp_servers.context-mode]" in dry and "# keep me" in dry and config.read_text() == original
    run("install", "codex", "--project", project, "--url", "http://10.0.0.5:5000")
    assert tomllib.loads((project / ".codex" / "config.toml").read_text())["mcp_servers"]["context-mode"]["url"] == \
        "http://10.0.0.5:5000/mcp"


def test_codex_user_scope_follows_codex_home(project, tmp_path, monkeypatch):
    """Codex keeps its folder where CODEX_HOME says (else ~/.codex): the user-scope entry goes there."""
    import tomllib
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))
    out = run("install", "codex", "--scope", "user")
    config = tmp_path / "codex-home" / "config.toml"
    assert f"wrote {config}" in out and "context-mode" in tomllib.loads(config.read_text())["mcp_servers"]
    assert not (tmp_path / "home" / ".codex").exists()
