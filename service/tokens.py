"""Signed opaque tokens: list cursors and forget confirmations (issue 15).

The same scheme and key as MCP ``resources/list`` cursors (service/mcp/resources.py): a small
payload and an HMAC-SHA256 over (purpose, tenant, payload) under the deployment's cursor key
(``CONTEXT_MCP_CURSOR_SECRET``, else ``mcp-cursor.key`` in the data directory, shared by every
worker). A token minted for one tenant or purpose is refused for any other; clients treat it as
opaque text.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json

from flask import current_app

from .errors import BadRequest

MAX_CHARS = 512
MAC_BYTES = 16


def key() -> bytes:
    from .mcp.transport import _cursor_key
    return _cursor_key(current_app, current_app.config["CONTEXT"])


def _mac(secret: bytes, purpose: str, tenant: str, payload: bytes) -> bytes:
    msg = purpose.encode() + b"|" + tenant.encode() + b"|" + payload
    return hmac.new(secret, msg, hashlib.sha256).digest()[:MAC_BYTES]


def seal(purpose: str, tenant: str, payload: dict, secret: bytes | None = None) -> str:
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    raw += _mac(secret or key(), purpose, tenant, raw)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unseal(purpose: str, tenant: str, token, *, field: str, code: str, secret: bytes | None = None) -> dict:
    """The payload of a token this server sealed for ``purpose`` and ``tenant``; 400 ``code`` otherwise."""
    try:
        if not isinstance(token, str) or not token or len(token) > MAX_CHARS:
            raise ValueError
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if len(raw) <= MAC_BYTES or not hmac.compare_digest(mac, _mac(secret or key(), purpose, tenant, payload)):
            raise ValueError
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise ValueError
    except ValueError:
        raise BadRequest(f"Invalid {field}: pass back a value this server returned.", code=code, field=field) from None
    return data


def digest(value) -> str:
    """A short stable fingerprint of a JSON value (a request's filters), to bind a token to it."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
