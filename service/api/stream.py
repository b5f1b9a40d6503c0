"""GET /mcp/stream: new units matching a query, as Server-Sent Events, for non-MCP clients.

``?query=…&types=a,b&source=…&operator=or|and`` (all optional; no query: every new unit of those types
and source). Each event is ``id: <seq>``, ``event: unit``, ``data: <the unit as GET /mcp/units returns it,
with "uri">``, in seq order. Reconnecting with ``Last-Event-ID: <seq>`` (or ``?last_event_id=``) resumes
after that unit with nothing lost: the feed is the durable catalog, not a buffer. Without it the stream
starts with units acknowledged after it opened. When the server ends the stream (shutdown, idle limit)
the last event is ``event: end`` with ``{"reason"}``; reconnect with the last id.
"""
from __future__ import annotations

import json
from collections import deque

from flask import Blueprint, Response, request

from ..auth import current_principal, require
from ..errors import ApiError, BadRequest
from ..hub import LimitReached, Listener
from ..live import Match
from ..params import parse_search, query_list, query_value
from ..uris import unit_uri
from . import config, store
from ..state import app_state

bp = Blueprint("stream", __name__)

STREAM_ARGS = ("query", "q", "types", "source", "operator", "last_event_id")
QUEUE_CAP = 10_000         # units waiting for a slow client; past it the stream reads from the store itself
PAGE = 100                 # units read per catch-up page
SEND_BATCH = 20
WRITE_TIMEOUT_S = 30.0
RETRY_MS = 2000            # the EventSource reconnection delay


class StreamListener(Listener):
    kind = "stream"
    wants_units = True

    def __init__(self, hub, tenant: str, key_id: str, sock, match: Match, after: int):
        super().__init__(hub, tenant, key_id, sock)
        self.match = match
        self.position = after       # every unit up to here was sent or did not match
        self.queue: deque = deque()
        self.behind = True          # reading from the store itself until it reaches the hub's feed
        self.stuck = False          # the last catch-up read made no progress (a push in flight)

    # hub thread, hub lock held
    def offer(self, units, resolved: int) -> None:
        with self.cond:
            if self.behind:
                self.stuck = False
            else:
                self.queue.extend(u for u in units if u.seq > self.position and self.match(u))
                if len(self.queue) > QUEUE_CAP:
                    self.queue.clear()
                    self.behind = True      # too slow a reader: catch up from the store, nothing is lost
                self.queued_to = resolved
            self.cond.notify_all()

    def ready(self) -> bool:
        return bool(self.queue) or (self.behind and not self.stuck)

    def take(self) -> list[bytes]:
        if self.behind:
            return self._catch_up()
        with self.cond:
            items = [self.queue.popleft() for _ in range(min(SEND_BATCH, len(self.queue)))]
            if not self.queue:
                self.position = max(self.position, getattr(self, "queued_to", self.position))
        out = []
        for u in items:
            frame = self._frame(u)
            self.position = max(self.position, u.seq)
            if frame:
                out.append(frame)
        return out

    def _catch_up(self) -> list[bytes]:
        units, resolved = self.hub.sources.feed(self.tenant, self.position, PAGE)
        out = [f for f in (self._frame(u) for u in units if self.match(u)) if f]
        progressed = resolved > self.position
        self.position = resolved
        with self.hub.lock:                  # rejoin the hub's feed once level with it
            feed = self.hub.cursor(self.tenant)
            with self.cond:
                if feed is not None and self.position >= feed:
                    self.behind = False
                    self.queued_to = self.position
                else:
                    self.stuck = not progressed
        return out

    def _frame(self, u) -> bytes | None:
        unit = self.hub.store.get(self.tenant, u.cid)
        if unit is None:
            return None                      # deleted or expired since: nothing to send
        data = json.dumps(dict(unit, uri=unit_uri(u.cid)), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
        return f"id: {u.seq}\nevent: unit\ndata: {data}\n\n".encode("utf-8")

    def final(self, reason: str) -> bytes:
        return f"event: end\ndata: {json.dumps({'reason': reason})}\n\n".encode()


def _match(args) -> Match:
    unknown = sorted(set(args) - set(STREAM_ARGS))
    if unknown:
        raise BadRequest(f"Unknown parameter {unknown[0]!r}.", code="unknown_field", field=unknown[0])
    if "q" in args and "query" in args:
        raise BadRequest("Give the search text once, as 'q' or as 'query'.", code="duplicate_parameter",
                         field="query")
    query = query_value(args, "query") or query_value(args, "q") or ""
    body: dict = {"query": query}
    if query_list(args, "types"):
        body["types"] = query_list(args, "types")
    for name in ("source", "operator"):
        if query_value(args, name):
            body[name] = args[name]
    p = parse_search(body, config())      # the same rules (and messages) as search's filters
    terms = tuple(store().tokenizer.query_terms(p.query)) if p.query.strip() else ()
    return Match(terms=terms, operator=p.operator, types=p.types, source=p.source)


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:       # isdigit alone takes '²'
        raise BadRequest("Last-Event-ID must be the seq (a non-negative integer) of the last event received.",
                         field="last_event_id")
    return int(raw)


@bp.get("/mcp/stream")
@require("search")
def stream(tenant):
    """New units matching the filters as SSE events, resumable with Last-Event-ID (their seq)."""
    match = _match(request.args)
    after = _last_event_id()
    if after is None:
        after = store().max_seq(tenant)
    hub = app_state().hub
    lst = StreamListener(hub, tenant, current_principal().key_id, request.environ.get("gunicorn.socket"), match,
                         after)
    try:
        hub.open(lst)
    except LimitReached as e:
        # a refused stream may retry: a slot frees when another stream closes (or on another worker)
        raise ApiError(str(e), code="too_many_streams", status=e.status, headers={"Retry-After": "1"}) from None
    opening = f": after seq {after}\nretry: {RETRY_MS}\n\n".encode()
    return Response(lst.body([opening], WRITE_TIMEOUT_S), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
