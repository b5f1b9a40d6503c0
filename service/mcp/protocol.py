"""MCP protocol facts the adapter relies on: revisions, error codes, the JSON-RPC envelope (docs/design.md §7).

Two revisions share one endpoint. 2025-11-25 (and the older 2025-06-18 / 2025-03-26 that
Dify sends) negotiates once with ``initialize`` and then names its revision in the
``MCP-Protocol-Version`` header; the stateless 2026-07-28 repeats the revision, client
capabilities and client info in every request's ``params._meta`` and mirrors it in headers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp_types import (CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY,
                       UnsupportedProtocolVersionErrorData)
from mcp_types.jsonrpc import (HEADER_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST,
                               METHOD_NOT_FOUND, PARSE_ERROR, UNSUPPORTED_PROTOCOL_VERSION)
from pydantic import ValidationError

# Handshake revisions we negotiate with `initialize`, newest last.
HANDSHAKE_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]
# Stateless per-request revisions.
MODERN_VERSIONS = ("2026-07-28",)
SUPPORTED_VERSIONS = HANDSHAKE_VERSIONS + MODERN_VERSIONS
# Spec: a server that receives no MCP-Protocol-Version header SHOULD assume 2025-03-26.
DEFAULT_HEADER_VERSION = "2025-03-26"

# 2025-11-25 names "resource not found" -32002; 2026-07-28 retired that code in favour of -32602.
RESOURCE_NOT_FOUND_LEGACY = -32002
# Auth failures ride on HTTP 401/403; their JSON-RPC bodies use the implementation-defined band.
UNAUTHORIZED = -32010
FORBIDDEN = -32011
# subscriptions/listen refused: too many open streams for the key, the tenant or this server.
TOO_MANY_LISTENERS = -32012
SUBSCRIPTION_ID_META_KEY = "io.modelcontextprotocol/subscriptionId"

VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
# Methods whose target name is mirrored in the Mcp-Name header (2026-07-28 transports).
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

# JSON-RPC ids: a string or a JSON integer. Bounds keep a hostile id from being echoed at any size.
MAX_ID_CHARS = 1024
MAX_ID_INT = 2**63

__all__ = [
    "CLIENT_CAPABILITIES_META_KEY", "CLIENT_INFO_META_KEY", "PROTOCOL_VERSION_META_KEY",
    "HEADER_MISMATCH", "INTERNAL_ERROR", "INVALID_PARAMS", "INVALID_REQUEST", "METHOD_NOT_FOUND",
    "PARSE_ERROR", "UNSUPPORTED_PROTOCOL_VERSION", "RpcError", "Era", "Message",
]


class RpcError(Exception):
    """A JSON-RPC error response: protocol misuse, never a tool's business failure."""

    def __init__(self, code: int, message: str, data: Any = None, *, status: int | None = None, id: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.status = status     # HTTP status override (else chosen by era, see transport)
        self.id = id             # the request id, when known before the message was fully decoded

    def error(self) -> dict:
        err = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


def invalid_params(message: str, data: Any = None) -> RpcError:
    return RpcError(INVALID_PARAMS, message, data)


def validation_message(e: ValidationError) -> str:
    """The first pydantic error as one short sentence, without echoing the input."""
    errors = e.errors(include_input=False, include_url=False)
    if not errors:
        return "Invalid params."
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())]
    if loc and loc[0] == "params":
        loc = loc[1:]
    where = ".".join(loc)[:120]
    return f"Invalid params: {where + ': ' if where else ''}{first.get('msg', 'invalid')}"[:300]


def unsupported_version(requested: Any, supported: tuple[str, ...] = MODERN_VERSIONS) -> RpcError:
    data = UnsupportedProtocolVersionErrorData(supported=list(supported),
                                               requested=str(requested)[:100]).model_dump(mode="json")
    return RpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data)


@dataclass(frozen=True)
class Era:
    """The revision one request is served under, and how it was established."""
    version: str
    modern: bool


@dataclass
class Message:
    """One decoded JSON-RPC message (request, notification or a client's response)."""
    kind: str                     # "request" | "notification" | "response"
    id: Any = None
    method: str | None = None
    params: dict | None = None
    raw: dict = field(default_factory=dict)


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_ID_INT < value < MAX_ID_INT
    return isinstance(value, str) and len(value) <= MAX_ID_CHARS


def decode_message(doc: Any) -> Message:
    """Classify one decoded JSON document; raise RpcError(-32600/-32602) when it is no single message."""
    if isinstance(doc, list):
        raise RpcError(INVALID_REQUEST, "JSON-RPC batches are not supported: send one message per POST.")
    if not isinstance(doc, dict):
        raise RpcError(INVALID_REQUEST, "The body must be one JSON-RPC request or notification object.")
    if doc.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Field 'jsonrpc' must be \"2.0\".")
    has_id = "id" in doc
    if "method" not in doc:
        # A client's response to a server request: we never send any, but accepting it is harmless.
        if has_id and _valid_id(doc["id"]) and (("result" in doc) != ("error" in doc)):
            return Message("response", id=doc["id"], raw=doc)
        raise RpcError(INVALID_REQUEST, "A JSON-RPC request needs a string 'method'.")
    method = doc["method"]
    if not isinstance(method, str) or not method or len(method) > 200:
        raise RpcError(INVALID_REQUEST, "Field 'method' must be a non-empty string.")
    if has_id and not _valid_id(doc["id"]):
        raise RpcError(INVALID_REQUEST, "Field 'id' must be a string or an integer (not null, a float or a boolean).")
    params = doc.get("params")
    if params is not None and not isinstance(params, dict):
        # MCP params are always objects; positional (array) params do not exist in it.
        raise RpcError(INVALID_PARAMS, "Field 'params' must be a JSON object.", id=doc["id"] if has_id else None)
    return Message("request" if has_id else "notification", id=doc.get("id"), method=method,
                   params=params, raw=doc)


def meta_of(params: dict | None) -> dict | None:
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else None
