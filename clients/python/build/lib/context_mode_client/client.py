"""The client: one ``requests.Session``, retries only where a retry is safe and useful."""
from __future__ import annotations

import json
import random
import time
from typing import Any, Iterable, Iterator, Optional

import requests

from .cid import compute_cid
from .errors import RETRY_STATUSES, ContextModeError, error_from  # noqa: F401 - RETRY_STATUSES: still offered here
from .live import LiveMixin, Stream  # noqa: F401 - stream() and the tool registry (issue 16)

MAX_BATCH = 1000


def make_unit(content: str, *, type: str = "tool_output", source: str, ttl: Optional[int] = None,
              timestamp: Optional[int] = None, metadata: Optional[dict] = None,
              parent_cid: Optional[str] = None, project: Optional[str] = None, is_global: bool = False) -> dict:
    """A unit dict with its CID filled in (timestamp defaults to now; no ``ttl``: the server's default).

    ``project`` sets ``metadata.project`` (searches with ``project=`` then see the unit); ``is_global`` sets
    ``metadata.global`` (seen from every project)."""
    if project is not None or is_global:
        metadata = dict(metadata or {})
        if project is not None:
            metadata["project"] = project
        if is_global:
            metadata["global"] = True
    ts = int(time.time()) if timestamp is None else timestamp
    unit: dict[str, Any] = {"cid": compute_cid(content, ts, source), "type": type, "source": source,
                            "timestamp": ts, "content": content}
    if ttl is not None:
        unit["ttl"] = ttl
    if metadata is not None:
        unit["metadata"] = metadata
    if parent_cid is not None:
        unit["parent_cid"] = parent_cid
    return unit


class ContextModeClient(LiveMixin):
    """:param retries: extra attempts after the first on 429/503/connection errors.
    :param backoff: first delay in seconds, doubled each time (with jitter), capped at ``max_backoff``."""

    def __init__(self, url: str = "http://127.0.0.1:5000", api_key: Optional[str] = None, *,
                 timeout: float = 10.0, retries: int = 4, backoff: float = 0.25, max_backoff: float = 8.0,
                 session: Optional[requests.Session] = None, sleep=time.sleep):
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.session = session or requests.Session()
        self.session.headers.setdefault("User-Agent", "context-mode-client/0.1")
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self._sleep = sleep

    # --- transport ----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, body: Any = None, params: Optional[dict] = None) -> Any:
        """One API call with retries; returns the decoded JSON or raises ContextModeError."""
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        attempt = 0
        while True:
            try:
                rv = self.session.request(method, self.url + path, data=data, params=params,
                                          headers=headers, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                error = ContextModeError(f"{type(e).__name__}: {e}", code="connection_error")
                retry_after = None
            else:
                if rv.status_code < 400:
                    try:
                        return rv.json()
                    except ValueError:
                        raise ContextModeError("The server answered with a body that is not JSON.",
                                               status=rv.status_code, code="invalid_response") from None
                error = error_from(rv)
                retry_after = _retry_after(rv)
            if not error.retryable or attempt >= self.retries:
                raise error
            delay = min(self.max_backoff, self.backoff * 2 ** attempt) * (0.5 + random.random() / 2)
            if retry_after is not None:
                delay = min(self.max_backoff, max(delay, retry_after))
            self._sleep(delay)
            attempt += 1

    # --- API ----------------------------------------------------------------------------------
    def push(self, content_or_unit: Any, **fields) -> dict:
        """Push one unit: a unit dict, or content plus make_unit() keywords (``source`` required)."""
        unit = content_or_unit if isinstance(content_or_unit, dict) else make_unit(content_or_unit, **fields)
        return self.request("POST", "/mcp/push", body=unit)

    def push_batch(self, units: list) -> list[dict]:
        """One batch request (at most 1,000 units): per unit ``{"index", "status", ...}``; failed
        items carry ``"status": "error"``, ``code`` and ``error`` and do not stop the others."""
        return self.request("POST", "/mcp/push", body={"units": list(units)})["results"]

    def push_many(self, units: Iterable[dict], batch_size: int = 500) -> Iterator[dict]:
        """Push any number of units in batches; yields one result per unit with its overall index."""
        batch_size = max(1, min(batch_size, MAX_BATCH))
        batch: list = []
        offset = 0
        for unit in units:
            batch.append(unit)
            if len(batch) == batch_size:
                yield from self._send(batch, offset)
                offset += len(batch)
                batch = []
        if batch:
            yield from self._send(batch, offset)

    def _send(self, batch: list, offset: int) -> Iterator[dict]:
        for r in self.push_batch(batch):
            yield dict(r, index=r["index"] + offset)

    def search(self, query: str, **params) -> dict:
        """POST /mcp/search: ``top_k``, ``types``, ``source``, ``since``, ``until``, ``project`` (that project's
        units and the global ones), ``min_score``, ``consistency`` ("strong" for read-your-writes), ..."""
        return self.request("POST", "/mcp/search", body={"query": query, **params})

    def context(self, query: str, budget_tokens: int = 2000, **params) -> dict:
        """POST /mcp/context: prompt-ready text with [type cid] citations under a token budget."""
        return self.request("POST", "/mcp/context", body={"query": query, "budget_tokens": budget_tokens, **params})

    def get(self, cid: str) -> dict:
        return self.request("GET", f"/mcp/units/{cid}")

    def lineage(self, cid: str) -> dict:
        return self.request("GET", f"/mcp/units/{cid}/lineage")

    def delete(self, cid: str) -> dict:
        return self.request("DELETE", f"/mcp/units/{cid}")

    # --- seeing and managing the memory (issue 15) --------------------------------------------
    def list_units(self, *, limit: int = 50, cursor: Optional[str] = None, **filters) -> dict:
        """GET /mcp/units: one page, latest stored first: ``{"units", "next_cursor"}``. Filters: ``types``,
        ``source`` (exact or prefix ``*``), ``since``, ``until``, ``parent_cid``."""
        params = _filter_params(filters)
        params["limit"] = limit
        if cursor:
            params["cursor"] = cursor
        return self.request("GET", "/mcp/units", params=params)

    def iter_units(self, page_size: int = 200, **filters) -> Iterator[dict]:
        """Every live unit matching the filters, latest stored first, page after page."""
        cursor = None
        while True:
            page = self.list_units(limit=page_size, cursor=cursor, **filters)
            yield from page["units"]
            cursor = page["next_cursor"]
            if not cursor:
                return

    def stats(self) -> dict:
        """GET /mcp/stats: units and bytes per type and per day, oldest/newest, index backlog, day files."""
        return self.request("GET", "/mcp/stats")

    def export(self, **filters) -> Iterator[dict]:
        """GET /mcp/export: every live unit (optionally filtered), oldest first, streamed; each dict is
        what a push takes back (``push_many(client.export())`` copies a store)."""
        try:
            rv = self.session.get(self.url + "/mcp/export", params=_filter_params(filters), stream=True,
                                  timeout=self.timeout)
        except (requests.ConnectionError, requests.Timeout) as e:
            raise ContextModeError(f"{type(e).__name__}: {e}", code="connection_error") from None
        with rv:
            if rv.status_code >= 400:
                raise error_from(rv)
            for line in rv.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def forget(self, *, confirm: Optional[str] = None, query: Optional[str] = None, cids: Optional[list] = None,
               operator: Optional[str] = None, **filters) -> dict:
        """POST /mcp/forget (admin key). Without ``confirm``: a dry run, ``{"count", "sample", "confirm"}``;
        call again with the same arguments and ``confirm=dry_run["confirm"]`` to forget them."""
        body: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        if isinstance(body.get("types"), str):
            body["types"] = [body["types"]]
        for name, value in (("query", query), ("cids", cids), ("operator", operator), ("confirm", confirm)):
            if value is not None:
                body[name] = value
        return self.request("POST", "/mcp/forget", body=body)

    def recall(self, query: str, threshold: float = 0.5, top_k: int = 3, max_chars: int = 200,
               **params) -> list[dict]:
        """The plugin habit: the top ``top_k`` results scoring above ``threshold``, each cut to
        ``max_chars`` characters, ready to show or to prepend to a prompt."""
        results = self.search(query, top_k=top_k, **params)["results"]
        out = []
        for r in results:
            if r["score"] <= threshold:
                continue
            text = r["content"] if len(r["content"]) <= max_chars else r["content"][:max_chars] + "…"
            out.append({"cid": r["cid"], "type": r["type"], "source": r["source"], "score": r["score"],
                        "text": text})
        return out[:top_k]


def _filter_params(filters: dict) -> dict:
    """List/export filters as query parameters (``types`` comma-separated)."""
    params = {}
    for name, value in filters.items():
        if value is None:
            continue
        if name == "types" and not isinstance(value, str):
            value = ",".join(value)
        params[name] = value
    return params


def _retry_after(rv: requests.Response) -> Optional[float]:
    value = rv.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
