"""Live context and the tool registry (issue 16): GET /mcp/stream and /mcp/tools.

``ContextModeClient`` has these methods (mixed in from here); they use only the public HTTP API.
"""
from __future__ import annotations

import json
import random
import socket
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import requests

from .errors import ContextModeError, error_from


class Stream:
    """An open GET /mcp/stream: iterate it for new units (dicts, with ``seq``). It reconnects by itself
    after a dropped connection or a server end, resuming after ``last_event_id``, so nothing is lost.
    ``close()`` (from any thread) ends it."""

    def __init__(self, client, params: dict, last_event_id: Optional[int], reconnect: bool, read_timeout: float):
        self.client, self.params, self.reconnect = client, params, reconnect
        self.last_event_id = last_event_id
        self.read_timeout = read_timeout
        self.closed = False
        self._response: Optional[requests.Response] = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            rv = self._response
        if rv is not None:
            _abort(rv)

    def _drop(self) -> None:
        """Break the current connection off (as a network failure would); the iterator reconnects."""
        rv = self._response
        if rv is not None:
            _abort(rv)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[dict]:
        attempt, retry_s = 0, 2.0
        while not self.closed:
            headers = {"Accept": "text/event-stream"}
            if self.last_event_id is not None:
                headers["Last-Event-ID"] = str(self.last_event_id)
            try:
                rv = self.client.session.get(self.client.url + "/mcp/stream", params=self.params, headers=headers,
                                             stream=True, timeout=(self.client.timeout, self.read_timeout))
            except (requests.ConnectionError, requests.Timeout) as e:
                error = ContextModeError(f"{type(e).__name__}: {e}", code="connection_error")
            else:
                if rv.status_code >= 400:
                    error = error_from(rv)
                    rv.close()
                    if not error.retryable:
                        raise error
                else:
                    with self._lock:
                        if self.closed:
                            rv.close()
                            return
                        self._response = rv
                    attempt = 0
                    try:
                        for event, data, event_id in _events(rv):
                            if event == "unit":
                                unit = json.loads(data)
                                self.last_event_id = int(event_id) if event_id else unit.get("seq")
                                yield unit
                            elif event == "retry":
                                retry_s = max(0.1, int(data) / 1000)
                    except (requests.RequestException, ValueError, AttributeError):
                        pass                       # dropped (or closed by close()): reconnect below
                    finally:
                        rv.close()
                    error = None
            if self.closed or not self.reconnect:
                return
            if error is not None and attempt >= self.client.retries:
                raise error
            delay = retry_s if error is None else min(self.client.max_backoff, self.client.backoff * 2 ** attempt)
            attempt += error is not None
            time.sleep(delay * (0.5 + random.random() / 2))


def _abort(rv: requests.Response) -> None:
    """Close a streaming response another thread may be blocked reading: shut the socket down first
    (closing alone waits for that read, i.e. for the server's next heartbeat)."""
    conn = getattr(rv.raw, "connection", None) or getattr(rv.raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    rv.close()


def _events(rv: requests.Response) -> Iterator[tuple[str, str, Optional[str]]]:
    """(event, data, id) of each SSE event; ``retry:`` fields come out as ("retry", ms, None)."""
    event, data, event_id = "message", [], None
    for raw in rv.iter_lines(decode_unicode=True):
        if raw is None:
            continue
        if raw == "":
            if data:
                yield event, "\n".join(data), event_id
            event, data, event_id = "message", [], None
            continue
        if raw.startswith(":"):
            continue                               # a comment: the server's heartbeat
        field, _, value = raw.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value
        elif field == "retry" and value.isdigit():
            yield "retry", value, None


class LiveMixin:
    """Methods of ContextModeClient for GET /mcp/stream and the tool registry."""

    # --- live context ----------------------------------------------------------------------------
    def stream(self, query: Optional[str] = None, *, types: Optional[Iterable[str]] = None,
               source: Optional[str] = None, operator: Optional[str] = None, last_event_id: Optional[int] = None,
               reconnect: bool = True, read_timeout: float = 60.0) -> Stream:
        """New units matching ``query`` (any word; ``operator="and"``: all), ``types`` and ``source`` as they
        are indexed: ``for unit in cm.stream("ORD-7890"): ...``. Pass ``last_event_id`` (a unit's ``seq``)
        to resume after it; the stream resumes by itself after a reconnect."""
        params: dict[str, Any] = {}
        if query:
            params["query"] = query
        if types:
            params["types"] = ",".join(types)
        if source:
            params["source"] = source
        if operator:
            params["operator"] = operator
        return Stream(self, params, last_event_id, reconnect, read_timeout)

    def watch(self, callback: Callable[[dict], Any], query: Optional[str] = None, **filters) -> Stream:
        """Call ``callback(unit)`` for each new matching unit on a background thread; ``.close()`` the
        returned stream to stop. Same filters as :meth:`stream`."""
        stream = self.stream(query, **filters)

        def run():
            try:
                for unit in stream:
                    callback(unit)
            except Exception:  # noqa: BLE001 - a watcher thread must not die loudly; the caller closes it
                stream.close()
        threading.Thread(target=run, name="context-mode-watch", daemon=True).start()
        return stream

    # --- tool registry ---------------------------------------------------------------------------
    def register_tool(self, tool: dict) -> dict:
        """Register a tool (admin key): name, description, input_schema (JSON Schema 2020-12), and optional
        title, endpoint, auth_type, tags, metadata, output_schema. Credentials are refused."""
        return self.request("POST", "/mcp/tools", body=tool)

    def update_tool(self, name: str, tool: dict) -> dict:
        return self.request("PUT", f"/mcp/tools/{name}", body=tool)

    def get_tool(self, name: str) -> dict:
        return self.request("GET", f"/mcp/tools/{name}")

    def delete_tool(self, name: str) -> dict:
        return self.request("DELETE", f"/mcp/tools/{name}")

    def find_tools(self, query: str, *, top_k: int = 5, tags: Optional[Iterable[str]] = None,
                   auth_type: Optional[str] = None) -> list[dict]:
        """The registered tools best matching a description of what they should do, with their schemas."""
        params: dict[str, Any] = {"q": query, "top_k": top_k}
        if tags:
            params["tags"] = ",".join(tags)
        if auth_type:
            params["auth_type"] = auth_type
        return self.request("GET", "/mcp/tools", params=params)["tools"]

    def list_tools(self, *, tags: Optional[Iterable[str]] = None, auth_type: Optional[str] = None,
                   page_size: int = 100) -> Iterator[dict]:
        """Every registered tool by name (pages fetched as needed)."""
        params: dict[str, Any] = {"limit": page_size}
        if tags:
            params["tags"] = ",".join(tags)
        if auth_type:
            params["auth_type"] = auth_type
        while True:
            page = self.request("GET", "/mcp/tools", params=params)
            yield from page["tools"]
            if "next_after" not in page:
                return
            params["after"] = page["next_after"]
