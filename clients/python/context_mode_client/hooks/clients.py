"""Each agent's hook protocol as data: its event names, where its payload keeps the session, the tool call and
the prompt, how it wraps a tool's output, what counts as evidence of a compaction, and how it wants an answer.

Events are normalized to six kinds: ``session-start``, ``prompt``, ``pre-tool``, ``post-tool``, ``stop`` (the
agent's final answer for a turn) and ``pre-compact``. Where each shape comes from (clients/MCP.md says how sure
each one is):

- Claude Code: the hooks reference (code.claude.com/docs/en/hooks) and the CLI itself (@anthropic-ai/claude-code
  2.1.332, run in CI against a scripted model): ``session_id``, ``transcript_path``, ``cwd``,
  ``hook_event_name``, ``tool_name``, ``tool_input``, ``tool_response``, ``prompt``, ``source``, ``trigger``,
  ``last_assistant_message``; answers in ``hookSpecificOutput``.
- Gemini CLI: the hooks reference of google-gemini/gemini-cli and the CLI itself (0.61.0, run in CI): the same
  base fields, ``tool_response`` = ``{llmContent, returnDisplay, error}``, ``BeforeAgent`` carries ``prompt``,
  ``AfterAgent`` ``prompt_response``, ``PreCompress`` ``trigger``; answers in ``hookSpecificOutput``, denials
  as ``decision``.
- VS Code Copilot: code.visualstudio.com/docs/agents/reference/hooks-reference: Claude's event names and
  answers, but the session is ``sessionId`` and ``tool_response`` a string.
- Cursor: cursor.com/docs/hooks (``conversation_id``, ``workspace_roots``, ``tool_output``,
  ``additional_context``, ``permission``).

No dataclasses or typing here: this module is imported on every hook call, and those cost ~13 ms.
"""
from __future__ import annotations

import json
import re

KINDS = ("session-start", "prompt", "pre-tool", "post-tool", "stop", "pre-compact")


class Event:
    """One hook call, in the same terms for every agent."""
    __slots__ = ("kind", "name", "session_id", "cwd", "tool_name", "tool_input", "tool_output", "prompt", "answer",
                 "source", "cut")

    def __init__(self, kind: str, name: str, session_id: str = "", cwd: str = "", tool_name: str = "",
                 tool_input=None, tool_output: str = "", prompt: str = "", answer: str = "", source: str = ""):
        self.kind, self.name, self.session_id, self.cwd = kind, name, session_id, cwd
        self.tool_name, self.tool_input, self.tool_output = tool_name, tool_input, tool_output
        self.prompt = prompt
        self.answer = answer          # the agent's final message of a turn (stop)
        self.source = source          # session start: startup / resume / clear / compact; pre-compact: its trigger
        self.cut = False              # the event was larger than CONTEXT_HOOK_MAX_EVENT_BYTES: its head only


def as_text(value) -> str:
    """A tool's response as text: strings as they are, Claude's Bash result as its streams, else JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and ("stdout" in value or "stderr" in value):
        out = str(value.get("stdout") or "")
        err = str(value.get("stderr") or "")
        return out + (("\n[stderr]\n" if out else "[stderr]\n") + err if err else "")
    return json.dumps(value, ensure_ascii=False)


# Gemini CLI's wrappers around what a tool returns (packages/core: wrapUntrusted, and the shell tool's sections).
_UNTRUSTED_OPEN, _UNTRUSTED_CLOSE = "<untrusted_context>\n", "\n</untrusted_context>"
_SHELL_NOISE = re.compile(r"\n(?:Process Group PGID|Background PIDs): [^\n]*$")


def _gemini_unwrap(text: str) -> str:
    """What the tool produced, without Gemini's ``<untrusted_context>`` wrapper and, for a shell command, without
    its ``Output:`` label and process-group lines (the exit code, error and signal stay: they are findings)."""
    if text.startswith(_UNTRUSTED_OPEN) and text.endswith(_UNTRUSTED_CLOSE):
        text = text[len(_UNTRUSTED_OPEN):-len(_UNTRUSTED_CLOSE)].replace(
            "&lt;/untrusted_context&gt;", "</untrusted_context>")
    if text.startswith("Output: "):
        while True:
            cut = _SHELL_NOISE.sub("", text)
            if cut == text:
                break
            text = cut
        text = text[len("Output: "):]
        if text == "(empty)" or text.startswith("(empty)\n"):
            text = text[len("(empty)"):].lstrip("\n")
    return text


def _gemini_output(response) -> str:
    """Gemini's ``{llmContent, returnDisplay, error}``: what the model saw, else what the user saw."""
    if not isinstance(response, dict):
        return _gemini_unwrap(as_text(response))
    content = response.get("llmContent")
    if isinstance(content, list):          # Part objects: keep their text
        content = "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    text = as_text(content) if content not in (None, "") else as_text(response.get("returnDisplay"))
    text = _gemini_unwrap(text)
    error = response.get("error")
    if error:
        text += ("\n" if text else "") + "[error] " + as_text(error.get("message") if isinstance(error, dict) else error)
    return text


def _maybe_json(value):
    """Cursor passes some tool inputs as JSON text."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _str(payload: dict, *names: str) -> str:
    for name in names:
        value = payload.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


class Client:
    def __init__(self, name: str, events: dict, parse, answer, route_tools: tuple = (), compacting=None):
        self.name = name
        self.events = events                  # agent's event name (lowercased) -> kind
        self.parse = parse                    # (kind, event name, payload) -> Event
        self.answer = answer                  # (Event, context or None, denial or None) -> answer dict or None
        self.route_tools = route_tools        # tools that return large outputs (routing, off by default)
        # (Event) -> whether this pre-compact event shows a compaction really happens
        self.compacting = compacting or (lambda event: True)

    def kind(self, event_name: str) -> str | None:
        lowered = event_name.lower()
        return self.events.get(lowered) or (lowered if lowered in KINDS else None)


def _parse_common(kind: str, name: str, p: dict, session_keys=("session_id",)) -> Event:
    return Event(kind=kind, name=name, session_id=_str(p, *session_keys), cwd=_str(p, "cwd"),
                 tool_name=_str(p, "tool_name"), tool_input=p.get("tool_input"), prompt=_str(p, "prompt"),
                 source=_str(p, "source", "trigger"))


def _parse_claude(kind: str, name: str, p: dict) -> Event:
    e = _parse_common(kind, name, p)
    e.tool_output = as_text(p.get("tool_response"))
    e.answer = _str(p, "last_assistant_message")
    return e


def _parse_vscode(kind: str, name: str, p: dict) -> Event:
    e = _parse_common(kind, name, p, session_keys=("sessionId", "session_id"))
    e.tool_output = as_text(p.get("tool_response"))
    return e


def _parse_gemini(kind: str, name: str, p: dict) -> Event:
    e = _parse_common(kind, name, p)
    e.tool_output = _gemini_output(p.get("tool_response"))
    e.answer = _str(p, "prompt_response")
    return e


def _parse_cursor(kind: str, name: str, p: dict) -> Event:
    roots = p.get("workspace_roots")
    cwd = _str(p, "cwd") or (roots[0] if isinstance(roots, list) and roots and isinstance(roots[0], str) else "")
    e = Event(kind=kind, name=name, session_id=_str(p, "conversation_id", "session_id"), cwd=cwd,
              tool_name=_str(p, "tool_name"), tool_input=_maybe_json(p.get("tool_input")), prompt=_str(p, "prompt"),
              source=_str(p, "source", "trigger"))
    lowered = name.lower()
    if lowered in ("beforeshellexecution", "aftershellexecution"):
        e.tool_name, e.tool_input = "Shell", {"command": _str(p, "command")}
    e.tool_output = as_text(p.get("tool_output") if "tool_output" in p else p.get("output", p.get("result_json")))
    e.answer = _str(p, "text") if lowered == "afteragentresponse" else ""
    return e


def _hook_specific(event: Event, context: str | None, deny: str | None) -> dict | None:
    """Claude Code and VS Code: ``hookSpecificOutput`` named after the event."""
    if deny is not None:
        return {"hookSpecificOutput": {"hookEventName": event.name, "permissionDecision": "deny",
                                       "permissionDecisionReason": deny}}
    if context:
        return {"hookSpecificOutput": {"hookEventName": event.name, "additionalContext": context}}
    return None


def _gemini_answer(event: Event, context: str | None, deny: str | None) -> dict | None:
    if deny is not None:
        return {"decision": "deny", "reason": deny}
    if context:
        return {"hookSpecificOutput": {"hookEventName": event.name, "additionalContext": context}}
    return None


def _cursor_answer(event: Event, context: str | None, deny: str | None) -> dict | None:
    """Cursor wants JSON on stdout from every hook (an empty answer is not a valid response)."""
    if event.kind == "prompt":
        return {"continue": True}                     # beforeSubmitPrompt cannot add context
    if deny is not None:
        return {"permission": "deny", "user_message": deny, "agent_message": deny}
    if event.kind == "pre-tool":
        return {"permission": "allow"}
    return {"additional_context": context} if context else {}


_CLAUDE_EVENTS = {"sessionstart": "session-start", "userpromptsubmit": "prompt", "pretooluse": "pre-tool",
                  "posttooluse": "post-tool", "stop": "stop", "precompact": "pre-compact"}

CLIENTS = {c.name: c for c in (
    Client("claude-code", _CLAUDE_EVENTS, _parse_claude, _hook_specific, ("WebFetch", "WebSearch")),
    Client("vscode-copilot", _CLAUDE_EVENTS, _parse_vscode, _hook_specific, ("fetch_webpage", "fetch")),
    # Gemini CLI 0.61 fires PreCompress on every model call that has history, before it decides whether to
    # compress (upstream #18083): only a manual /compress is evidence that one happens.
    Client("gemini-cli", {"sessionstart": "session-start", "beforeagent": "prompt", "beforetool": "pre-tool",
                          "aftertool": "post-tool", "afteragent": "stop", "precompress": "pre-compact"},
           _parse_gemini, _gemini_answer, ("web_fetch", "google_web_search"),
           compacting=lambda event: event.source == "manual"),
    Client("cursor", {"sessionstart": "session-start", "beforesubmitprompt": "prompt", "pretooluse": "pre-tool",
                      "beforeshellexecution": "pre-tool", "beforemcpexecution": "pre-tool",
                      "posttooluse": "post-tool", "aftershellexecution": "post-tool", "aftermcpexecution": "post-tool",
                      "afteragentresponse": "stop", "precompact": "pre-compact"},
           _parse_cursor, _cursor_answer, ("WebFetch", "mcp_web_fetch")),
)}
ALIASES = {"claude": "claude-code", "gemini": "gemini-cli", "vscode": "vscode-copilot", "copilot": "vscode-copilot"}


def client_named(name: str) -> Client | None:
    name = name.lower()
    return CLIENTS.get(ALIASES.get(name, name))
