"""What a hook stores and asks for (issue 27), and the little it remembers between calls.

Lineage: a session's first hook stores a ``system_notice`` (the session root); its prompts
(``user_input``) and the agent's final answers (``model_thinking``) are children of that root, and each
tool output (``tool_output``, split into parts when large) is a child of the prompt that led to it. A small
state file per session (under ``CONTEXT_HOOK_STATE_DIR``) remembers the root, the start time and the last
prompts, since every hook call is a new process.

Context always comes from ``POST /mcp/context``, which packs and fences the units (stored content is
untrusted data, never instructions); this module only adds a line naming what follows.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from .client import compute_cid
from .masking import mask
from .textsplit import split_text

CHUNK_CHARS = 2000                    # as `context-mode import` cuts text files
MAX_INPUT_CHARS = 300                 # the short form of a tool's input kept in metadata
MAX_QUERY_CHARS = 2000
KEEP_PROMPTS = 3                      # recent prompts and answers remembered: the session's query
STATE_DAYS = 7                        # state files of sessions idle longer than this are removed
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# This service's own MCP tools: their results are stored units already.
OWN_TOOLS = re.compile(r"(^|[_:.])(context_search|context_push|context_forget|tool_search)$")
SESSION_HEADER = "[Context Mode] This session so far (your earlier prompts and answers), from the shared memory:"
EARLIER_HEADER = "[Context Mode] Earlier work relevant to this, from the shared memory:"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()[:16]


def short_input(tool_input: Any) -> str:
    """What the call was about, in one line: the command, path, URL or pattern, else compact JSON."""
    if isinstance(tool_input, dict):
        for key in ("command", "file_path", "filePath", "path", "url", "pattern", "query", "prompt"):
            value = tool_input.get(key)
            if isinstance(value, str) and value.strip():
                return clip(" ".join(value.split()), MAX_INPUT_CHARS)
    if tool_input in (None, "", {}, []):
        return ""
    text = tool_input if isinstance(tool_input, str) else json.dumps(tool_input, ensure_ascii=False)
    return clip(" ".join(text.split()), MAX_INPUT_CHARS)


class State:
    """One session's memory between hook calls: a JSON file, replaced whole on every write."""

    def __init__(self, directory: Path, client: str, session: str):
        self.path = Path(directory) / f"{client}-{digest(session)}.json"
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        self.data: dict = data if isinstance(data, dict) else {}
        self.new = not self.data

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self.data, fh, ensure_ascii=False)
        os.replace(tmp, self.path)
        if self.new:
            self._sweep()

    def _sweep(self) -> None:
        cutoff = time.time() - STATE_DAYS * 86_400
        for old in self.path.parent.glob("*.json"):
            try:
                if old.stat().st_mtime < cutoff:
                    old.unlink()
            except OSError:
                pass


class HookStore:
    def __init__(self, client: str, event, settings, api, deadline):
        self.client, self.event, self.settings, self.api, self.deadline = client, event, settings, api, deadline
        self.session = event.session_id or f"cwd:{event.cwd}"
        self.state = State(settings.state_dir, client, self.session)
        self.now = int(time.time())
        self.started = int(self.state.data.setdefault("started", self.now))
        self.literals = (settings.api_key,) if settings.api_key else ()

    # --- units ----------------------------------------------------------------------------------
    def _mask(self, text: str) -> str:
        return mask(text, self.literals)

    def _unit(self, content: str, type_: str, source: str, metadata: dict, parent: Optional[str],
              timestamp: Optional[int] = None) -> dict:
        ts = self.now if timestamp is None else timestamp
        source = clip(CONTROL.sub("_", source), 200)
        unit = {"cid": compute_cid(content, ts, source), "type": type_, "source": source, "timestamp": ts,
                "content": content, "metadata": {k: v for k, v in metadata.items() if v not in (None, "")}}
        if parent:
            unit["parent_cid"] = parent
        if self.settings.ttl:
            unit["ttl"] = self.settings.ttl
        return unit

    def _meta(self, **extra) -> dict:
        return {"session_id": clip(self.session, 200), "cwd": clip(self.event.cwd, 500),
                "hook": f"{self.client} {self.event.name}", **extra}

    def root(self) -> dict:
        """The session root: the same unit (so the same CID) on every call of the session."""
        text = f"{self.client} session {self.session} started"      # (not the cwd: a new session's query)
        unit = self._unit(self._mask(text), "system_notice", f"{self.client}_session", self._meta(), None,
                          timestamp=self.started)
        self.state.data["root"] = unit["cid"]
        return unit

    def _push(self, units: list) -> list:
        self.api.timeout = self.deadline.socket_timeout()
        return self.api.push_batch(units)

    def push_root(self) -> None:
        root = self.root()
        self.state.save()
        self._push([root])

    def push_prompt(self) -> None:
        text = self._mask(self.event.prompt)
        if not text.strip():
            return
        root = self.root()
        unit = self._unit(text, "user_input", f"{self.client}_prompt", self._meta(), root["cid"])
        prompts = self.state.data.setdefault("prompts", [])
        prompts.append({"cid": unit["cid"], "text": clip(text, MAX_QUERY_CHARS)})
        del prompts[:-KEEP_PROMPTS]
        self.state.save()                   # before the push: a slow service must not lose the lineage
        self._push([root, unit])

    def push_tool_output(self) -> None:
        e = self.event
        if not e.tool_output.strip() or OWN_TOOLS.search(e.tool_name) or \
                (self.settings.skip_tools and self.settings.skip_tools.search(e.tool_name)):
            return
        text = self._mask(e.tool_output[:self.settings.max_chars])
        parts = split_text(text, CHUNK_CHARS) or []
        prompts = self.state.data.get("prompts") or []
        parent = prompts[-1]["cid"] if prompts else None
        units = [] if parent else [self.root()]
        meta = self._meta(tool=e.tool_name, input=self._mask(short_input(e.tool_input)),
                          truncated=len(e.tool_output) > self.settings.max_chars or None,
                          total_chars=len(e.tool_output) if len(e.tool_output) > self.settings.max_chars else None)
        source = f"{self.client}_{e.tool_name or 'tool'}"
        for i, part in enumerate(parts, start=1):
            extra = {"part": i, "parts": len(parts)} if len(parts) > 1 else {}
            units.append(self._unit(part.text, "tool_output", source, {**meta, **extra}, parent or units[0]["cid"]))
        if parent is None:
            self.state.save()
        results = self._push(units)
        # The prompt never reached the service (it was down then): keep the output, without the link.
        orphans = [dict(units[r["index"]], metadata={**units[r["index"]]["metadata"], "prompt_cid": parent})
                   for r in results if r.get("status") == "error" and r.get("code") == "parent_not_found"]
        for unit in orphans:
            unit.pop("parent_cid", None)
        if orphans:
            self._push(orphans)

    def push_answer(self) -> None:
        text = self._mask(self.event.answer)
        if not text.strip():
            return
        root = self.root()
        prompts = self.state.data.get("prompts") or []
        meta = self._meta(prompt_cid=prompts[-1]["cid"] if prompts else None)
        answers = self.state.data.setdefault("answers", [])
        answers.append(clip(text, MAX_QUERY_CHARS // 4))
        del answers[:-KEEP_PROMPTS]
        self.state.save()
        self._push([root, self._unit(text, "model_thinking", f"{self.client}_answer", meta, root["cid"])])

    def mark_compacted(self) -> None:
        self.state.data["compacted"] = True
        self.state.save()

    # --- context --------------------------------------------------------------------------------
    def _context(self, query: str, budget: int, **filters) -> tuple[str, int]:
        if budget < 50 or not query.strip() or self.deadline.left() <= 0.05:
            return "", 0
        self.api.timeout = self.deadline.socket_timeout()
        rv = self.api.context(clip(query, MAX_QUERY_CHARS), budget_tokens=budget, max_chars_per_item=1200,
                              **filters)
        return rv.get("context") or "", int(rv.get("tokens") or 0)

    def _session_query(self) -> str:
        """The session's last prompts and answers: its own units are what this text finds best."""
        prompts = [p["text"] for p in self.state.data.get("prompts") or []]
        return "\n".join(prompts + list(self.state.data.get("answers") or []))

    def session_context(self, decisions: bool) -> Optional[str]:
        """The session's recent prompts and answers, then the most relevant earlier work."""
        budget = self.settings.budget_tokens
        query = self._session_query()
        blocks = []
        if decisions and query and self.state.data.get("root"):
            text, used = self._context(query, budget // 2, parent_cid=self.state.data["root"],
                                       types=["user_input", "model_thinking"])
            if text:
                blocks.append(f"{SESSION_HEADER}\n{text}")
                budget -= used
        self.state.data.pop("compacted", None)
        if not query:                       # a new session: what this project's name finds
            parts = Path(self.event.cwd).parts[-2:] if self.event.cwd else ()
            query = " ".join(p for p in parts if p not in ("/", ""))
        text, _ = self._context(query, budget, until=max(0, self.started - 1))
        if text:
            blocks.append(f"{EARLIER_HEADER}\n{text}")
        self.state.save()
        return "\n\n".join(blocks) or None

    def prompt_context(self) -> Optional[str]:
        if self.state.data.get("compacted"):        # compaction dropped the session's own history
            return self.session_context(decisions=True)
        text, _ = self._context(self._mask(self.event.prompt), self.settings.budget_tokens,
                                until=max(0, self.started - 1))
        return f"{EARLIER_HEADER}\n{text}" if text else None

    # --- routing (off by default) -------------------------------------------------------------
    def route(self, default_tools: tuple) -> Optional[str]:
        """Before a tool known for large outputs: once per identical call, if the memory already holds
        something on it, deny the call and name the MCP tools (the same call later goes through)."""
        tools = self.settings.route_tools or default_tools
        e = self.event
        if not self.settings.routing or e.tool_name not in tools:
            return None
        query = self._mask(short_input(e.tool_input))
        key = digest([e.tool_name, e.tool_input])
        routed = self.state.data.setdefault("routed", [])
        if not query or key in routed:
            return None
        self.api.timeout = self.deadline.socket_timeout()
        hits = self.api.search(query, top_k=3)["results"]
        if not hits:
            return None
        routed.append(key)
        del routed[:-50]
        self.state.save()
        cids = ", ".join(f"context://units/{h['cid']}" for h in hits)
        return (f"Context Mode routing: the shared memory already holds results about this ({cids}). "
                f"Call the MCP tool context_search (server context-mode) with what you need instead of {e.tool_name}, "
                f"and store large results with context_push. If that is not enough, make the same {e.tool_name} "
                "call again: it will go through.")
