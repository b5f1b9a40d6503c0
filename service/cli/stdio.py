"""``context-mode mcp-stdio``: a stdio bridge for hosts that only launch local processes (docs/design.md §7).

Newline-delimited JSON-RPC from stdin is POSTed, one message per request, to the Streamable
HTTP endpoint; each JSON response becomes one line on stdout. Nothing but protocol goes to
stdout (logs go to stderr) and the bridge exits 0 when stdin closes. The HTTP headers a
server checks are derived from each message: for 2026-07-28 the revision, method and name
mirrored from the body; for the handshake era the revision ``initialize`` negotiated.

``--url`` is the service's base URL (as for ``context-mode push``) or its ``/mcp`` endpoint;
the variables are the CLI's: ``CONTEXT_URL`` and ``CONTEXT_API_KEY``.
"""
from __future__ import annotations

import base64
import json
import logging
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import click
import requests

from .env import KEY_VAR, URL_VAR, from_env

log = logging.getLogger("context-mode.mcp-stdio")

PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")
INTERNAL_ERROR = -32603
INVALID_REQUEST = -32600
PARSE_ERROR = -32700
# The longest line the bridge reads (a message is one line); longer ones are read on in bounded chunks,
# dropped, and answered with INVALID_REQUEST. The server's own /mcp body cap is ~2 MiB by default.
MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1024 * 1024
DEFAULT_URL = "http://127.0.0.1:5000"


def mcp_endpoint(url: str) -> str:
    """The MCP endpoint for a base URL or an endpoint URL: ``/mcp`` appended unless already there."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    if not path.endswith("/mcp"):
        path += "/mcp"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def header_value(value: str) -> str:
    """Plain printable ASCII as is, anything else in the ``=?base64?...?=`` form servers decode."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not value.startswith("=?base64?"):
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


class Bridge:
    """Forwards messages to one MCP endpoint and remembers the handshake revision."""

    def __init__(self, url: str, api_key: str | None, out, *, timeout: float = 120.0, workers: int = 4):
        self.url = url
        self.out = out
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({"Content-Type": "application/json",
                                     "Accept": "application/json, text/event-stream"})
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.negotiated: str | None = None   # set by an `initialize` result (handshake era)
        self._write_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mcp-stdio")
        # Open subscriptions/listen streams by request id: each on its own thread (they last), closed by
        # the host's notifications/cancelled (on stdio that is how a client ends a subscription).
        self._listens: dict = {}
        self._listen_threads: list[threading.Thread] = []

    # --- headers ---------------------------------------------------------------------------------
    def headers_for(self, msg) -> dict:
        if not isinstance(msg, dict):
            return {}
        method = msg.get("method")
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        version = meta.get(PROTOCOL_VERSION_META_KEY)
        headers: dict[str, str] = {}
        if isinstance(version, str):
            headers["MCP-Protocol-Version"] = header_value(version)
            if isinstance(method, str):
                headers["Mcp-Method"] = header_value(method)
                name = params.get(NAME_BEARING.get(method, ""), None)
                if isinstance(name, str):
                    headers["Mcp-Name"] = header_value(name)
        elif method != "initialize" and self.negotiated:
            headers["MCP-Protocol-Version"] = self.negotiated
        return headers

    # --- one message ---------------------------------------------------------------------------
    def handle_line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        try:
            msg = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            # The host sent something unparsable: answer as a server would, then carry on.
            self.write({"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": "Parse error"}})
            return
        if not _encodable(msg):
            # A lone surrogate (e.g. "\ud83d" in a method or tool name) has no UTF-8 form: no header, no body.
            rid = msg.get("id") if isinstance(msg, dict) else None
            self.write({"jsonrpc": "2.0", "id": rid if _is_id(rid) else None, "error": {
                "code": INVALID_REQUEST, "message": "Invalid Request: a string is not valid Unicode (lone surrogate)"}})
            return
        method = msg.get("method") if isinstance(msg, dict) else None
        if method == "initialize":
            self.forward(line, msg)      # later messages need the negotiated revision: no overtaking
        elif method == "subscriptions/listen" and "id" in msg:
            thread = threading.Thread(target=self.forward, args=(line, msg), name="mcp-stdio-listen", daemon=True)
            self._listen_threads.append(thread)
            thread.start()
        elif method == "notifications/cancelled" and self._cancel_listen(msg.get("params")):
            return                       # closing the HTTP stream is the cancellation (Streamable HTTP)
        else:
            self._pool.submit(self.forward, line, msg)

    def _cancel_listen(self, params) -> bool:
        rid = params.get("requestId") if isinstance(params, dict) else None
        if isinstance(rid, (str, int)) and not isinstance(rid, bool):
            rv = self._listens.pop(rid, None)
            if rv is not None:
                rv.close()
                return True
        return False

    def forward(self, body: bytes, msg) -> None:
        """POST one message; whatever goes wrong, a request gets an answer (on a pool thread an exception
        would otherwise vanish, and the host would wait for ever)."""
        try:
            self._forward(body, msg)
        except Exception as e:   # noqa: BLE001 - the last resort: answer, log, carry on
            log.exception("cannot forward a message")
            if isinstance(msg, dict) and "id" in msg and "method" in msg:
                self.write(_error(msg.get("id"), f"The bridge could not forward this request: {type(e).__name__}"))

    def _forward(self, body: bytes, msg) -> None:
        rid = msg.get("id") if isinstance(msg, dict) else None
        expects_reply = isinstance(msg, dict) and "id" in msg and "method" in msg
        try:
            rv = self.session.post(self.url, data=body, headers=self.headers_for(msg), timeout=self.timeout,
                                   stream=True)
        except requests.RequestException as e:
            log.error("POST %s failed: %s", self.url, e)
            if expects_reply:
                self.write(_error(rid, f"Cannot reach the MCP server at {self.url}: {type(e).__name__}"))
            return
        with rv:
            if rv.status_code == 202:
                return
            if not expects_reply:
                self._forward_unasked(rv)
                return
            ctype = rv.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if ctype == "text/event-stream":
                listen = msg.get("method") == "subscriptions/listen"
                if listen:
                    self._listens[rid] = rv
                try:
                    for reply in _sse_messages(rv):
                        self._reply(reply, rid, msg, rv.status_code)
                except (requests.RequestException, AttributeError, ValueError):
                    if not listen or rid in self._listens:
                        log.error("the SSE stream of request %r broke off", rid)
                finally:
                    if listen:
                        self._listens.pop(rid, None)
                return
            try:
                reply = rv.json()
            except ValueError:
                log.error("HTTP %s from %s without a JSON-RPC body", rv.status_code, self.url)
                self.write(_error(rid, f"HTTP {rv.status_code} from the MCP server"))
                return
            self._reply(reply, rid, msg, rv.status_code)

    def _forward_unasked(self, rv) -> None:
        """A message that asks no answer (a notification, or no request at all: ``[1,2,3]``, ``42``, ``{}``): the
        server's JSON-RPC errors about it, when it gives them, reach the host as ``/mcp`` gives them (issue 50, I1:
        the bridge said nothing where ``/mcp`` answers -32600)."""
        if "json" not in rv.headers.get("Content-Type", ""):
            return
        try:
            reply = rv.json()
        except ValueError:
            return
        replies = reply if isinstance(reply, list) else [reply]
        if replies and all(_is_jsonrpc(r) and "error" in r for r in replies):
            self.write(reply)

    def _reply(self, reply, rid, msg, status: int = 200) -> None:
        if not _is_jsonrpc(reply):
            # e.g. a REST error body from a wrong URL: stdout carries only JSON-RPC, so wrap it.
            detail = reply.get("error") if isinstance(reply, dict) else None
            text = f"HTTP {status} from {self.url} without a JSON-RPC answer"
            if isinstance(detail, str):
                text += f": {detail}"
            log.error("%s (is --url the service's base URL or its /mcp endpoint?)", text)
            self.write(_error(rid, text))
            return
        if isinstance(reply, dict) and ("result" in reply or "error" in reply):
            if reply.get("id") is None:
                reply["id"] = rid        # errors raised before the server could read the id
            if msg.get("method") == "initialize" and isinstance(reply.get("result"), dict):
                version = reply["result"].get("protocolVersion")
                self.negotiated = version if isinstance(version, str) else None
        self.write(reply)

    def write(self, obj) -> None:
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        with self._write_lock:
            self.out.write(data)
            self.out.flush()

    def close(self) -> None:
        for rv in list(self._listens.values()):
            rv.close()                   # stdin closed: the host is gone, so are its subscriptions
        self._pool.shutdown(wait=True)
        for thread in self._listen_threads:
            thread.join(timeout=5)
        self.session.close()

    def run(self, stdin, max_line: int = MAX_LINE_BYTES) -> None:
        try:
            while True:
                line = stdin.readline(max_line + 1)
                if not line:
                    break
                if len(line) > max_line and not line.endswith(b"\n"):
                    self._drop_long_line(stdin, max_line)
                    continue
                self.handle_line(line)
        finally:
            self.close()

    def _drop_long_line(self, stdin, max_line: int) -> None:
        """Read the rest of an overlong line in bounded chunks and answer it (its id cannot be read)."""
        while True:
            chunk = stdin.readline(_CHUNK)
            if not chunk or chunk.endswith(b"\n"):
                break
        log.error("dropped a line longer than %d bytes", max_line)
        self.write({"jsonrpc": "2.0", "id": None, "error": {
            "code": INVALID_REQUEST, "message": f"Invalid Request: a message longer than {max_line} bytes"}})


def _is_id(rid) -> bool:
    return (isinstance(rid, (int, str)) and not isinstance(rid, bool)) and _encodable(rid)


def _encodable(value) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return False
    return True


def _is_jsonrpc(reply) -> bool:
    return isinstance(reply, dict) and reply.get("jsonrpc") == "2.0" and ("result" in reply or "error" in reply
                                                                          or "method" in reply)


def _error(rid, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": INTERNAL_ERROR, "message": message}}


def _sse_messages(rv):
    """JSON-RPC messages from an SSE response (``event: message`` frames)."""
    data: list[str] = []
    for raw in rv.iter_lines(decode_unicode=True):
        if raw is None:
            continue
        if raw == "":
            if data:
                try:
                    yield json.loads("\n".join(data))
                except ValueError:
                    log.error("unparsable SSE frame from the server")
                data = []
            continue
        if raw.startswith("data:"):
            data.append(raw[5:].lstrip(" "))


def register_cli(main: click.Group) -> None:
    @main.command("mcp-stdio")
    @click.option("--url", default=None,
                  help=f"The service's base URL or its /mcp endpoint [env var: CONTEXT_URL; default: {DEFAULT_URL}].")
    @click.option("--api-key", default=None, help="API key (Bearer) [env var: CONTEXT_API_KEY].")
    @click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for one response.")
    def mcp_stdio(url, api_key, timeout):
        """Bridge MCP over stdio (newline-delimited JSON-RPC) to the HTTP endpoint."""
        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        url = mcp_endpoint(url or from_env(URL_VAR) or DEFAULT_URL)
        if api_key is None:
            api_key = from_env(KEY_VAR)
        log.info("forwarding stdio to %s", url)
        bridge = Bridge(url, api_key, sys.stdout.buffer, timeout=timeout)
        try:
            bridge.run(sys.stdin.buffer)
        except BrokenPipeError:
            pass                           # the host went away: nothing left to tell it
        except KeyboardInterrupt:
            pass
        log.info("stdin closed; exiting")
