"""`context-mode install <agent>` and `uninstall <agent>`: the agent hooks and the MCP entry written into the
agent's own settings (issue 51), merged with what is there: another tool's hooks and servers, and every other
setting, stay as they were; ours are recognised by the hook command and the entry's name, so installing twice
changes nothing and uninstalling takes out only what install wrote: a file install created and uninstall leaves
empty is removed (install notes the files it creates, ``install_record``), one that was there before stays, an
empty ``{}`` too.

The hook command is an absolute path (``context-mode-hook`` beside this interpreter, else ``python -m
context_mode_client.hooks``), so it works whatever the agent's PATH is; a bare ``context-mode-hook`` that is not on
PATH exits 127, which the agents treat as non-blocking, and nothing would be stored. The events and matchers are
those of the shipped files in ``clients/`` (tests/test_install.py holds them to it). Codex gets the MCP entry alone,
in its TOML (tomlkit keeps the file's comments and layout): its hooks (experimental, behind its ``codex_hooks``
feature flag) are not a protocol ``context-mode-hook`` speaks. User scope: Cursor ``~/.cursor``, VS Code
``~/.copilot/hooks`` and its user profile's ``mcp.json``, Codex ``$CODEX_HOME`` (else ``~/.codex``).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

DEFAULT_URL = "http://127.0.0.1:5000"
HOOK_MODULE = "context_mode_client.hooks"
# What install wrote before the hooks became a package (context_mode_client/hook.py still runs them): still ours,
# so installing again replaces it and uninstall takes it out.
OLD_HOOK_MODULE = "context_mode_client.hook"
SERVER_NAME = "context-mode"


def _roots(project: Path) -> dict[str, Path]:
    """The folders an agent's settings files are named under."""
    return {"project": project, "home": Path.home(), "vscode-user": vscode_user_dir(), "codex-home": codex_home()}


def _both(relative: str) -> dict:
    """The same file under the project (project scope) and the home folder (user scope)."""
    return {"project": ("project", relative), "user": ("home", relative)}


def _filled(value, url: str):
    """An MCP entry's template with ``{url}`` replaced by the service's URL."""
    if isinstance(value, dict):
        return {k: _filled(v, url) for k, v in value.items()}
    return value.replace("{url}", url) if isinstance(value, str) else value


KEY_INPUT = "context-mode-api-key"          # VS Code asks for the key once and keeps it (its ``inputs``)
AUTH = {"Authorization": "Bearer ${CONTEXT_API_KEY:-}"}


@dataclass(frozen=True)
class Agent:
    name: str                          # as the hook knows it (``context-mode-hook <name> <event>``)
    events: tuple                      # (event, matcher or None); none: the agent takes no hooks (Codex)
    timeout: int                       # in the agent's unit (seconds; Gemini CLI: milliseconds)
    # per scope ("project", "user"): (root, path under it) of the hooks' file and of the MCP entry's; a root is
    # one of _roots' (the project, the home folder, VS Code's user folder, CODEX_HOME)
    hooks_at: dict = field(default_factory=dict, hash=False)
    mcp_at: dict = field(default_factory=dict, hash=False)
    mcp_entry: dict = field(default_factory=dict, hash=False)      # ``{url}``: the service's
    mcp_key: str = "mcpServers"        # the MCP file's object of servers
    named: bool = False                # Gemini CLI names each hook
    typed: bool = True                 # a hook says ``"type": "command"`` (Cursor's do not)
    flat: bool = False                 # hooks listed per event (Cursor, VS Code), not in matcher groups
    version: int | None = None         # the hooks file names its format (Cursor's ``version``)
    key_input: bool = False            # the MCP file asks for the key once (VS Code's ``inputs``)

    def settings(self, scope: str, project: Path) -> Path | None:
        """The file of its hooks (None: no hooks)."""
        if not self.events:
            return None
        root, relative = self.hooks_at[scope]
        return _roots(project)[root] / relative

    def mcp_file(self, scope: str, project: Path) -> Path:
        """The file whose MCP servers (``mcp_key``) holds the MCP entry."""
        root, relative = self.mcp_at[scope]
        return _roots(project)[root] / relative

    def server(self, url: str) -> dict:
        return _filled(self.mcp_entry, url)

    def hook(self, command: str, event: str, url: str) -> dict:
        entry = {"type": "command", "command": f"{command} {self.name} {event}", "timeout": self.timeout}
        if self.named:
            entry = {"type": "command", "name": SERVER_NAME, **{k: entry[k] for k in ("command", "timeout")},
                     "env": {"CONTEXT_URL": url, "CONTEXT_API_KEY": "${CONTEXT_API_KEY:-}"}}
        elif url != DEFAULT_URL:
            entry["command"] = f"CONTEXT_URL={shlex.quote(url)} {entry['command']}"
        if not self.typed:
            del entry["type"]
        return entry


def vscode_user_dir() -> Path:
    """VS Code's user settings folder, which holds the user profile's ``mcp.json`` (VS Code's docs: the user
    settings file's location per platform)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "Code" / "User"
    if os.name == "nt":
        return Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming") / "Code" / "User"
    return Path.home() / ".config" / "Code" / "User"


def codex_home() -> Path:
    """Codex's own folder: ``CODEX_HOME``, else ``~/.codex``."""
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


AGENTS = {
    "claude-code": Agent(
        "claude-code", (("SessionStart", None), ("UserPromptSubmit", None), ("PreToolUse", "WebFetch|WebSearch"),
                        ("PostToolUse", "*"), ("PreCompact", None), ("Stop", None)), 5,
        hooks_at=_both(".claude/settings.json"),
        mcp_at={"project": ("project", ".mcp.json"), "user": ("home", ".claude.json")},
        mcp_entry={"type": "http", "url": "{url}/mcp", "headers": AUTH}),
    "gemini-cli": Agent(
        "gemini-cli", (("SessionStart", None), ("BeforeAgent", None), ("BeforeTool", "web_fetch|google_web_search"),
                       ("AfterTool", None), ("AfterAgent", None), ("PreCompress", "manual")), 5000,
        hooks_at=_both(".gemini/settings.json"), mcp_at=_both(".gemini/settings.json"),
        mcp_entry={"httpUrl": "{url}/mcp", "headers": AUTH}, named=True),
    "cursor": Agent(
        "cursor", (("sessionStart", None), ("beforeSubmitPrompt", None), ("preToolUse", "WebFetch"),
                   ("postToolUse", None), ("afterAgentResponse", None)), 5,
        hooks_at=_both(".cursor/hooks.json"), mcp_at=_both(".cursor/mcp.json"),
        mcp_entry={"url": "{url}/mcp", "headers": {"Authorization": "Bearer ${env:CONTEXT_API_KEY}"}},
        typed=False, flat=True, version=1),
    "vscode-copilot": Agent(                                          # (its hooks file is ours alone)
        "vscode-copilot", (("SessionStart", None), ("UserPromptSubmit", None), ("PostToolUse", None),
                           ("PreCompact", None)), 5,
        hooks_at={"project": ("project", ".github/hooks/context-mode.json"),
                  "user": ("home", ".copilot/hooks/context-mode.json")},
        mcp_at={"project": ("project", ".vscode/mcp.json"), "user": ("vscode-user", "mcp.json")},
        mcp_entry={"type": "http", "url": "{url}/mcp",
                   "headers": {"Authorization": f"Bearer ${{input:{KEY_INPUT}}}"}},
        mcp_key="servers", flat=True, key_input=True),
    "codex": Agent(                   # (Codex expands no variables: it reads the key's variable itself)
        "codex", (), 0, mcp_at={"project": ("project", ".codex/config.toml"), "user": ("codex-home", "config.toml")},
        mcp_entry={"url": "{url}/mcp", "bearer_token_env_var": "CONTEXT_API_KEY"}, mcp_key="mcp_servers"),
}


def hook_command() -> str:
    """The hook's absolute command: the fast entry point beside this interpreter, else the module."""
    beside = Path(sys.executable).parent / "context-mode-hook"
    if beside.exists():
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m {HOOK_MODULE}"


def ours(hook: dict) -> bool:
    command = str(hook.get("command", ""))
    return any(mark in command for mark in ("context-mode-hook", HOOK_MODULE, OLD_HOOK_MODULE))


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
            elif isinstance(group, dict) and ours(group):          # (a flat list's entry: Cursor, VS Code)
                continue
            kept.append(group)
        if kept:
            out[event] = kept
    return out


def with_ours(hooks: dict, agent: Agent, command: str, url: str) -> dict:
    out = without_ours(hooks)
    for event, matcher in agent.events:
        hook = agent.hook(command, event, url)
        if agent.flat:
            group = {**hook, "matcher": matcher} if matcher else hook
        else:
            group = {"hooks": [hook]}
            if matcher:
                group = {"matcher": matcher, **group}
        out.setdefault(event, []).append(group)
    return out


def read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            import tomlkit
            return tomlkit.parse(text)              # (its comments and layout kept when written back)
        data = json.loads(text or "{}")
    except ValueError as e:
        raise click.ClickException(f"{path} is not {path.suffix[1:].upper()} ({e}); fix it or move it away, "
                                   "nothing was written") from None
    if not isinstance(data, dict):
        raise click.ClickException(f"{path} does not hold a JSON object; nothing was written")
    return data


def _plain(data) -> dict:
    """A settings file's content as plain values, to compare before and after."""
    return json.loads(json.dumps(data, default=str))


def planned(agent: Agent, scope: str, project: Path, url: str, install: bool) -> dict[Path, dict]:
    """Every file's new content (only those that change; each file read once: Gemini CLI keeps both in one).
    An empty one install created is removed (``removable``)."""
    before: dict[Path, dict] = {}
    after: dict[Path, dict] = {}

    def current(path: Path) -> dict:
        if path not in before:
            before[path] = read_json(path)
        return after.get(path, before[path])

    settings = agent.settings(scope, project)
    if settings is not None:
        data = current(settings)
        hooks = data.get("hooks") if isinstance(data.get("hooks"), dict) else {}
        hooks = with_ours(hooks, agent, hook_command(), url) if install else without_ours(hooks)
        rest = {k: v for k, v in data.items() if k != "hooks"}
        if agent.version is not None:                       # (Cursor's hooks.json names its format)
            if hooks:
                rest.setdefault("version", agent.version)
            elif rest == {"version": agent.version}:
                rest = {}
        after[settings] = rest | ({"hooks": hooks} if hooks else {})
    mcp_path = agent.mcp_file(scope, project)
    after[mcp_path] = _with_server(current(mcp_path), mcp_path, agent, url, install)
    return {path: data for path, data in after.items() if _plain(data) != _plain(before[path])}


def _with_server(mcp: dict, path: Path, agent: Agent, url: str, install: bool) -> dict:
    """``mcp`` (the file at ``path``) with our MCP entry put in (install) or taken out; VS Code's key prompt with
    it."""
    key = agent.mcp_key
    if path.suffix == ".toml":
        import tomlkit
        doc = tomlkit.parse(tomlkit.dumps(mcp))            # (a copy, layout kept)
        servers = doc.get(key)
        if install:
            if servers is None:
                servers = doc[key] = tomlkit.table(is_super_table=True)
            servers[SERVER_NAME] = agent.server(url)
        elif servers is not None:
            servers.pop(SERVER_NAME, None)
            if not servers:
                del doc[key]
        return doc
    servers = dict(mcp.get(key) or {})
    inputs = [i for i in mcp.get("inputs") or [] if not (isinstance(i, dict) and i.get("id") == KEY_INPUT)]
    if install:
        servers[SERVER_NAME] = agent.server(url)
        if agent.key_input:
            inputs.append({"type": "promptString", "id": KEY_INPUT, "password": True,
                           "description": "Context Mode API key (leave empty when the service runs without keys)"})
    else:
        servers.pop(SERVER_NAME, None)
    out = {k: v for k, v in mcp.items() if k not in (key, "inputs")}
    return out | ({"inputs": inputs} if inputs else {}) | ({key: servers} if servers else {})


def text_of(path: Path, data: dict) -> str:
    """A settings file's text as written: TOML for Codex (its layout kept), else indented JSON."""
    if path.suffix == ".toml":
        import tomlkit
        return tomlkit.dumps(data).rstrip("\n") + "\n"       # (a table taken out leaves its blank line)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def install_record() -> Path:
    """Where install notes the settings files it created, the only ones uninstall may remove: the user's state
    folder (``XDG_STATE_HOME``, else ``~/.local/state``; on Windows ``LOCALAPPDATA``)."""
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "context-mode" / "installed-files.json"


def created_files() -> set[str]:
    """The settings files install created (none if the record is gone: then every file is kept)."""
    try:
        created = json.loads(install_record().read_text(encoding="utf-8")).get("created")
    except (OSError, ValueError, AttributeError):
        return set()
    return {p for p in created if isinstance(p, str)} if isinstance(created, list) else set()


def _note_created(path: Path, created: bool) -> None:
    files = created_files()
    files = files | {str(path)} if created else files - {str(path)}
    record = install_record()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps({"created": sorted(files)}, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, record)
    except OSError:
        pass                            # (unrecorded, the file is kept when emptied: never a user's file lost)


def removable(path: Path, data) -> bool:
    """Whether a file left with ``data`` goes: only when nothing is left and install created it (or its name is
    ours: VS Code's hooks file); a file that was there before, an empty ``{}`` too, is kept."""
    return not _plain(data) and (path.name == f"{SERVER_NAME}.json" or str(path) in created_files())


def write(path: Path, data: dict) -> None:
    """Write a settings file whole (a temporary file renamed over it, its mode kept), or remove it when it is
    ``removable``; a file this writes first is noted as install's."""
    if removable(path, data):
        path.unlink(missing_ok=True)
        _note_created(path, False)
        return
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".context-mode-tmp")
    tmp.write_text(text_of(path, data), encoding="utf-8")
    if existed:
        os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)
    if not existed:
        _note_created(path, True)


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
        gone = removable(path, data)                    # (a file install created, left with nothing in it)
        done = ("would remove" if gone else "would write") if dry_run else ("removed" if gone else "wrote")
        click.echo(f"{done} {path}")
        if dry_run:
            click.echo("" if gone else text_of(path, data), nl=False)
        else:
            write(path, data)
    if not changes:
        click.echo(f"{agent_name}: nothing to {verb}, its settings already say so")
    if install and not agent.events:
        click.echo(f"{agent_name}: the MCP entry alone (context-mode-hook does not speak its hooks, which it runs "
                   "only behind its codex_hooks feature flag): its sessions reach the memory through the MCP tools")
    if install:
        problem = service_answers(url)
        what = "the hooks store nothing" if agent.events else "the MCP entry answers nothing"
        click.echo(f"the service at {url} answers" if problem is None else
                   f"warning: the service at {url} does not answer ({problem}): start it (`context-mode run`); "
                   f"{what} until it does", err=problem is not None)


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
