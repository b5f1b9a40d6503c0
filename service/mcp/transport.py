"""Streamable HTTP at ``POST /mcp``: one JSON-RPC message per request, JSON responses (docs/design.md §7).

Order of checks: Host/Origin (DNS rebinding, 403), JSON content type (415) and body size (413),
all in service/doors.py → method (405) → API key (401) → body
(-32700/-32600) → revision (header and ``_meta``) → dispatch. Every malformed input ends as a
4xx or a JSON-RPC error; a 5xx only ever means storage or the server itself is broken.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging

from flask import Blueprint, Response, current_app, request

from ..api import parse_json
from ..auth import current_principal
from ..errors import ApiError, Unauthorized, error_body, invalid_json, storage_error
from ..tokens import cursor_key
from . import protocol as p
from .context import Call
from .dispatch import METHODS, dispatch, prepare
from ..state import app_state

log = logging.getLogger(__name__)
bp = Blueprint("mcp", __name__)

# JSON-RPC error code -> HTTP status on the 2026-07-28 wire (its transport spec assigns these).
MODERN_STATUS = {p.PARSE_ERROR: 400, p.INVALID_REQUEST: 400, p.INVALID_PARAMS: 400, p.HEADER_MISMATCH: 400,
                 p.UNSUPPORTED_PROTOCOL_VERSION: 400, -32021: 400, p.METHOD_NOT_FOUND: 404}


def _rpc_response(id_, status: int, *, result=None, error: p.RpcError | None = None, headers=None) -> Response:
    body = {"jsonrpc": "2.0", "id": id_}
    if error is not None:
        body["error"] = error.error()
    else:
        body["result"] = result
    rv = Response(json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False), status=status,
                  mimetype="application/json")
    rv.headers.update(headers or {})
    return rv


def _accepted() -> Response:
    return Response(status=202)


# --- revisions ----------------------------------------------------------------------------------
def _single_header(name: str) -> str | None:
    values = request.headers.getlist(name)
    if len(values) > 1:
        raise p.RpcError(p.HEADER_MISMATCH, f"The {name} header appears more than once.")
    return values[0].strip() if values else None


def _decode_header_value(value: str | None) -> str | None:
    """Undo the ``=?base64?...?=`` wrapping clients use for names that are not plain ASCII."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    payload = value[len("=?base64?"):-2]
    try:
        return base64.b64decode(payload, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def resolve_era(msg: p.Message) -> p.Era:
    """The revision this message is served under; RpcError when header and body disagree or it is unknown."""
    header = _single_header(p.VERSION_HEADER)
    meta = p.meta_of(msg.params)
    modern_shaped = meta is not None and p.PROTOCOL_VERSION_META_KEY in meta
    if header in p.HANDSHAKE_VERSIONS:
        return p.Era(header, False)
    if header is None and not modern_shaped:
        return p.Era(p.DEFAULT_HEADER_VERSION, False)
    if header is not None and header not in p.MODERN_VERSIONS and not modern_shaped:
        raise p.RpcError(p.INVALID_REQUEST, f"Unsupported {p.VERSION_HEADER} header.",
                         {"supported": list(p.SUPPORTED_VERSIONS), "requested": header[:100]}, status=400)
    if msg.kind != "request":
        if header not in p.MODERN_VERSIONS:
            raise p.unsupported_version(header)
        return p.Era(header, True)
    # 2026-07-28: the per-request envelope, mirrored in headers (the SDK's validation ladder order).
    if meta is None or p.PROTOCOL_VERSION_META_KEY not in meta or p.CLIENT_CAPABILITIES_META_KEY not in meta:
        raise p.invalid_params(f"params._meta must carry {p.PROTOCOL_VERSION_META_KEY!r} and "
                               f"{p.CLIENT_CAPABILITIES_META_KEY!r}.")
    version = meta[p.PROTOCOL_VERSION_META_KEY]
    if header is None or header != version:
        raise p.RpcError(p.HEADER_MISMATCH, f"The {p.VERSION_HEADER} header must equal params._meta's protocol version.")
    if _single_header(p.METHOD_HEADER) != msg.method:
        raise p.RpcError(p.HEADER_MISMATCH, f"The {p.METHOD_HEADER} header must equal the request's method.")
    name_key = p.NAME_BEARING.get(msg.method)
    if name_key is not None and isinstance(msg.params.get(name_key), str):
        if _decode_header_value(_single_header(p.NAME_HEADER)) != msg.params[name_key]:
            raise p.RpcError(p.HEADER_MISMATCH, f"The {p.NAME_HEADER} header must equal params.{name_key}.")
    if version not in p.MODERN_VERSIONS:
        raise p.unsupported_version(version)
    return p.Era(version, True)


# --- the endpoint -------------------------------------------------------------------------------
def _error_status(e: p.RpcError, era: p.Era | None, dispatched: bool) -> int:
    if e.status:
        return e.status
    if era is not None and era.modern:
        return MODERN_STATUS.get(e.code, 200)
    # Handshake era: protocol errors from a handler travel in a 200 JSON body, as SDK clients expect.
    return 200 if dispatched else 400


@bp.route("/mcp", methods=["GET", "POST", "DELETE"])
def endpoint():
    """MCP Streamable HTTP (2025-11-25 and 2026-07-28)."""
    config = current_app.config["CONTEXT"]
    # Host and Origin (DNS rebinding), content type and body size: service/doors.py, before this view.
    if request.method != "POST":
        # No GET stream and no sessions: only POST exists (spec: 405 for GET/DELETE). Change notifications
        # come on the response of a POSTed subscriptions/listen (2026-07-28).
        rv = Response(json.dumps(error_body("Use POST: this MCP endpoint has no GET stream and no sessions.",
                                            "method_not_allowed")), status=405, mimetype="application/json")
        rv.headers["Allow"] = "POST"
        return rv
    try:
        principal = current_principal()
    except Unauthorized as e:
        return _rpc_response(None, 401, error=p.RpcError(p.UNAUTHORIZED, e.message, {"code": e.code}),
                             headers={"WWW-Authenticate": 'Bearer realm="context-mode"'})

    raw = request.get_data(cache=False)
    try:
        doc = parse_json(raw)
        # Lone surrogates parse but can never be stored or echoed as UTF-8.
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (UnicodeError, ValueError, RecursionError) as e:
        # (what the REST doors say of it: a syntax error's position, an over-long integer as such)
        return _rpc_response(None, 400, error=p.RpcError(p.PARSE_ERROR, f"Parse error: {invalid_json(e).message}"))

    era = None
    msg = None
    try:
        msg = p.decode_message(doc)
        if msg.kind == "response":
            return _accepted()
        era = resolve_era(msg)
        if msg.kind == "notification":
            return _accepted()
        call = Call(tenant=principal.tenant, scopes=principal.scopes, era=era,
                    store=app_state().store, config=config,
                    cursor_key=cursor_key(current_app, config),
                    registry=app_state().registry)
    except p.RpcError as e:
        rid = e.id if msg is None else msg.id
        return _rpc_response(rid, _error_status(e, era, False), error=e)
    try:
        entry = METHODS.get(msg.method)
        if entry is not None and entry.stream and era.modern:
            # subscriptions/listen: the response is the stream (service/mcp/listen.py)
            entry, req = prepare(call, msg.method, msg.params)
            return entry.handler(call, req, request_id=msg.id, key_id=principal.key_id,
                                 sock=request.environ.get("gunicorn.socket"))
        result = dispatch(call, msg.method, msg.params)
    except p.RpcError as e:
        return _rpc_response(msg.id, _error_status(e, era, True), error=e)
    except Exception as e:  # noqa: BLE001 - the JSON-RPC boundary: never a stack trace on the wire
        return _internal(msg.id, e)
    return _rpc_response(msg.id, 200, result=result)


def _internal(id_, exc: Exception) -> Response:
    mapped = storage_error(exc)
    if isinstance(mapped, ApiError) and mapped.status >= 500:
        return _rpc_response(id_, mapped.status, error=p.RpcError(p.INTERNAL_ERROR, mapped.message),
                             headers=mapped.headers)
    log.exception("MCP handler failed")
    return _rpc_response(id_, 500, error=p.RpcError(p.INTERNAL_ERROR, "Internal server error."))

