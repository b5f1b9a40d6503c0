"""The agents themselves (issue 27), where they run here: Claude Code's and Gemini CLI's own command-line
clients (npm, installed by .ci/setup.d/agent-clis.sh) report both shipped MCP entries (HTTP and the stdio
bridge) connected to a real gunicorn, and Claude Code runs the shipped hooks from clients/claude-code/
settings.json (it does so before it asks for a login). Every shipped hook config names real events."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib

import pytest

from conftest import ROOT, VENV_BIN, LiveServer
from context_mode_client.hookclients import client_named
from hooks_support import units

BIN = ROOT / ".ci" / "node_modules_agents" / "node_modules" / ".bin"
KEY = "hook-agents-0123456789abcdef"
HOOK_CONFIGS = {"claude-code": ROOT / "clients" / "claude-code" / "settings.json",
                "gemini-cli": ROOT / "clients" / "gemini-cli" / "settings.json",
                "cursor": ROOT / "clients" / ".cursor" / "hooks.json",
                "vscode-copilot": ROOT / "clients" / ".github" / "hooks" / "context-mode.json"}


def commands(config: dict):
    """(event, command) of every hook entry, whichever nesting the agent uses."""
    for event, entries in config["hooks"].items():
        for entry in entries:
            for hook in entry.get("hooks", [entry]):
                yield event, hook["command"]


@pytest.mark.parametrize("name", list(HOOK_CONFIGS))
def test_every_shipped_hook_names_the_command_and_a_known_event(name):
    config = json.loads(HOOK_CONFIGS[name].read_text())
    found = list(commands(config))
    assert len(found) >= 4
    kinds = set()
    for event, command in found:
        assert command == f"context-mode hook {name} {event}"
        kinds.add(client_named(name).kind(event))
    assert {"session-start", "prompt", "post-tool"} <= kinds and None not in kinds
    if name == "gemini-cli":        # Gemini times hooks in ms, the others in seconds; ours stops itself at 1.5 s
        assert {h["timeout"] for e in config["hooks"].values() for g in e for h in g["hooks"]} == {5000}


def test_codex_config_points_at_the_endpoint_and_the_bridge():
    servers = tomllib.loads((ROOT / "clients" / "codex" / "config.toml").read_text())["mcp_servers"]
    assert servers["context-mode"] == {"url": "http://127.0.0.1:5000/mcp", "bearer_token_env_var": "CONTEXT_API_KEY"}
    stdio = servers["context-mode-stdio"]
    assert stdio["command"] == "context-mode" and stdio["args"][:2] == ["mcp-stdio", "--url"]
    assert stdio["env_vars"] == ["CONTEXT_API_KEY"]


needs_agents = pytest.mark.skipif(shutil.which("npm") is None or shutil.which("node") is None,
                                  reason="npm/node not installed: the agents' CLIs cannot be installed "
                                         "(.ci/setup.d/agent-clis.sh)")


@pytest.fixture(scope="module")
def agents():
    if not ((BIN / "claude").exists() and (BIN / "gemini").exists()):
        subprocess.run(["bash", str(ROOT / ".ci" / "setup.d" / "agent-clis.sh")], check=True, timeout=900)
    if not ((BIN / "claude").exists() and (BIN / "gemini").exists()):
        pytest.skip("the agents' CLIs could not be installed (.ci/setup.d/agent-clis.sh said why)")
    return BIN


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("agents") / "data", workers=1,
                     keys={KEY: ("agents", ["push", "search"])})
    try:
        yield srv.start()
    finally:
        srv.stop()


def agent_env(home, server, key=KEY, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXT_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))}
    env.update({"HOME": str(home), "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "CONTEXT_URL": server.url,
                "CONTEXT_API_KEY": key, "CONTEXT_HOOK_STATE_DIR": str(home / "hook-state"), "NO_COLOR": "1",
                "DISABLE_AUTOUPDATER": "1"}, **extra)
    return env


def claude_project(tmp_path, *, hooks: bool = False):
    """A project holding the shipped .mcp.json (and hooks), approved and trusted as `claude` would record it."""
    home, project = tmp_path / "home", tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    home.mkdir()
    shutil.copy(ROOT / "clients" / "claude-code" / ".mcp.json", project / ".mcp.json")
    (project / ".claude" / "settings.local.json").write_text(
        json.dumps({"enabledMcpjsonServers": ["context-mode", "context-mode-stdio"]}))
    if hooks:
        shutil.copy(HOOK_CONFIGS["claude-code"], project / ".claude" / "settings.json")
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True,
                                                   "projects": {str(project): {"hasTrustDialogAccepted": True}}}))
    return home, project


def run(cmd, cwd, env, timeout=120) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return proc.stdout + proc.stderr


def status_lines(output: str) -> dict:
    return {m.group(1): m.group(2) for m in re.finditer(r"^\W*(context-mode(?:-stdio)?): .*? - (.*)$", output, re.M)}


@needs_agents
def test_claude_code_reports_both_shipped_mcp_entries_connected(agents, server, tmp_path):
    home, project = claude_project(tmp_path)
    good = status_lines(run([str(agents / "claude"), "mcp", "list"], project, agent_env(home, server)))
    assert set(good) == {"context-mode", "context-mode-stdio"}, good
    assert all("Connected" in s and "Failed" not in s for s in good.values()), good
    bad = status_lines(run([str(agents / "claude"), "mcp", "list"], project,
                           agent_env(home, server, key="wrong-key-0123456789")))
    assert set(bad) == set(good) and not any(s.endswith("Connected") for s in bad.values()), bad   # the key counts


@needs_agents
def test_gemini_cli_reports_both_shipped_mcp_entries_connected_in_a_trusted_folder(agents, server, tmp_path):
    home, project = tmp_path / "home", tmp_path / "project"
    (project / ".gemini").mkdir(parents=True)
    (home / ".gemini").mkdir(parents=True)
    shutil.copy(HOOK_CONFIGS["gemini-cli"], project / ".gemini" / "settings.json")
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(project): "TRUST_FOLDER"}))
    good = status_lines(run([str(agents / "gemini"), "mcp", "list"], project, agent_env(home, server)))
    assert set(good) == {"context-mode", "context-mode-stdio"}, good
    assert all(s == "Connected" for s in good.values()), good
    bad = status_lines(run([str(agents / "gemini"), "mcp", "list"], project,
                           agent_env(home, server, key="wrong-key-0123456789")))
    assert set(bad) == set(good) and not any(s == "Connected" for s in bad.values()), bad


@needs_agents
def test_claude_code_runs_the_shipped_hooks_and_takes_their_context(agents, server, tmp_path):
    """`claude -p` runs SessionStart and UserPromptSubmit before it finds it is not logged in: the prompt is
    stored by the shipped hooks, and a later session's hooks answer context that Claude Code validates."""
    home, project = claude_project(tmp_path, hooks=True)
    env = agent_env(home, server)
    run([str(agents / "claude"), "-p", "why is the ORD-5555 refund stuck in review?"], project, env)
    [prompt] = [u for u in units(server, KEY) if u["type"] == "user_input"]
    assert prompt["source"] == "claude-code_prompt" and prompt["content"].startswith("why is the ORD-5555 refund")
    assert re.fullmatch(r"[0-9a-f-]{36}", prompt["metadata"]["session_id"])         # Claude Code's own session id
    assert prompt["metadata"]["cwd"] == str(project)
    time.sleep(1.1)
    debug = tmp_path / "claude-debug.log"
    run([str(agents / "claude"), "-p", "ORD-5555 refund again", "--debug-file", str(debug)], project, env)
    log = debug.read_text()
    assert re.search(r"Hook UserPromptSubmit \(context-mode hook claude-code UserPromptSubmit\) provided "
                     r"additionalContext \(\d+ chars\)", log), log[-3000:]
    assert "Successfully parsed and validated hook JSON output" in log
