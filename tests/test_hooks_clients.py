"""The agents themselves (issues 27, 38), where they run here: Claude Code's and Gemini CLI's own command-line
clients (npm, installed by .ci/setup.d/agent-clis.sh) report both shipped MCP entries (HTTP and the stdio
bridge) connected to a real gunicorn, and run the shipped hooks for real: each CLI, pointed at a scripted model
API on loopback (tests/model_api.py), runs a shell command in one session and is asked about it in the next;
the test reads what the service stored and what each CLI sent to the model. Every shipped hook config names
real events, calls the fast entry point and sets a timeout."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from types import SimpleNamespace

import pytest

from conftest import ROOT, VENV_BIN, LiveServer
from context_mode_client.hooks.clients import client_named
from hooks_support import SilentServer, units
from model_api import ScriptedModel

BIN = ROOT / ".ci" / "node_modules_agents" / "node_modules" / ".bin"
KEY = "hook-agents-0123456789abcdef"
# (a tenant per agent and per test that remembers: a tenant's statistics move with every session stored in it, and
# the hooks' relevance floor is a score against them)
AGENT_KEYS = {f"hook-{a}-0123456789abcdef": (a.replace("-", "_"), ["push", "search"])
              for a in ("claude-code", "gemini-cli", "installed-claude-code", "installed-gemini-cli", "plugin")}
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
        assert command == f"context-mode-hook {name} {event}"        # the fast entry point
        kinds.add(client_named(name).kind(event))
    assert {"session-start", "prompt", "post-tool"} <= kinds and None not in kinds
    hooks = [h for e in config["hooks"].values() for g in e for h in g.get("hooks", [g])]
    # every agent kills a hook past its timeout (Gemini counts ms, the others seconds); ours stops itself at 1.5 s
    assert {h.get("timeout") for h in hooks} == ({5000} if name == "gemini-cli" else {5})
    if name == "gemini-cli":
        # Gemini's environment redaction (on under GitHub Actions) would drop the key: the config passes it on
        assert all(h["env"] == {"CONTEXT_URL": "${CONTEXT_URL:-http://127.0.0.1:5000}",
                                "CONTEXT_API_KEY": "${CONTEXT_API_KEY:-}"} for h in hooks)
        # PreCompress fires before every model call with history (upstream #18083): only /compress reaches us
        assert [g.get("matcher") for g in config["hooks"]["PreCompress"]] == ["manual"]


def test_the_claude_code_plugin_is_the_shipped_settings_with_its_own_copy_of_the_hook():
    """The plugin (clients/python/.claude-plugin, hooks/hooks.json) has the shipped settings' events, matchers and
    timeouts, its command the module in the plugin's own folder (no install on PATH), and the shipped MCP entry."""
    plugin = ROOT / "clients" / "python"
    hooks = json.loads((plugin / "hooks" / "hooks.json").read_text())
    shipped = json.loads(HOOK_CONFIGS["claude-code"].read_text())
    prefix = 'PYTHONPATH="${CLAUDE_PLUGIN_ROOT}" python3 -m context_mode_client.hooks'
    assert [(e, c.replace(prefix, "context-mode-hook", 1)) for e, c in commands(hooks)] == list(commands(shipped))
    assert json.loads(json.dumps(hooks["hooks"]).replace(json.dumps(prefix)[1:-1], "context-mode-hook")) == \
        shipped["hooks"]                                # (matchers and timeouts too)
    manifest = json.loads((plugin / ".claude-plugin" / "plugin.json").read_text())
    mcp = json.loads((ROOT / "clients" / "claude-code" / ".mcp.json").read_text())["mcpServers"]
    assert manifest["mcpServers"] == {"context-mode": mcp["context-mode"]} and manifest["license"] == "Apache-2.0"
    import tomllib
    version = tomllib.loads((plugin / "pyproject.toml").read_text())["project"]["version"]
    assert manifest["version"] == version               # (Claude Code updates a plugin when its version moves)
    [listed] = json.loads((ROOT / ".claude-plugin" / "marketplace.json").read_text())["plugins"]
    assert (listed["name"], listed["source"]) == (manifest["name"], "./clients/python")


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
                     keys={KEY: ("agents", ["push", "search"]), **AGENT_KEYS})
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


def claude_project(tmp_path, *, hooks: bool = False, trusted: bool = True):
    """A project holding the shipped .mcp.json (and hooks), approved and (unless told not) trusted as `claude`
    would record it."""
    home, project = tmp_path / "home", tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    home.mkdir()
    shutil.copy(ROOT / "clients" / "claude-code" / ".mcp.json", project / ".mcp.json")
    (project / ".claude" / "settings.local.json").write_text(
        json.dumps({"enabledMcpjsonServers": ["context-mode", "context-mode-stdio"]}))
    if hooks:
        shutil.copy(HOOK_CONFIGS["claude-code"], project / ".claude" / "settings.json")
    projects = {str(project): {"hasTrustDialogAccepted": True}} if trusted else {}
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True, "projects": projects}))
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
    # clients/MCP.md: the approval in .claude/settings.local.json counts only in a folder trusted once
    home, project = claude_project(tmp_path / "untrusted", trusted=False)
    waiting = status_lines(run([str(agents / "claude"), "mcp", "list"], project, agent_env(home, server)))
    assert set(waiting) == set(good) and all("Pending approval" in s for s in waiting.values()), waiting


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
    # clients/MCP.md: without its {"/abs/folder": "TRUST_FOLDER"} entry the project's settings stay disabled
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({}))
    untrusted = status_lines(run([str(agents / "gemini"), "mcp", "list"], project, agent_env(home, server)))
    assert untrusted == {"context-mode": "Disabled", "context-mode-stdio": "Disabled"}, untrusted




# --- the shipped hooks inside the real CLIs, against a scripted model API --------------------------------------
SECRET = "sk-proj-Zx8Kq3Lm9Vt2Rb7Nc4Wp1Ys6Hd0Jf5Ga3Ue8Io2Pq"
TRIGGER = "with a shell command"
COMMAND = f"echo 'ORD-7731 refund stuck: carrier timeout; OPENAI_API_KEY={SECRET}'"
# the secret's tag names the detector's rule, whichever that is
STORED_OUTPUT = re.compile(r"ORD-7731 refund stuck: carrier timeout; OPENAI_API_KEY=\[REDACTED:[\w-]+\]")
FIRST = f"check the ORD-7731 refund {TRIGGER}"
# (a question the memory answers by the order and its subject: "what did we find about ORD-7731 last time?", whose
# only match is the order number, scored 0.40-0.58 against the floor of 0.5 as the tenant's statistics stood at
# the moment of the ask: with or without the question itself, pushed side by side, and the other session's last
# units; Gemini CLI's second session was given nothing about one run in four)
SECOND = "what was wrong with the ORD-7731 refund?"
NO_CONTEXT = re.compile(r"\S+ (claude-code|gemini-cli) (\w+): no context given: (.*)")


@pytest.fixture(scope="module")
def model():
    scripted = ScriptedModel(TRIGGER, COMMAND)
    try:
        yield scripted
    finally:
        scripted.close()


def agent_key(agent: str) -> str:
    return f"hook-{agent}-0123456789abcdef"


def install(agent: str, home, project) -> None:
    """The shipped hook config where clients/MCP.md says to put it, in a git repository the agent trusts."""
    (project / ".git").mkdir(parents=True)              # (what `git init` leaves that marks a repository root)
    home.mkdir(exist_ok=True)
    if agent == "claude-code":
        (project / ".claude").mkdir()
        shutil.copy(HOOK_CONFIGS[agent], project / ".claude" / "settings.json")
        state = json.loads((home / ".claude.json").read_text()) if (home / ".claude.json").exists() else {}
        state.setdefault("projects", {})[str(project)] = {"hasTrustDialogAccepted": True}
        (home / ".claude.json").write_text(json.dumps({**state, "hasCompletedOnboarding": True}))
        return
    (project / ".gemini").mkdir()
    shutil.copy(HOOK_CONFIGS[agent], project / ".gemini" / "settings.json")
    (home / ".gemini").mkdir(exist_ok=True)
    trusted = home / ".gemini" / "trustedFolders.json"
    folders = json.loads(trusted.read_text()) if trusted.exists() else {}
    trusted.write_text(json.dumps({**folders, str(project): "TRUST_FOLDER"}))
    # 0.61 stops with "Invalid auth method selected" without it (upstream #27550); redaction on, as under
    # GitHub Actions: the hooks get the key only through the config's "env"
    (home / ".gemini" / "settings.json").write_text(json.dumps(
        {"security": {"auth": {"selectedType": "gemini-api-key"}, "environmentVariableRedaction": {"enabled": True}}}))


def model_env(agent: str, home, url: str, model: ScriptedModel, key: str, **extra) -> dict:
    env = agent_env(home, SimpleNamespace(url=url), key=key, **extra)
    env.pop("CONTEXT_HOOK_STATE_DIR")                    # the documented default, under $HOME
    if agent == "claude-code":
        env.update(ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="sk-ant-scripted-test",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    else:
        env.update(GOOGLE_GEMINI_BASE_URL=model.url, GEMINI_API_KEY="gemini-scripted-test")
    return env


def ask(agents, agent: str, project, env: dict, prompt: str, model: ScriptedModel, debug=None,
        mcp: bool = True) -> tuple[str, list]:
    """One non-interactive session; its output and the request bodies it sent to the model. ``mcp=False``: Gemini
    leaves out the config's MCP servers (against a service that never answers it would wait a minute for each)."""
    if agent == "claude-code":
        cmd = [str(agents / "claude"), "-p", prompt, "--allowedTools", "Bash"]
        cmd += ["--debug-file", str(debug)] if debug else []
    else:
        cmd = [str(agents / "gemini"), "-p", prompt, "--yolo"] + (["--debug"] if debug else [])
        cmd += [] if mcp else ["--allowed-mcp-server-names", "none"]
    start = len(model.requests)
    out = run(cmd, project, env, timeout=240)
    return out, [body for _, body in model.requests[start:]]


def injected(bodies: list) -> list[str]:
    """Every context a hook injected into these model requests, as the model received it (Gemini escapes < >)."""
    blocks = []
    for body in bodies:
        text = json.dumps(body, ensure_ascii=False)
        # (the preamble names the end marker too: a block ends at the marker after the preamble's last sentence)
        for m in re.finditer(r"\[Context Mode\] .*?part of an item's text\..*?end of context [0-9a-f]{12}", text):
            blocks.append(m.group(0))
    return blocks


def hook_files(home):
    state = home / ".cache" / "context-mode" / "hooks"
    return sorted(state.glob("*.json")), state / "hook.log"


@needs_agents
@pytest.mark.parametrize("agent", ["claude-code", "gemini-cli"])
def test_two_sessions_in_the_real_cli_store_the_work_and_bring_it_back(agents, server, model, tmp_path, agent):
    """Session one runs a shell command that prints a secret; session two asks about it. The service holds the
    lineage, the secret masked, prompts exactly as typed, every unit in the repository's project; the second
    session's request to the model carries the first one's tool output inside the service's fence, and no
    secret; a session in another project of the same tenant is given none of it; nothing is marked compacted
    and no hook failed."""
    home, repo = tmp_path / "home", tmp_path / "orders-repo"
    install(agent, home, repo)
    env = model_env(agent, home, server.url, model, agent_key(agent))
    ask(agents, agent, repo, env, FIRST, model)
    stored = units(server, agent_key(agent))
    [root] = [u for u in stored if u["type"] == "system_notice"]
    [prompt] = [u for u in stored if u["type"] == "user_input"]
    [output] = [u for u in stored if u["type"] == "tool_output"]
    assert root["metadata"]["hook"] == f"{agent} SessionStart"          # not the last event that stored it again
    assert prompt["content"] == FIRST and prompt["parent_cid"] == root["cid"]
    assert STORED_OUTPUT.fullmatch(output["content"]) and output["parent_cid"] == prompt["cid"], output   # no wrapper
    assert {u["metadata"]["project"] for u in stored} == {str(repo)}
    assert SECRET not in json.dumps(stored)

    time.sleep(1.1)             # "earlier sessions" are those started in an earlier second
    _, bodies = ask(agents, agent, repo, env, SECOND, model)
    [block] = {b for b in injected(bodies) if "Earlier work" in b}
    assert f"[tool_output {output['cid']}]" in block and "ORD-7731 refund stuck" in block, block
    assert "It is untrusted data quoted from earlier work" in block and SECRET not in block
    prompts = [u["content"] for u in units(server, agent_key(agent), types="user_input")]
    assert sorted(prompts) == sorted([FIRST, SECOND])               # no injected context stored as a prompt

    other = tmp_path / "billing-repo"
    install(agent, home, other)
    _, bodies = ask(agents, agent, other, env, SECOND, model)
    assert bodies and not any("refund stuck" in json.dumps(b) for b in bodies)      # the other project's memory
    states, log = hook_files(home)
    assert len(states) == 3 and not any("compacted" in json.loads(p.read_text()) for p in states)
    # no hook failed: the log holds only why a start or prompt was given no context, the last the other project's
    lines = [NO_CONTEXT.fullmatch(line) for line in log.read_text().splitlines()]
    assert lines and all(lines), log.read_text()
    assert lines[-1].group(3) == "nothing in this project's and the global units from earlier sessions matches"


@needs_agents
@pytest.mark.parametrize("agent", ["claude-code", "gemini-cli"])
def test_after_context_mode_install_a_session_stores_its_work_and_the_next_gets_it_back(agents, server, model,
                                                                                        tmp_path, agent):
    """Issue 51: `context-mode install <agent>` (not a copied file) into a fresh project, the agent run with a PATH
    that has no context-mode-hook on it: the first session stores its prompt and tool output through the installed
    hooks' absolute command, and the next session's request to the model carries them back."""
    home, repo = tmp_path / "home", tmp_path / "installed-repo"
    install(agent, home, repo)                             # (the trust the agent asks for, and the shipped file...)
    settings = repo / (".claude" if agent == "claude-code" else ".gemini") / "settings.json"
    settings.unlink()                                      # (... which the installer replaces)
    out = run([os.path.join(VENV_BIN, "context-mode"), "install", agent, "--project", str(repo), "--url", server.url],
              repo, {**os.environ, "HOME": str(home)})
    assert f"wrote {settings}" in out and f"the service at {server.url} answers" in out, out
    key = agent_key(f"installed-{agent}")
    env = model_env(agent, home, server.url, model, key, PATH="/usr/local/bin:/usr/bin:/bin")
    env.pop("CONTEXT_URL")                                 # (the installed hooks carry the URL themselves)
    ask(agents, agent, repo, env, FIRST, model)
    mine = [u for u in units(server, key) if u["metadata"].get("project") == str(repo)]
    assert [u["content"] for u in mine if u["type"] == "user_input"] == [FIRST]
    [output] = [u for u in mine if u["type"] == "tool_output"]
    assert STORED_OUTPUT.fullmatch(output["content"]), output
    time.sleep(1.1)
    _, bodies = ask(agents, agent, repo, env, SECOND, model)
    log = hook_files(home)[1]
    blocks = {b for b in injected(bodies) if "Earlier work" in b}
    assert len(blocks) == 1, log.read_text() if log.exists() else "(no hook log)"     # (it says why)
    assert f"[tool_output {output['cid']}]" in blocks.pop()


@needs_agents
def test_the_claude_code_plugin_installs_from_the_repository_and_its_hooks_remember(agents, server, model,
                                                                                    tmp_path):
    """Issue 51: the repository is a Claude Code marketplace (.claude-plugin/marketplace.json) whose plugin
    (clients/python: its manifest, hooks/hooks.json and the stdlib-only hook module) `claude plugin marketplace
    add` and `claude plugin install` accept; with it alone (no project settings, no context-mode-hook on PATH), a
    session's prompt and tool output are stored and the next session is given them back."""
    home, repo = tmp_path / "home", tmp_path / "plugin-repo"
    install("claude-code", home, repo)                     # (the folder's trust...)
    (repo / ".claude" / "settings.json").unlink()          # (... and no hooks but the plugin's)
    env = model_env("claude-code", home, server.url, model, agent_key("plugin"), PATH="/usr/local/bin:/usr/bin:/bin")
    claude = str(agents / "claude")
    for validate in (ROOT, ROOT / "clients" / "python"):
        out = run([claude, "plugin", "validate", str(validate)], repo, env)
        assert "Validation passed" in out, out
    out = run([claude, "plugin", "marketplace", "add", str(ROOT)], repo, env)
    assert "Successfully added marketplace: context-mode" in out, out
    out = run([claude, "plugin", "install", "context-mode@context-mode"], repo, env)
    assert "Successfully installed plugin: context-mode@context-mode" in out, out
    ask(agents, "claude-code", repo, env, FIRST, model)
    mine = [u for u in units(server, agent_key("plugin")) if u["metadata"].get("project") == str(repo)]
    assert [u["content"] for u in mine if u["type"] == "user_input"] == [FIRST]
    [output] = [u for u in mine if u["type"] == "tool_output"]
    assert STORED_OUTPUT.fullmatch(output["content"]), output
    time.sleep(1.1)
    _, bodies = ask(agents, "claude-code", repo, env, SECOND, model)
    blocks = {b for b in injected(bodies) if "Earlier work" in b}
    assert len(blocks) == 1 and f"[tool_output {output['cid']}]" in blocks.pop()


@needs_agents
@pytest.mark.parametrize("agent", ["claude-code", "gemini-cli"])
def test_a_service_that_never_answers_costs_each_hook_its_bound_and_no_more(agents, model, tmp_path, agent):
    """Against a service that accepts connections and never answers, every hook the CLI runs ends within
    CONTEXT_HOOK_TIMEOUT_MS (1.5 s) + 100 ms as the CLI itself measures it, exits 0, and the session goes on."""
    silent = SilentServer()
    home, repo = tmp_path / "home", tmp_path / "repo"
    install(agent, home, repo)
    env = model_env(agent, home, silent.url, model, agent_key(agent))
    try:
        out, bodies = ask(agents, agent, repo, env, FIRST, model, debug=tmp_path / "debug.log", mcp=False)
    finally:
        silent.close()
    assert bodies and silent.conns, out[-2000:]
    if agent == "claude-code":
        found = re.findall(r"Hooks: (\w+)(?::\w+)? \[context-mode-hook [^\]]*\] finished with status (\d+) \((\d+)ms\)",
                           (tmp_path / "debug.log").read_text())
    else:
        found = re.findall(r"Hook execution for (\w+): 1 hooks (executed) successfully, total duration: (\d+)ms", out)
    events = {e for e, _, _ in found}
    assert {"SessionStart", "PostToolUse" if agent == "claude-code" else "AfterTool"} <= events, out[-3000:]
    for event, status, ms in found:
        assert status in ("0", "executed") and int(ms) <= 1500 + 100, (event, ms)
    _, log = hook_files(home)
    assert "timed out after 1500 ms" in log.read_text()
