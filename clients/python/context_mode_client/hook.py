"""Agent hooks (issue 27): ``python -m context_mode_client.hook <client> <event>``, also
``context-mode hook <client> <event>``. Reads the agent's hook event JSON on stdin, stores what it carries
(tool outputs, prompts, final answers) as typed, linked units, and answers the agent, in its own format,
with the packed context (``POST /mcp/context``) of what matters from earlier work.

Never in the agent's way: everything runs under one deadline (``CONTEXT_HOOK_TIMEOUT_MS``, 1.5 s); any
failure or timeout answers nothing (exit 0) and writes one line to the log file, never to stdout or
stderr, which agents read. Only a wrong command line (a config typo) prints to stderr and exits 1, a
status every agent treats as non-blocking. Settings are environment variables (clients/MCP.md).
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .client import ContextModeClient, ContextModeError
from .hookclients import CLIENTS, Client, Event, client_named
from .hookstore import HookStore

STARTED = time.monotonic()            # the deadline counts from here (Python's own start comes before it)
USAGE = ("usage: context-mode hook <client> <event>   (or: python -m context_mode_client.hook <client> <event>)\n"
         f"  clients: {', '.join(CLIENTS)}; events: the client's own hook event names (e.g. PostToolUse)\n"
         "  context-mode hook check   prints the settings and whether the service answers")


def _int(env: dict, name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} is outside {lo}..{hi}")
    return value


def _cache_dir(env: dict) -> Path:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "context-mode" / "hooks"


@dataclass(frozen=True)
class Settings:
    """The hook's environment variables (client side: the service never reads them)."""
    url: str = "http://127.0.0.1:5000"
    api_key: Optional[str] = None
    budget_tokens: int = 1500         # 0: store only, inject nothing
    timeout_s: float = 1.5
    ttl: Optional[int] = None         # None: the server's CONTEXT_DEFAULT_TTL
    max_chars: int = 200_000          # of one tool output; the rest is cut (metadata says so)
    routing: bool = False
    route_tools: Optional[tuple] = None
    skip_tools: Optional[re.Pattern] = None
    state_dir: Path = Path(".")
    log_path: Path = Path("hook.log")
    disabled: bool = False

    @classmethod
    def from_env(cls, env: dict) -> "Settings":
        cache = Path(env.get("CONTEXT_HOOK_STATE_DIR") or _cache_dir(env))
        routing = env.get("CONTEXT_HOOK_ROUTING", "off").strip().lower()
        if routing not in ("off", "on", "0", "1", "false", "true", ""):
            raise ValueError(f"CONTEXT_HOOK_ROUTING={routing!r}: use on or off")
        skip = env.get("CONTEXT_HOOK_SKIP_TOOLS", "").strip()
        try:
            skip_re = re.compile(skip) if skip else None
        except re.error as e:
            raise ValueError(f"CONTEXT_HOOK_SKIP_TOOLS is not a regular expression: {e}") from None
        routes = tuple(t.strip() for t in env.get("CONTEXT_HOOK_ROUTE_TOOLS", "").split(",") if t.strip())
        ttl = _int(env, "CONTEXT_HOOK_TTL", 0, 0, 10**15)
        return cls(url=(env.get("CONTEXT_URL") or cls.url).rstrip("/"), api_key=env.get("CONTEXT_API_KEY") or None,
                   budget_tokens=_int(env, "CONTEXT_HOOK_BUDGET_TOKENS", 1500, 0, 200_000),
                   timeout_s=_int(env, "CONTEXT_HOOK_TIMEOUT_MS", 1500, 50, 60_000) / 1000,
                   ttl=ttl or None, max_chars=_int(env, "CONTEXT_HOOK_MAX_CHARS", 200_000, 100, 10_000_000),
                   routing=routing in ("on", "1", "true"), route_tools=routes or None, skip_tools=skip_re,
                   state_dir=cache, log_path=Path(env.get("CONTEXT_HOOK_LOG") or cache / "hook.log"),
                   disabled=env.get("CONTEXT_HOOK_DISABLED", "").strip().lower() in ("1", "true", "yes", "on"))


def log_line(settings: Settings, text: str) -> None:
    """One line per failure; the file is cut back to its last half past 1 MB. Never raises."""
    try:
        settings.log_path.parent.mkdir(parents=True, exist_ok=True)
        if settings.log_path.exists() and settings.log_path.stat().st_size > 1_000_000:
            keep = settings.log_path.read_bytes()[-500_000:]
            settings.log_path.write_bytes(keep[keep.find(b"\n") + 1:])
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        with open(settings.log_path, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {' '.join(text.split())[:1000]}\n")
    except OSError:
        pass


def _payload(raw: bytes) -> dict:
    if not raw.strip():
        return {}
    try:
        payload = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError as e:
        raise ValueError(f"the hook event on stdin is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise ValueError("the hook event on stdin is not a JSON object")
    return payload


class Deadline:
    # Socket timeouts run this much past the deadline: the deadline itself (the worker's join) always ends a
    # hung call, one way and with one log line; socket timeouts only keep an abandoned worker from living on.
    SOCKET_SLACK_S = 0.25

    def __init__(self, seconds: float, started: float):
        self.at = started + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def socket_timeout(self) -> float:
        return max(0.05, self.left()) + self.SOCKET_SLACK_S


def handle(client: Client, event: Event, settings: Settings, deadline: Deadline) -> Optional[dict]:
    """Store what the event carries and work out the answer (None: say nothing)."""
    api = ContextModeClient(settings.url, settings.api_key, timeout=deadline.socket_timeout(), retries=0)
    store = HookStore(client.name, event, settings, api, deadline)
    context = deny = None
    if event.kind == "session-start":
        store.push_root()
        context = store.session_context(decisions=True)
    elif event.kind == "prompt":
        store.push_prompt()
        context = store.prompt_context()
    elif event.kind == "post-tool":
        store.push_tool_output()
    elif event.kind == "pre-tool":
        deny = store.route(client.route_tools)
    elif event.kind == "stop":
        store.push_answer()
    elif event.kind == "pre-compact":
        store.mark_compacted()      # no agent takes context here: the next prompt (or start) brings it back
    return client.answer(event, context, deny)


def run(argv: list, stdin, env: dict, started: float = STARTED) -> tuple[int, Optional[str], bool]:
    """(exit status, stdout text or None, whether a worker is still hung) for one hook call."""
    if len(argv) == 1 and argv[0] == "check":
        return check(env)
    if len(argv) != 2:
        sys.stderr.write(USAGE + "\n")
        return 1, None, False
    client = client_named(argv[0])
    kind = client.kind(argv[1]) if client else None
    if client is None or kind is None:
        what = f"unknown client {argv[0]!r}" if client is None else f"unknown {client.name} event {argv[1]!r}"
        sys.stderr.write(f"context-mode hook: {what}\n{USAGE}\n")
        return 1, None, False
    neutral = client.answer(Event(kind=kind, name=argv[1]), None, None)
    try:
        settings = Settings.from_env(env)
    except ValueError as e:
        log_line(Settings.from_env({k: v for k, v in env.items() if not k.startswith("CONTEXT_HOOK_")
                                    or k in ("CONTEXT_HOOK_STATE_DIR", "CONTEXT_HOOK_LOG")}),
                 f"{client.name} {argv[1]}: bad setting: {e}")
        return 0, _dump(neutral), False
    if settings.disabled:
        return 0, _dump(neutral), False
    deadline = Deadline(settings.timeout_s, started)
    box: dict = {}

    def work():
        try:
            payload = _payload(stdin.read())
            event = client.parse(kind, argv[1], payload)
            box["answer"] = handle(client, event, settings, deadline)
        except (ContextModeError, ValueError, OSError) as e:
            box["error"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - a bug here must still not reach the agent
            box["error"] = f"unexpected {type(e).__name__}: {e}"

    worker = threading.Thread(target=work, name="context-mode-hook", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline.left()))
    if worker.is_alive():
        log_line(settings, f"{client.name} {argv[1]}: timed out after {round(settings.timeout_s * 1000)} ms "
                           f"({settings.url}); answered nothing")
        return 0, _dump(neutral), True
    if "error" in box:
        log_line(settings, f"{client.name} {argv[1]}: {box['error']} ({settings.url}); answered nothing")
        return 0, _dump(neutral), False
    return 0, _dump(box.get("answer")), False


def _dump(answer: Optional[dict]) -> Optional[str]:
    return None if answer is None else json.dumps(answer, ensure_ascii=False)


def check(env: dict) -> tuple[int, Optional[str], bool]:
    """For a person at a terminal: the settings, and whether the service takes this key."""
    try:
        settings = Settings.from_env(env)
    except ValueError as e:
        sys.stderr.write(f"context-mode hook: bad setting: {e}\n")
        return 1, None, False
    lines = [f"service  {settings.url} (key {'set' if settings.api_key else 'not set'})",
             f"budget   {settings.budget_tokens} tokens, timeout {round(settings.timeout_s * 1000)} ms, "
             f"routing {'on' if settings.routing else 'off'}",
             f"state    {settings.state_dir}", f"log      {settings.log_path}"]
    try:
        api = ContextModeClient(settings.url, settings.api_key, timeout=5, retries=0)
        api.search("context-mode hook check", top_k=1)
        lines.append("ok       the service answers a search with this key")
        status = 0
    except ContextModeError as e:
        lines.append(f"FAIL     {e}")
        status = 1
    return status, "\n".join(lines), False


def main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        sys.exit(0 if argv else 1)
    status, out, hung = run(list(argv), sys.stdin.buffer, dict(os.environ))
    if out is not None:
        sys.stdout.write(out + "\n")
    sys.stdout.flush()
    if hung:
        os._exit(status)        # a worker stuck in a socket must not hold the agent up at interpreter exit
    sys.exit(status)


if __name__ == "__main__":
    main()
