"""A scripted model API on loopback for the agents' own CLIs (no model account needed; no ``test_`` prefix).

It speaks the two wire formats the CLIs use, written from the providers' API references:
- Anthropic Messages (``POST /v1/messages``, what Claude Code sends with ``ANTHROPIC_BASE_URL``): with
  ``"stream": true`` a Server-Sent Events stream (``message_start``, ``content_block_start``,
  ``content_block_delta`` with ``text_delta`` or ``input_json_delta``, ``content_block_stop``,
  ``message_delta`` with the ``stop_reason``, ``message_stop``), else one JSON message; ``count_tokens``.
- Gemini (``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``, what
  Gemini CLI sends with ``GOOGLE_GEMINI_BASE_URL``): ``GenerateContentResponse`` objects (``candidates[0]
  .content.parts`` with ``text`` or ``functionCall``, ``finishReason``, ``usageMetadata``), one per
  ``data:`` line when streamed; ``countTokens``.

The script: a request whose newest user turn holds ``trigger`` (and no tool result yet) is answered with one
call of the agent's shell tool running ``command``; a request carrying that tool's result is answered with a
final text quoting it; anything else with ``reply``. Every request body is kept (``requests``) so a test can
assert on what each CLI sent to the model.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SHELL_TOOLS = {"anthropic": "Bash", "gemini": "run_shell_command"}


class ScriptedModel:
    def __init__(self, trigger: str, command: str, reply: str = "Noted."):
        self.trigger, self.command, self.reply = trigger, command, reply
        self.requests: list[tuple[str, dict]] = []          # (path, body) in arrival order
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._json(404, {"error": {"message": "not scripted"}})

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size) if size else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                with model._lock:
                    model.requests.append((self.path, body))
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    return self._json(200, {"input_tokens": 100})
                if path.endswith(":countTokens"):
                    return self._json(200, {"totalTokens": 100})
                if path.endswith("/v1/messages"):
                    return self._anthropic(body)
                if ":generateContent" in path or ":streamGenerateContent" in path:
                    return self._gemini(body, stream=":streamGenerateContent" in path)
                self._json(404, {"error": {"message": f"not scripted: {path}"}})

            def _json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    line = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
                    self.wfile.write(line.encode())
                    self.wfile.flush()
                self.close_connection = True

            # --- Anthropic Messages -------------------------------------------------------------
            def _anthropic(self, body):
                action = model.decide(anthropic_turns(body), has_tools=bool(body.get("tools")))
                if action[0] == "tool":
                    block = {"type": "tool_use", "id": "toolu_scripted01", "name": SHELL_TOOLS["anthropic"],
                             "input": {"command": action[1], "description": "Run the scripted command"}}
                    stop = "tool_use"
                else:
                    block = {"type": "text", "text": action[1]}
                    stop = "end_turn"
                message = {"id": "msg_scripted", "type": "message", "role": "assistant",
                           "model": body.get("model", "claude-scripted"), "stop_reason": None, "stop_sequence": None,
                           "usage": {"input_tokens": 100, "output_tokens": 0}, "content": []}
                if not body.get("stream"):
                    return self._json(200, {**message, "content": [block], "stop_reason": stop,
                                            "usage": {"input_tokens": 100, "output_tokens": 10}})
                start = dict(block, input={}) if block["type"] == "tool_use" else dict(block, text="")
                delta = ({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                         if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]})
                self._sse([("message_start", {"type": "message_start", "message": message}),
                           ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
                           ("ping", {"type": "ping"}),
                           ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                           ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                           ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop,
                                                                                 "stop_sequence": None},
                                              "usage": {"output_tokens": 10}}),
                           ("message_stop", {"type": "message_stop"})])

            # --- Gemini generateContent ----------------------------------------------------------
            def _gemini(self, body, stream: bool):
                tools = [d for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []]
                action = model.decide(gemini_turns(body), has_tools=any(
                    d.get("name") == SHELL_TOOLS["gemini"] for d in tools))
                config = body.get("generationConfig") or {}
                if config.get("responseMimeType") == "application/json":
                    # the CLI's side questions (model routing, next speaker) want JSON of a schema
                    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
                    part = {"text": json.dumps(fill(schema))}
                elif action[0] == "tool":
                    part = {"functionCall": {"name": SHELL_TOOLS["gemini"], "args": {"command": action[1]}}}
                else:
                    part = {"text": action[1]}
                response = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                                            "index": 0}],
                            "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 10,
                                              "totalTokenCount": 110},
                            "modelVersion": "gemini-scripted"}
                if stream:
                    return self._sse([(None, response)])
                self._json(200, response)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def decide(self, turns: list[tuple[str, str]], has_tools: bool) -> tuple[str, str]:
        """("tool", command) or ("text", reply) for a conversation given as (kind, text) turns, kind one of
        "user", "tool_result", "model"."""
        # (what a hook injected rides in user turns too, and quotes earlier prompts: it is not the user asking)
        last_user = next((i for i in range(len(turns) - 1, -1, -1)
                          if turns[i][0] == "user" and "[Context Mode]" not in turns[i][1]), None)
        results = [t for k, t in turns[(last_user or 0):] if k == "tool_result"]
        if results:
            return "text", "The command printed: " + " ".join(results[-1].split())[:300]
        if has_tools and last_user is not None and self.trigger in turns[last_user][1]:
            return "tool", self.command
        return "text", self.reply

    def sent(self, text: str) -> list[dict]:
        """The request bodies that carry ``text`` anywhere."""
        return [b for _, b in self.requests if text in json.dumps(b, ensure_ascii=False)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fill(schema: dict, name: str = ""):
    """A small value of a JSON schema (the Gemini API's upper-case types too): the user speaks next, a task
    is simple."""
    kind = str(schema.get("type", "object")).lower()
    if schema.get("enum"):
        return "user" if "user" in schema["enum"] else schema["enum"][0]
    if kind == "object":
        return {k: fill(v, k) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 10
    if kind == "boolean":
        return False
    return "user" if name == "next_speaker" else "scripted"


def anthropic_turns(body: dict) -> list[tuple[str, str]]:
    out = []
    for m in body.get("messages") or []:
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for b in blocks:
            if b.get("type") == "tool_result":
                inner = b.get("content")
                text = inner if isinstance(inner, str) else " ".join(
                    x.get("text", "") for x in inner or [] if isinstance(x, dict))
                out.append(("tool_result", text))
            elif b.get("type") == "text":
                out.append(("user" if m.get("role") == "user" else "model", b.get("text", "")))
    return out


def gemini_turns(body: dict) -> list[tuple[str, str]]:
    out = []
    for c in body.get("contents") or []:
        for p in c.get("parts") or []:
            if "functionResponse" in p:
                out.append(("tool_result", json.dumps(p["functionResponse"].get("response"), ensure_ascii=False)))
            elif "text" in p:
                out.append(("user" if c.get("role") == "user" else "model", p["text"]))
    return out
