"""Agent hooks: ``context-mode-hook <client> <event>`` (also ``python -m context_mode_client.hooks``, the older
``python -m context_mode_client.hook`` and the slower ``context-mode hook``). Reads the agent's hook event JSON on
stdin, stores what it carries (tool outputs, prompts, final answers) as typed, linked units of its project, and
answers the agent, in its own format, with the packed context of what matters from earlier work.

Never in the agent's way: the whole call, from the process's start to its exit, stays within
``CONTEXT_HOOK_TIMEOUT_MS`` (1.5 s). The work runs in a thread the main thread stops waiting for at the
deadline (then: nothing answered, exit 0, one line in the log); a watchdog outside the interpreter
(``faulthandler``) ends the process shortly after the deadline even if Python code holds the interpreter (a
regular expression over a hostile tool output), with exit status 1, which every agent treats as a non-blocking
error. Any failure answers nothing and writes one line to the log, never to stdout or stderr, which agents read;
so does a session start or prompt given no context, with the reason (``HookStore.why``).
Only a wrong command line (a config typo) prints to stderr and exits 1.

Imports are what a hook needs and no more (no ``requests``, no service module): the process's start is most of
a hook's cost (clients/MCP.md, "Cost per call").
"""
from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
import threading
import time

from .clients import CLIENTS, Event, client_named
from .event import read_event
from .http import HookError, HookHttp
from .store import HookStore, HookTimeout


def _process_age() -> float:
    """Seconds since this process started (Linux: its start time in /proc, against the boot clock; elsewhere 0,
    and the deadline counts from this module's import)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])          # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError, IndexError):
        return 0.0


STARTED = time.monotonic() - _process_age()      # the deadline counts from the process's start
WATCHDOG_SLACK_S = 0.06                           # past the deadline, the watchdog ends a process still running
USAGE = ("usage: context-mode-hook <client> <event>   (or: python -m context_mode_client.hooks <client> <event>)\n"
         f"  clients: {', '.join(CLIENTS)}; events: the client's own hook event names (e.g. PostToolUse)\n"
         "  context-mode-hook check   prints the settings and whether the service answers")
_TRUE = ("1", "true", "yes", "on")


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


def _choice(env: dict, name: str, choices: tuple) -> str:
    value = env.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={value!r}: use {' or '.join(choices)}")
    return value


def _score(env: dict, name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not 0 <= value <= 1:
        raise ValueError(f"{name}={value} is outside 0..1")
    return value


def _cache_dir(env: dict) -> str:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "context-mode", "hooks")


class Settings:
    """The hook's environment variables (client side: the service never reads them; clients/MCP.md)."""

    def __init__(self, env: dict):
        self.state_dir = env.get("CONTEXT_HOOK_STATE_DIR") or _cache_dir(env)
        self.log_path = env.get("CONTEXT_HOOK_LOG") or os.path.join(self.state_dir, "hook.log")
        self.url = (env.get("CONTEXT_URL") or "http://127.0.0.1:5000").rstrip("/")
        self.api_key = env.get("CONTEXT_API_KEY") or None
        self.disabled = env.get("CONTEXT_HOOK_DISABLED", "").strip().lower() in _TRUE

    def read(self, env: dict) -> "Settings":
        """The rest, checked (ValueError names the bad one)."""
        self.budget_tokens = _int(env, "CONTEXT_HOOK_BUDGET_TOKENS", 1500, 0, 200_000)    # 0: store only
        self.timeout_s = _int(env, "CONTEXT_HOOK_TIMEOUT_MS", 1500, 50, 60_000) / 1000
        self.ttl = _int(env, "CONTEXT_HOOK_TTL", 0, 0, 10**15) or None                  # None: the server's
        self.max_chars = _int(env, "CONTEXT_HOOK_MAX_CHARS", 200_000, 100, 10_000_000)  # of one text, before masking
        self.max_event_bytes = _int(env, "CONTEXT_HOOK_MAX_EVENT_BYTES", 8 << 20, 1024, 1 << 30)
        self.scope = _choice(env, "CONTEXT_HOOK_SCOPE", ("project", "global"))
        self.project_key = _choice(env, "CONTEXT_HOOK_PROJECT_KEY", ("path", "remote"))
        self.min_score = _score(env, "CONTEXT_HOOK_MIN_SCORE", 0.5)
        routing = env.get("CONTEXT_HOOK_ROUTING", "off").strip().lower()
        if routing not in ("off", "on", "0", "1", "false", "true", ""):
            raise ValueError(f"CONTEXT_HOOK_ROUTING={routing!r}: use on or off")
        self.routing = routing in ("on", "1", "true")
        self.route_tools = tuple(t.strip() for t in env.get("CONTEXT_HOOK_ROUTE_TOOLS", "").split(",") if t.strip())
        skip = env.get("CONTEXT_HOOK_SKIP_TOOLS", "").strip()
        try:
            self.skip_tools = re.compile(skip) if skip else None
        except re.error as e:
            raise ValueError(f"CONTEXT_HOOK_SKIP_TOOLS is not a regular expression: {e}") from None
        return self


def _log_fd(settings: Settings) -> int:
    """The log file, opened for appending and 0600 (it names sessions and errors of the user's work)."""
    os.makedirs(os.path.dirname(settings.log_path) or ".", mode=0o700, exist_ok=True)
    fd = os.open(settings.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)                  # (made by an earlier version with the umask's mode)
    return fd


def log_line(settings: Settings, text: str) -> None:
    """One line per failure; the file is cut back to its last half past 1 MB. Never raises."""
    try:
        path = settings.log_path
        if os.path.exists(path) and os.stat(path).st_size > 1_000_000:
            with open(path, "rb") as fh:
                fh.seek(-500_000, os.SEEK_END)
                keep = fh.read()
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(keep[keep.find(b"\n") + 1:])
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        with os.fdopen(_log_fd(settings), "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {' '.join(text.split())[:1000]}\n")
    except OSError:
        pass


class Deadline:
    def __init__(self, seconds: float, started: float):
        self.at = started + seconds

    def left(self) -> float:
        return self.at - time.monotonic()


def handle(client, event: Event, settings: Settings, deadline: Deadline) -> dict | None:
    """Store what the event carries and work out the answer (None: say nothing)."""
    store = HookStore(client.name, event, settings, HookHttp(settings.url, settings.api_key, deadline), deadline)
    context = deny = None
    if event.kind in ("session-start", "prompt"):
        # the push and the context it does not need are answered side by side; a failed push still fails the call
        pending = store.push_root() if event.kind == "session-start" else store.push_prompt()
        context = store.session_context(history=True) if event.kind == "session-start" else store.prompt_context()
        if pending is not None:
            pending.result()
        if context is None and store.why:
            log_line(settings, f"{client.name} {event.name}: no context given: {store.why}")
    elif event.kind == "post-tool":
        store.push_tool_output()
    elif event.kind == "pre-tool":
        deny = store.route(client.route_tools)
    elif event.kind == "stop":
        store.push_answer()
    elif event.kind == "pre-compact":
        store.note_compaction(client.compacting(event))   # no agent takes context here: the next prompt or start does
    return client.answer(event, context, deny)


def _work(client, kind: str, name: str, stdin, settings: Settings, deadline: Deadline, box: dict) -> None:
    try:
        payload, cut = read_event(stdin, settings.max_event_bytes)
        event = client.parse(kind, name, payload)
        if cut:
            if not (event.session_id or event.cwd):
                raise ValueError(f"the hook event on stdin is larger than {settings.max_event_bytes} bytes "
                                 "(CONTEXT_HOOK_MAX_EVENT_BYTES) and its head names no session: stored nothing")
            event.cut = True
            log_line(settings, f"{client.name} {name}: the hook event on stdin is larger than "
                               f"{settings.max_event_bytes} bytes (CONTEXT_HOOK_MAX_EVENT_BYTES): stored its head, "
                               "marked truncated")
        box["answer"] = handle(client, event, settings, deadline)
    except HookTimeout:
        box["late"] = True
    except HookError as e:
        if e.code == "timeout":
            box["late"] = True
        else:
            box["error"] = f"{type(e).__name__}: {e}"
    except (ValueError, OSError) as e:
        box["error"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a bug here must still not reach the agent
        box["error"] = f"unexpected {type(e).__name__}: {e}"


def run(argv: list, stdin, env: dict, started: float = STARTED) -> tuple[int, str | None, bool]:
    """(exit status, stdout text or None, whether a worker is still running) for one hook call."""
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
    neutral = _dump(client.answer(Event(kind=kind, name=argv[1]), None, None))
    settings = Settings(env)
    if settings.disabled:
        return 0, neutral, False
    try:
        settings.read(env)
    except ValueError as e:
        log_line(settings, f"{client.name} {argv[1]}: bad setting: {e}")
        return 0, neutral, False
    deadline = Deadline(settings.timeout_s, started)
    try:
        faulthandler.dump_traceback_later(max(0.01, deadline.left() + WATCHDOG_SLACK_S), exit=True,
                                          file=_log_fd(settings))
    except OSError:
        pass                    # no log file: the thread's deadline still holds for everything but a held interpreter
    box: dict = {}
    worker = threading.Thread(target=_work, args=(client, kind, argv[1], stdin, settings, deadline, box),
                              name="context-mode-hook", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline.left()))
    faulthandler.cancel_dump_traceback_later()
    if worker.is_alive() or box.get("late"):
        log_line(settings, f"{client.name} {argv[1]}: timed out after {round(settings.timeout_s * 1000)} ms "
                           f"({settings.url}); answered nothing")
        return 0, neutral, worker.is_alive()
    if "error" in box:
        log_line(settings, f"{client.name} {argv[1]}: {box['error']} ({settings.url}); answered nothing")
        return 0, neutral, False
    return 0, _dump(box.get("answer")), False


def _dump(answer: dict | None) -> str | None:
    return None if answer is None else json.dumps(answer, ensure_ascii=False)


def check(env: dict) -> tuple[int, str | None, bool]:
    """For a person at a terminal: the settings, and whether the service takes this key."""
    settings = Settings(env)
    try:
        settings.read(env)
    except ValueError as e:
        sys.stderr.write(f"context-mode hook: bad setting: {e}\n")
        return 1, None, False
    lines = [f"service  {settings.url} (key {'set' if settings.api_key else 'not set'})",
             f"budget   {settings.budget_tokens} tokens, timeout {round(settings.timeout_s * 1000)} ms, "
             f"scope {settings.scope}, floor {settings.min_score}, routing {'on' if settings.routing else 'off'}",
             f"state    {settings.state_dir}", f"log      {settings.log_path}"]
    try:
        HookHttp(settings.url, settings.api_key, Deadline(5, time.monotonic())).search("context-mode hook check",
                                                                                        top_k=1)
        lines.append("ok       the service answers a search with this key")
        status = 0
    except (HookError, ValueError) as e:
        lines.append(f"FAIL     {e}")
        status = 1
    return status, "\n".join(lines), False


def main(argv: list | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        sys.exit(0 if argv else 1)
    status, out, _ = run(list(argv), sys.stdin.buffer, dict(os.environ))
    if out is not None:
        sys.stdout.write(out + "\n")
    sys.stdout.flush()
    # os._exit: neither a worker stuck in a socket nor the interpreter's teardown may hold the agent up
    os._exit(status)


if __name__ == "__main__":
    main()
