"""Each agent's hook protocol as data (issue 27): its event names, where its payload keeps the session,
the tool call and the prompt, and how it wants an answer written back.

Events are normalized to six kinds: ``session-start``, ``prompt``, ``pre-tool``, ``post-tool``, ``stop``
(the agent's final answer for a turn) and ``pre-compact``. Where each shape comes from:

- Claude Code: the hooks reference (code.claude.com/docs/en/hooks) and the input/output schemas in the
  CLI itself (checked against @anthropic-ai/claude-code 2.1.332): ``session_id``, ``transcript_path``,
  ``cwd``, ``hook_event_name``, ``tool_name``, ``tool_input``, ``tool_response``, ``prompt``, ``source``,
  ``last_assistant_message``; answers in ``hookSpecificOutput``.
- Gemini CLI: the hooks reference of google-gemini/gemini-cli (its docs, 0.61): the same base fields,
  ``tool_response`` = ``{llmContent, returnDisplay, error}``, ``BeforeAgent`` carries ``prompt``,
  ``AfterAgent`` ``prompt_response``; answers in ``hookSpecificOutput``, denials as ``decision``.
- VS Code Copilot: code.visualstudio.com/docs/agents/reference/hooks-reference: Claude's event names and
  answers, but the session is ``sessionId`` and ``tool_response`` a string.
- Cursor: ``.cursor/hooks.json`` events (``conversation_id``, ``workspace_roots``, ``tool_output``,
  ``additional_context``, ``permission``) as peers document them; Cursor's own reference was not
  reachable from here, so these shapes are the least verified (clients/MCP.md says so).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

KINDS = ("session-start", "prompt", "pre-tool", "post-tool", "stop", "pre-compact")


@dataclass
class Event:
    """One hook call, in the same terms for every agent."""
    kind: str
    name: str                         # the agent's own event name, for answers and metadata
    session_id: str = ""
    cwd: str = ""
    tool_name: str = ""
    tool_input: Any = None
    tool_output: str = ""
    prompt: str = ""
    answer: str = ""                  # the agent's final message of a turn (stop)
    source: str = ""                  # session start: startup / resume / clear / compact
    extra: dict = field(default_factory=dict)


def as_text(value: Any) -> str:
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


def _gemini_output(response: Any) -> str:
    """Gemini's ``{llmContent, returnDisplay, error}``: what the model saw, else what the user saw."""
    if not isinstance(response, dict):
        return as_text(response)
    content = response.get("llmContent")
    if isinstance(content, list):          # Part objects: keep their text
        content = "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    text = as_text(content) if content not in (None, "") else as_text(response.get("returnDisplay"))
    error = response.get("error")
    if error:
        text += ("\n" if text else "") + "[error] " + as_text(error.get("message") if isinstance(error, dict) else error)
    return text


def _maybe_json(value: Any) -> Any:
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


@dataclass(frozen=True)
class Client:
    name: str
    events: dict                      # agent's event name (lowercased) -> kind
    parse: Callable[[str, str, dict], Event]
    answer: Callable[[Event, Optional[str], Optional[str]], Optional[dict]]
    route_tools: tuple = ()           # tools that return large outputs (routing, off by default)

    def kind(self, event_name: str) -> Optional[str]:
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


def _hook_specific(event: Event, context: Optional[str], deny: Optional[str]) -> Optional[dict]:
    """Claude Code and VS Code: ``hookSpecificOutput`` named after the event."""
    if deny is not None:
        return {"hookSpecificOutput": {"hookEventName": event.name, "permissionDecision": "deny",
                                       "permissionDecisionReason": deny}}
    if context:
        return {"hookSpecificOutput": {"hookEventName": event.name, "additionalContext": context}}
    return None


def _gemini_answer(event: Event, context: Optional[str], deny: Optional[str]) -> Optional[dict]:
    if deny is not None:
        return {"decision": "deny", "reason": deny}
    if context:
        return {"hookSpecificOutput": {"hookEventName": event.name, "additionalContext": context}}
    return None


def _cursor_answer(event: Event, context: Optional[str], deny: Optional[str]) -> Optional[dict]:
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
    Client("gemini-cli", {"sessionstart": "session-start", "beforeagent": "prompt", "beforetool": "pre-tool",
                          "aftertool": "post-tool", "afteragent": "stop", "precompress": "pre-compact"},
           _parse_gemini, _gemini_answer, ("web_fetch", "google_web_search")),
    Client("cursor", {"sessionstart": "session-start", "beforesubmitprompt": "prompt", "pretooluse": "pre-tool",
                      "beforeshellexecution": "pre-tool", "beforemcpexecution": "pre-tool",
                      "posttooluse": "post-tool", "aftershellexecution": "post-tool", "aftermcpexecution": "post-tool",
                      "afteragentresponse": "stop", "precompact": "pre-compact"},
           _parse_cursor, _cursor_answer, ("WebFetch", "mcp_web_fetch")),
)}
ALIASES = {"claude": "claude-code", "gemini": "gemini-cli", "vscode": "vscode-copilot", "copilot": "vscode-copilot"}


def client_named(name: str) -> Optional[Client]:
    name = name.lower()
    return CLIENTS.get(ALIASES.get(name, name))
