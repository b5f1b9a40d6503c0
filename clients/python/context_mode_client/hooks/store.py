"""What a hook stores and asks for, and the little it remembers between calls.

Lineage: a session's first hook stores a ``system_notice`` (the session root); its prompts (``user_input``) and
the agent's final answers (``model_thinking``) are children of that root, and each tool output
(``tool_output``, split into parts when large) is a child of the prompt that led to it. A small state file per
session (under ``CONTEXT_HOOK_STATE_DIR``, 0600) remembers the root, the start time and the session's last
prompts and answers, since every hook call is a new process.

Scopes: every unit records its project (``metadata.project``: the git root of the agent's working directory,
else that directory), and context comes from the current project and the units marked global unless
``CONTEXT_HOOK_SCOPE=global`` (the service's ``project`` search field, docs/design.md §4).

Nothing injected is stored again: every text is first cleared of the context a hook injected, wherever an agent
echoed it (``fence.strip_injected``), then cut to ``CONTEXT_HOOK_MAX_CHARS`` and masked. Context from the
shared memory comes from ``POST /mcp/context`` (fenced by the service, under a relevance floor); the session's
own history comes from the state file alone, fenced here the same way, so no other writer can add to it.
"""
from __future__ import annotations

import json
import os
import re
import time

from ..cid import compute_cid, sha256
from .gitremote import identity
from .fence import fence, strip_injected
from ..masking import mask
from ..textsplit import split_text

CHUNK_CHARS = 2000                    # as `context-mode import` cuts text files
MAX_INPUT_CHARS = 300                 # the short form of a tool's input kept in metadata
MAX_QUERY_CHARS = 2000
MAX_HISTORY_CHARS = 1200              # of one remembered prompt or answer (as /mcp/context cuts items)
KEEP_HISTORY = 6                      # prompts and answers remembered: the session's history and its query
STATE_DAYS = 7                        # state files of sessions idle longer than this are removed
MAX_PROJECT_CHARS = 1024              # the service's limit on a project key (service/unitkeys.py)
EARLIER_TYPES = ["user_input", "tool_output", "model_thinking"]   # not the sessions' roots (system notices)
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CJK = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"   # (compiled when used: ~6 ms)
# This service's own MCP tools: their results are stored units already.
OWN_TOOLS = re.compile(r"(^|[_:.])(context_search|context_push|context_forget|tool_search)$")
SESSION_HEADER = "[Context Mode] This session so far (your earlier prompts and answers), from this machine's record:"
EARLIER_HEADER = "[Context Mode] Earlier work relevant to this, from the shared memory:"


class HookTimeout(Exception):
    """The hook's deadline passed before this step."""


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def tokens(text: str) -> int:
    """The service's estimate (service/packing.py): one token per CJK character, one per four others."""
    cjk = len(re.findall(_CJK, text))
    return cjk + (len(text) - cjk + 3) // 4


def digest(value) -> str:
    return sha256(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()[:16]


def short_input(tool_input) -> str:
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


def project_of(cwd: str, key: str = "path") -> str | None:
    """The project a working directory belongs to: its git root (a ``.git`` folder or file, so worktrees and
    submodules count), else the directory itself; None without one. With ``key`` "remote"
    (``CONTEXT_HOOK_PROJECT_KEY``), a repository whose ``origin`` has a network URL is named by that instead
    (``git:host/owner/repo``, gitremote.py), so one repository cloned at ``/app`` on two machines is one project, and two
    repositories at ``/app`` are two. A path the service could not take as a key (too long, a control character)
    is named by its digest instead."""
    if not cwd:
        return None
    path = os.path.abspath(cwd)
    here, root = path, None
    for _ in range(64):
        if os.path.exists(os.path.join(here, ".git")):
            path = root = here
            break
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if key == "remote" and root is not None:
        repository = identity(root)
        if repository is not None:
            path = f"git:{repository}"
    if len(path) > MAX_PROJECT_CHARS or CONTROL.search(path):
        return "path-sha256:" + sha256(path.encode("utf-8", "surrogatepass")).hexdigest()
    return path


class State:
    """One session's memory between hook calls: a JSON file (0600), replaced whole on every write."""

    def __init__(self, directory: str, client: str, session: str):
        self.dir = directory
        self.path = os.path.join(directory, f"{client}-{digest(session)}.json")
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            data = {}
        self.data: dict = data if isinstance(data, dict) else {}
        self.new = not self.data

    def save(self) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self.data, fh, ensure_ascii=False)
        os.replace(tmp, self.path)
        if self.new:
            self.new = False
            self._sweep()

    def _sweep(self) -> None:
        cutoff = time.time() - STATE_DAYS * 86_400
        try:
            names = [n for n in os.listdir(self.dir) if n.endswith(".json")]
        except OSError:
            return
        for name in names:
            old = os.path.join(self.dir, name)
            try:
                if os.stat(old).st_mtime < cutoff:
                    os.unlink(old)
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
        self.project = project_of(event.cwd, settings.project_key)
        self._prompt: str | None = None
        self.why: str | None = None         # why the last ask for earlier work gave none
        legacy = self.state.data.pop("prompts", None)      # (an earlier version's list of the last prompts)
        if isinstance(legacy, list) and legacy and isinstance(legacy[-1], dict):
            self.state.data.setdefault("prompt", legacy[-1].get("cid"))

    # --- text as stored: our own context out, capped, masked ---------------------------------------
    def _mask(self, text: str) -> str:
        if self.deadline.left() <= 0:
            raise HookTimeout()             # never a partly masked text: nothing at all
        return mask(text, self.literals)

    def clean(self, text: str) -> str:
        return self._mask(strip_injected(text)[:self.settings.max_chars])

    def cut(self, text: str) -> dict:
        """The metadata of a text stored cut: ``truncated``, and ``total_chars`` unless the event itself was cut
        at ``CONTEXT_HOOK_MAX_EVENT_BYTES`` (the rest was never read)."""
        if self.event.cut:
            return {"truncated": True}
        if len(text) > self.settings.max_chars:
            return {"truncated": True, "total_chars": len(text)}
        return {}

    # --- units ----------------------------------------------------------------------------------
    def _unit(self, content: str, type_: str, source: str, metadata: dict, parent: str | None,
              timestamp: int | None = None) -> dict:
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
        project = self._mask(self.project) if self.project else None
        return {"session_id": self._mask(clip(self.session, 200)), "cwd": self._mask(clip(self.event.cwd, 500)),
                "project": project, "hook": f"{self.client} {self.event.name}", **extra}

    def root(self) -> dict:
        """The session root: the same unit (CID and metadata) on every call of the session, its metadata that of
        the call that first stored it, however often later calls store it again."""
        text = self._mask(f"{self.client} session {self.session} started")   # (not the cwd: a new session's query)
        meta = self.state.data.get("root_meta")
        if not isinstance(meta, dict):
            meta = self.state.data["root_meta"] = self._meta()
        unit = self._unit(text, "system_notice", f"{self.client}_session", meta, None, timestamp=self.started)
        self.state.data["root"] = unit["cid"]
        return unit

    def _push(self, units: list) -> list:
        if self.deadline.left() <= 0:
            raise HookTimeout()
        return self.api.push_batch(units)

    def _push_later(self, units: list):
        """A push whose answer is read after the context is asked for (they run side by side in the service)."""
        if self.deadline.left() <= 0:
            raise HookTimeout()
        return self.api.push_later(units)

    def _remember(self, type_: str, cid: str, text: str) -> None:
        history = self.state.data.setdefault("history", [])
        history.append({"type": type_, "cid": cid, "text": clip(text, MAX_HISTORY_CHARS)})
        del history[:-KEEP_HISTORY]

    def push_root(self):
        """The session root, sent; the pending answer (``result()``)."""
        root = self.root()
        self.state.save()
        return self._push_later([root])

    def prompt(self) -> str:
        """The event's prompt as stored and asked with (cleaned once)."""
        if self._prompt is None:
            self._prompt = self.clean(self.event.prompt)
        return self._prompt

    def push_prompt(self):
        """The prompt (with the root), sent; the pending answer, or None when there is nothing to store."""
        text = self.prompt()
        if not text.strip():
            return None
        root = self.root()
        unit = self._unit(text, "user_input", f"{self.client}_prompt", self._meta(**self.cut(self.event.prompt)),
                          root["cid"])
        self.state.data["prompt"] = unit["cid"]
        self._remember("user_input", unit["cid"], text)
        self.state.save()                   # before the push: a slow service must not lose the lineage
        return self._push_later([root, unit])

    def push_tool_output(self) -> None:
        e = self.event
        if not e.tool_output.strip() or OWN_TOOLS.search(e.tool_name) or \
                (self.settings.skip_tools and self.settings.skip_tools.search(e.tool_name)):
            return
        text = self.clean(e.tool_output)
        parts = split_text(text, CHUNK_CHARS) or []
        parent = self.state.data.get("prompt")
        units = [] if parent else [self.root()]
        meta = self._meta(tool=e.tool_name, input=self._mask(short_input(e.tool_input)), **self.cut(e.tool_output))
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
        text = self.clean(self.event.answer)
        if not text.strip():
            return
        root = self.root()
        unit = self._unit(text, "model_thinking", f"{self.client}_answer",
                          self._meta(prompt_cid=self.state.data.get("prompt"), **self.cut(self.event.answer)),
                          root["cid"])
        self._remember("model_thinking", unit["cid"], text)
        self.state.save()
        self._push([root, unit])

    def note_compaction(self, real: bool) -> None:
        """A compaction the agent shows evidence of: the next start or prompt brings the session's history back."""
        if real:
            self.state.data["compacted"] = True
            self.state.save()

    # --- context --------------------------------------------------------------------------------
    def _context(self, query: str, budget: int) -> tuple[str, int]:
        """Earlier work from the shared memory: this project's and the global units (unless the scope is
        global), of sessions started before this one, above the relevance floor, fenced by the service. When it
        gives none, ``why`` says why (the hook logs it)."""
        text, used, self.why = self._earlier(query, budget)
        return text, used

    def _earlier(self, query: str, budget: int) -> tuple[str, int, str | None]:
        if budget < 50:                     # (0 is the user's "store only": nothing to say about it)
            return "", 0, None if self.settings.budget_tokens == 0 else \
                f"{budget} tokens of CONTEXT_HOOK_BUDGET_TOKENS left, under the 50 a context needs"
        if not query.strip():
            return "", 0, "no text to ask the memory with"
        left = self.deadline.left()
        if left <= 0.05:
            return "", 0, (f"{max(0, round(left * 1000))} ms of the {round(self.settings.timeout_s * 1000)} ms "
                           "deadline (CONTEXT_HOOK_TIMEOUT_MS) were left, too few to ask the memory")
        params = {"budget_tokens": budget, "max_chars_per_item": MAX_HISTORY_CHARS, "types": EARLIER_TYPES,
                  "until": max(0, self.started - 1)}
        if self.settings.scope == "project" and self.project:
            params["project"] = self._mask(self.project)
        rv = self.api.context(clip(query, MAX_QUERY_CHARS), **params)
        items = rv.get("items") or ()
        if not items:
            where = "this project's and the global units" if "project" in params else "the memory"
            return "", 0, f"nothing in {where} from earlier sessions matches"
        # The floor applies to the best match (its 0-1 score says how much of the query the memory answers at
        # all); the items with it are the service's own choice (near the best one, within the budget).
        best = max(i.get("score") or 0 for i in items)
        if best < self.settings.min_score:
            return "", 0, (f"the best match scores {best:.3f}, under the floor "
                           f"CONTEXT_HOOK_MIN_SCORE={self.settings.min_score:g}")
        if not rv.get("context"):
            return "", 0, "the service packed no context of its matches"
        return rv["context"], int(rv.get("tokens") or 0), None

    def _history(self, budget: int) -> tuple[str, int]:
        """The session's own prompts and answers, newest first within ``budget`` tokens, from the state file
        alone (what this session stored; nothing another writer could add)."""
        items, used = [], 0
        for h in reversed(self.state.data.get("history") or []):
            cost = tokens(h["text"]) + 12
            if used + cost > budget:
                break
            items.append((h["type"], h["cid"], h["text"]))
            used += cost
        return (fence(items[::-1]), used) if items else ("", 0)

    def session_context(self, history: bool) -> str | None:
        """At a session's start: its own history (after a compaction or on resume), then the most relevant
        earlier work."""
        budget = self.settings.budget_tokens
        remembered = self.state.data.get("history") or []
        blocks = []
        if history and remembered and budget >= 50:
            text, used = self._history(budget // 2)
            if text:
                blocks.append(f"{SESSION_HEADER}\n{text}")
                budget -= used
        self.state.data.pop("compacted", None)
        query = "\n".join(h["text"] for h in remembered)
        if not query:                       # a new session: what this project's name finds
            parts = [p for p in (self.event.cwd or "").replace("\\", "/").split("/") if p]
            query = " ".join(parts[-2:])
        text, _ = self._context(query, budget)
        if text:
            blocks.append(f"{EARLIER_HEADER}\n{text}")
        self.state.save()
        return "\n\n".join(blocks) or None

    def prompt_context(self) -> str | None:
        if self.state.data.get("compacted"):        # compaction dropped the session's own history
            return self.session_context(history=True)
        text, _ = self._context(self.prompt(), self.settings.budget_tokens)
        return f"{EARLIER_HEADER}\n{text}" if text else None

    # --- routing (off by default) -------------------------------------------------------------
    def route(self, default_tools: tuple) -> str | None:
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
        params = {"top_k": 3}
        if self.settings.scope == "project" and self.project:
            params["project"] = self._mask(self.project)
        hits = self.api.search(query, **params)["results"]
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
