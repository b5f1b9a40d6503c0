"""``subscriptions/listen`` (2026-07-28): the response to one POST /mcp stays open as an SSE stream.

Per the revision's subscriptions pattern: the first message is ``notifications/subscriptions/acknowledged``
holding only what this server honours (``resourcesListChanged``, and those ``resourceSubscriptions`` it can
serve: ``context://units/{cid}``, ``context://search/{query}``, ``context://tools/{name}``,
``context://stats``; the tool and prompt lists never change, so their flags are left out); every message
carries ``_meta["io.modelcontextprotocol/subscriptionId"]`` = the listen request's id;
``notifications/resources/updated`` only names the URI (the client reads it again); closing the stream
cancels; when the server ends it (shutdown, idle limit) the last message is the request's result,
``resultType: "complete"``.

When a URI counts as updated: a unit's, when the unit is stored, re-pushed (its fields may change),
deleted (or forgotten) or expires; a search's, when a newly indexed unit enters the top 10 that reading
the URI returns (service/hub.py runs that default search), or a unit of its last top 10 is re-pushed or
deleted; a tool's, when it is registered, updated or deleted. The list and ``context://stats`` change
when a unit is stored or deleted (expiry is not announced: resources/list results carry ``ttlMs``).
"""
from __future__ import annotations

import json
from collections import OrderedDict

import mcp_types as types
from flask import Response
from mcp_types.methods import serialize_server_result

from ..hub import LIST, LimitReached, Listener
from .. import uris
from .context import Call
from .protocol import SUBSCRIPTION_ID_META_KEY, TOO_MANY_LISTENERS, RpcError, invalid_params
from ..state import app_state

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
WRITE_TIMEOUT_S = 30.0     # a client that reads nothing this long while the server writes is dropped


def sse(message: dict) -> bytes:
    """One SSE ``message`` event; no ``id:`` (the 2026-07-28 transport has no resumable streams)."""
    data = json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return f"event: message\ndata: {data}\n\n".encode("utf-8")


def _dump(model) -> dict:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


class McpListener(Listener):
    kind = "listen"

    def __init__(self, hub, call: Call, key_id: str, sock, request_id, *, cids, queries, tool_uris, wants_list):
        super().__init__(hub, call.tenant, key_id, sock)
        self.request_id = request_id
        self.version = call.era.version
        self.cids, self.queries, self.uris = cids, queries, tool_uris
        # context://stats changes whenever the list does: both come from the same events
        self.list_keys = ([LIST] if wants_list else []) + ([uris.STATS_URI] if uris.STATS_URI in tool_uris else [])
        self.wants_list = bool(self.list_keys)
        self.pending: OrderedDict[str, None] = OrderedDict()

    @property
    def meta(self) -> dict:
        return {SUBSCRIPTION_ID_META_KEY: self.request_id}

    def notify(self, key: str) -> None:
        with self.cond:
            for k in (self.list_keys if key == LIST else [key]):
                self.pending[k] = None
            self.cond.notify_all()

    def ready(self) -> bool:
        return bool(self.pending)

    def take(self) -> list[bytes]:
        with self.cond:
            keys = list(self.pending)
            self.pending.clear()
        out = []
        for key in keys:
            if key == LIST:
                note = types.ResourceListChangedNotification(params={"_meta": self.meta})
            else:
                note = types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=key, meta=self.meta))
            out.append(sse(_dump(note)))
        return out

    def final(self, reason: str) -> bytes:
        result = serialize_server_result("subscriptions/listen", self.version,
                                         {"_meta": self.meta, "resultType": "complete"})
        return sse({"id": self.request_id, "result": result})


def _accept(call: Call, requested: list[str], tokenizer) -> tuple[list[str], set, dict, set]:
    """The subscriptions this server can serve, in the client's order; the others are left out of the ack."""
    accepted, cids, queries, tools = [], set(), {}, set()
    for uri in dict.fromkeys(requested):
        if uri == uris.STATS_URI:
            tools.add(uri)                   # changes with the list (McpListener.notify)
            accepted.append(uri)
            continue
        try:
            target = uris.parse(uri)
        except uris.BadUri:
            continue
        if isinstance(target, uris.UnitUri):
            cids.add(target.cid)
        elif isinstance(target, uris.SearchUri):
            queries[target.query] = frozenset(tokenizer.query_terms(target.query))
        else:
            tools.add(uri)
        accepted.append(uri)
    return accepted, cids, queries, tools


def open_stream(call: Call, req: types.SubscriptionsListenRequest, *, request_id, key_id: str, sock=None) -> Response:
    """Acknowledge what is accepted, then stream the changes until the client closes or the server ends it."""
    hub = app_state().hub
    wanted = req.params.notifications
    requested = list(wanted.resource_subscriptions or [])
    limit = call.config.max_subscriptions
    if len(set(requested)) > limit:
        raise invalid_params(f"Too many resourceSubscriptions: at most {limit} URIs per subscriptions/listen; "
                             "open another stream for more.", {"max_subscriptions": limit})
    accepted, cids, queries, tools = _accept(call, requested, call.store.tokenizer)
    wants_list = bool(wanted.resources_list_changed)
    lst = McpListener(hub, call, key_id, sock, request_id, cids=frozenset(cids), queries=queries,
                      tool_uris=frozenset(tools), wants_list=wants_list)
    try:
        w = hub.open(lst)
    except LimitReached as e:
        # answered here rather than raised: the refusal carries Retry-After (a slot frees when a stream closes)
        err = RpcError(TOO_MANY_LISTENERS, str(e), {"scope": e.scope, "limit": e.limit})
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": err.error()}, ensure_ascii=False,
                          separators=(",", ":"), allow_nan=False)
        return Response(body, status=e.status, mimetype="application/json", headers={"Retry-After": "1"})
    try:
        for cid in cids:
            expiry = hub.sources.expiry(call.tenant, cid)
            with hub.lock:
                w.expire_at(cid, expiry)
        for q in queries:
            # The top k a deletion or a re-push may change (a newly indexed unit is checked as it comes).
            if q not in w.top:
                top = hub.top_cids(call.tenant, q)
                with hub.lock:
                    w.top.setdefault(q, top or set())
        honored = types.SubscriptionFilter(resources_list_changed=True if wants_list else None,
                                           resource_subscriptions=accepted or None)
        ack = types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, meta=lst.meta))
        body = lst.body([sse(_dump(ack))], WRITE_TIMEOUT_S)
    except BaseException:
        hub.close(lst)
        raise
    return Response(body, mimetype="text/event-stream", headers=SSE_HEADERS)
