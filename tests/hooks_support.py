"""Shared helpers for the agent hook tests (issue 27; no tests here, hence no ``test_`` prefix).

``run_hook`` runs the real command, as an agent would: a new process, the event JSON on stdin, the
settings in its environment, and only its stdout read back. The payloads are each agent's documented
event shapes (see context_mode_client/hooks/clients.py for where each comes from).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from conftest import VENV_BIN

KEY = "hook-test-key-0123456789abcdef"


@dataclass
class HookRun:
    status: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def answer(self):
        return json.loads(self.stdout) if self.stdout.strip() else None


def hook_env(url: str, state_dir: Path, key: str | None = KEY, **settings) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_")}
    env.update({"CONTEXT_URL": url, "CONTEXT_HOOK_STATE_DIR": str(state_dir), "HOME": str(state_dir)})
    if key:
        env["CONTEXT_API_KEY"] = key
    env.update({k: str(v) for k, v in settings.items()})
    return env


def run_hook(client: str, event: str, payload, env: dict, *, via: str = "module", timeout: float = 30) -> HookRun:
    """``python -m context_mode_client.hooks``; via="script": the shipped ``context-mode-hook``; via="cli":
    ``context-mode hook``."""
    cmd = {"cli": [str(VENV_BIN / "context-mode"), "hook"], "script": [str(VENV_BIN / "context-mode-hook")],
           "module": [sys.executable, "-m", "context_mode_client.hooks"]}[via] + [client, event]
    data = payload if isinstance(payload, (bytes, str)) else json.dumps(payload, ensure_ascii=False)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, input=data.encode() if isinstance(data, str) else data, capture_output=True,
                          env=env, timeout=timeout)
    return HookRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode(), time.monotonic() - t0)


def log_lines(state_dir: Path) -> list[str]:
    path = Path(state_dir) / "hook.log"
    return path.read_text().splitlines() if path.exists() else []


def units(server, key: str = KEY, **filters) -> list[dict]:
    params = {"limit": 200, **filters}
    rv = requests.get(server.url + "/mcp/units", params=params, headers=server.headers(key), timeout=30)
    assert rv.status_code == 200, rv.text
    return rv.json()["units"]


def lineage(server, cid: str, key: str = KEY) -> dict:
    rv = requests.get(f"{server.url}/mcp/units/{cid}/lineage", headers=server.headers(key), timeout=30)
    assert rv.status_code == 200, rv.text
    return rv.json()


# --- each agent's documented payloads ------------------------------------------------------------
def claude(event: str, session: str, cwd: str, **fields) -> dict:
    """Claude Code: session_id, transcript_path, cwd, permission_mode, hook_event_name + the event's fields."""
    return {"session_id": session, "transcript_path": f"/home/u/.claude/projects/p/{session}.jsonl", "cwd": cwd,
            "permission_mode": "default", "hook_event_name": event, **fields}


def gemini(event: str, session: str, cwd: str, **fields) -> dict:
    """Gemini CLI: session_id, transcript_path, cwd, hook_event_name, timestamp (ISO 8601)."""
    return {"session_id": session, "transcript_path": f"/home/u/.gemini/tmp/{session}.json", "cwd": cwd,
            "hook_event_name": event, "timestamp": "2026-12-01T10:00:00.000Z", **fields}


def vscode(event: str, session: str, cwd: str, **fields) -> dict:
    """VS Code: timestamp, cwd, sessionId, hookEventName, transcript_path."""
    return {"timestamp": "2026-12-01T10:00:00.000Z", "cwd": cwd, "sessionId": session, "hookEventName": event,
            "transcript_path": f"/home/u/.vscode/{session}.json", **fields}


def cursor(event: str, session: str, cwd: str, **fields) -> dict:
    """Cursor: conversation_id, generation_id, hook_event_name, workspace_roots, cursor_version."""
    return {"conversation_id": session, "generation_id": "gen-1", "hook_event_name": event,
            "workspace_roots": [cwd], "cursor_version": "1.7.0", "model": "gpt-5", **fields}


# (client, builder, session-start event, prompt event, post-tool event, a post-tool payload's fields
#  carrying `text` as the tool's output, where the answer's context is found)
def claude_tool(text):
    return {"tool_name": "Bash", "tool_input": {"command": "cat build.log", "description": "Show the log"},
            "tool_response": {"stdout": text, "stderr": "", "interrupted": False, "isImage": False},
            "tool_use_id": "toolu_01ABC"}


def gemini_tool(text):
    return {"tool_name": "run_shell_command", "tool_input": {"command": "cat build.log"},
            "tool_response": {"llmContent": text, "returnDisplay": text}}


def vscode_tool(text):
    return {"tool_name": "run_in_terminal", "tool_input": {"command": "cat build.log"}, "tool_use_id": "tool-123",
            "tool_response": text}


def cursor_tool(text):
    return {"tool_name": "Shell", "tool_input": {"command": "cat build.log"}, "tool_output": text,
            "duration": 120}


CLIENTS = {
    "claude-code": (claude, "SessionStart", "UserPromptSubmit", "PostToolUse", claude_tool, "Bash"),
    "gemini-cli": (gemini, "SessionStart", "BeforeAgent", "AfterTool", gemini_tool, "run_shell_command"),
    "vscode-copilot": (vscode, "SessionStart", "UserPromptSubmit", "PostToolUse", vscode_tool, "run_in_terminal"),
    "cursor": (cursor, "sessionStart", "beforeSubmitPrompt", "postToolUse", cursor_tool, "Shell"),
}


def context_of(client: str, answer) -> str | None:
    """The injected text in the client's own answer shape (None when the answer injects nothing)."""
    if answer is None:
        return None
    if client == "cursor":
        return answer.get("additional_context") or None
    return (answer.get("hookSpecificOutput") or {}).get("additionalContext")


# --- servers that misbehave --------------------------------------------------------------------
class SilentServer:
    """Accepts connections and never answers (drip=True: sends a header byte every 0.2 s, forever), so
    only the hook's own deadline can end the call."""

    def __init__(self, drip: bool = False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.drip, self.stopped, self.conns = drip, threading.Event(), []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.drip:
                threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
            if self.stopped.wait(0.2):
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self):
        self.stopped.set()
        for c in self.conns:
            c.close()
        self.sock.close()
