"""`context-mode install <agent>` and `uninstall <agent>`: the agent hooks and the MCP entry written into the
agent's own settings (issue 51), merged with what is there: another tool's hooks and servers, and every other
setting, stay as they were; ours are recognised by the hook command and the entry's name, so installing twice
changes nothing and uninstalling takes out only what install wrote.

The hook command is an absolute path (``context-mode-hook`` beside this interpreter, else ``python -m
context_mode_client.hook``), so it works whatever the agent's PATH is; a bare ``context-mode-hook`` that is not on
PATH exits 127, which the agents treat as non-blocking, and nothing would be stored. The events and matchers are
those of ``clients/<agent>/settings.json`` (tests/test_install.py holds them to it).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click

DEFAULT_URL = "http://127.0.0.1:5000"
HOOK_MODULE = "context_mode_client.hook"
SERVER_NAME = "context-mode"


@dataclass(frozen=True)
class Agent:
    name: str                          # as the hook knows it (``context-mode-hook <name> <event>``)
    events: tuple                      # (event, matcher or None)
    timeout: int                       # in the agent's unit (Claude Code: seconds; Gemini CLI: milliseconds)
    folder: str                        # of its settings, under the project or the home folder
    named: bool = False                # Gemini CLI names each hook

    def settings(self, scope: str, project: Path) -> Path:
        return (project if scope == "project" else Path.home()) / self.folder / "settings.json"

    def mcp_file(self, scope: str, project: Path) -> Path:
        """The file whose ``mcpServers`` holds the MCP entry."""
        if self.name == "claude-code":
            return project / ".mcp.json" if scope == "project" else Path.home() / ".claude.json"
        return self.settings(scope, project)

    def server(self, url: str) -> dict:
        auth = {"Authorization": "Bearer ${CONTEXT_API_KEY:-}"}
        if self.name == "claude-code":
            return {"type": "http", "url": f"{url}/mcp", "headers": auth}
        return {"httpUrl": f"{url}/mcp", "headers": auth}

    def hook(self, command: str, event: str, url: str) -> dict:
        entry = {"type": "command", "command": f"{command} {self.name} {event}", "timeout": self.timeout}
        if self.named:
            entry = {"type": "command", "name": SERVER_NAME, **{k: entry[k] for k in ("command", "timeout")},
                     "env": {"CONTEXT_URL": url, "CONTEXT_API_KEY": "${CONTEXT_API_KEY:-}"}}
        elif url != DEFAULT_URL:
            entry["command"] = f"CONTEXT_URL={shlex.quote(url)} {entry['command']}"
        return entry


AGENTS = {
    "claude-code": Agent("claude-code", (("SessionStart", None), ("UserPromptSubmit", None),
                                         ("PreToolUse", "WebFetch|WebSearch"), ("PostToolUse", "*"),
                                         ("PreCompact", None), ("Stop", None)), 5, ".claude"),
    "gemini-cli": Agent("gemini-cli", (("SessionStart", None), ("BeforeAgent", None),
                                       ("BeforeTool", "web_fetch|google_web_search"), ("AfterTool", None),
                                       ("AfterAgent", None), ("PreCompress", "manual")), 5000, ".gemini", named=True),
}


def hook_command() -> str:
    """The hook's absolute command: the fast entry point beside this interpreter, else the module."""
    beside = Path(sys.executable).parent / "context-mode-hook"
    if beside.exists():
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m {HOOK_MODULE}"


def ours(hook: dict) -> bool:
    command = str(hook.get("command", ""))
    return "context-mode-hook" in command or HOOK_MODULE in command


def without_ours(hooks: dict) -> dict:
    """The settings' hooks with every one of ours taken out (and groups and events left empty)."""
    out = {}
    for event, groups in hooks.items():
        kept = []
        for group in groups if isinstance(groups, list) else [groups]:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                rest = [h for h in group["hooks"] if not (isinstance(h, dict) and ours(h))]
                if not rest:
                    continue
                group = {**group, "hooks": rest}
            kept.append(group)
        if kept:
            out[event] = kept
    return out


def with_ours(hooks: dict, agent: Agent, command: str, url: str) -> dict:
    out = without_ours(hooks)
    for event, matcher in agent.events:
        group = {"hooks": [agent.hook(command, event, url)]}
        if matcher:
            group = {"matcher": matcher, **group}
        out.setdefault(event, []).append(group)
    return out


def read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except ValueError as e:
        raise click.ClickException(f"{path} is not JSON ({e}); fix it or move it away, nothing was written") from None
    if not isinstance(data, dict):
        raise click.ClickException(f"{path} does not hold a JSON object; nothing was written")
    return data


def planned(agent: Agent, scope: str, project: Path, url: str, install: bool) -> dict[Path, dict]:
    """Every file's new content (only those that change; each file read once: Gemini CLI keeps both in one)."""
    before: dict[Path, dict] = {}
    after: dict[Path, dict] = {}

    def current(path: Path) -> dict:
        if path not in before:
            before[path] = read_json(path)
        return after.get(path, before[path])

    settings = agent.settings(scope, project)
    data = current(settings)
    hooks = data.get("hooks") if isinstance(data.get("hooks"), dict) else {}
    hooks = with_ours(hooks, agent, hook_command(), url) if install else without_ours(hooks)
    after[settings] = {k: v for k, v in data.items() if k != "hooks"} | ({"hooks": hooks} if hooks else {})
    mcp_path = agent.mcp_file(scope, project)
    mcp = current(mcp_path)
    servers = dict(mcp.get("mcpServers") or {})
    if install:
        servers[SERVER_NAME] = agent.server(url)
    else:
        servers.pop(SERVER_NAME, None)
    after[mcp_path] = {k: v for k, v in mcp.items() if k != "mcpServers"} | ({"mcpServers": servers} if servers else {})
    return {path: data for path, data in after.items() if data != before[path]}


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".context-mode-tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


def service_answers(url: str) -> str | None:
    import urllib.request
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=3) as rv:
            return None if rv.status == 200 else f"answered {rv.status}"
    except OSError as e:
        return str(getattr(e, "reason", e))


def _run(agent_name: str, scope: str, project: str, url: str, dry_run: bool, install: bool) -> None:
    agent = AGENTS[agent_name]
    url = url.rstrip("/")
    changes = planned(agent, scope, Path(project).resolve(), url, install)
    verb = "install" if install else "uninstall"
    for path, data in changes.items():
        click.echo(f"{'would write' if dry_run else 'wrote'} {path}")
        if dry_run:
            click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        else:
            write(path, data)
    if not changes:
        click.echo(f"{agent_name}: nothing to {verb}, its settings already say so")
    if install:
        problem = service_answers(url)
        click.echo(f"the service at {url} answers" if problem is None else
                   f"warning: the service at {url} does not answer ({problem}): start it (`context-mode run`); "
                   "the hooks store nothing until it does", err=problem is not None)


def register_cli(main: click.Group) -> None:
    options = [
        click.argument("agent", type=click.Choice(sorted(AGENTS))),
        click.option("--scope", type=click.Choice(["project", "user"]), default="project", show_default=True,
                     help="project: this project's settings; user: every project of this user"),
        click.option("--project", default=".", type=click.Path(file_okay=False), show_default=True,
                     help="the project folder (with --scope project)"),
        click.option("--dry-run", is_flag=True, help="print what would be written, write nothing"),
    ]

    def with_options(f):
        for option in reversed(options):
            f = option(f)
        return f

    @main.command("install")
    @with_options
    @click.option("--url", default=lambda: os.environ.get("CONTEXT_URL", DEFAULT_URL), show_default="CONTEXT_URL "
                  "or " + DEFAULT_URL, help="the service the hooks and the MCP entry talk to")
    def install(agent, scope, project, dry_run, url):
        """Write the agent hooks and the MCP entry into AGENT's settings (merged; run it again to update)."""
        _run(agent, scope, project, url, dry_run, True)

    @main.command("uninstall")
    @with_options
    def uninstall(agent, scope, project, dry_run):
        """Take out of AGENT's settings the hooks and the MCP entry `install` wrote, and nothing else."""
        _run(agent, scope, project, DEFAULT_URL, dry_run, False)
