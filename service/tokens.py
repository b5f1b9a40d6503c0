"""Signed opaque tokens: list cursors and forget confirmations.

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
import os
import secrets
import time

from flask import current_app

from .errors import BadRequest

MAX_CHARS = 512
MAC_BYTES = 16


def key() -> bytes:
    return cursor_key(current_app, current_app.config["CONTEXT"])


def cursor_key(app, config) -> bytes:
    """The deployment's cursor key: CONTEXT_MCP_CURSOR_SECRET, else ``mcp-cursor.key`` in the data
    directory (moved here from service/mcp/transport.py: REST tokens and MCP cursors share it)."""
    key = app.extensions.get("mcp_cursor_key")
    if key is None:
        key = config.mcp_cursor_secret.encode() if config.mcp_cursor_secret else _key_file(config)
        app.extensions["mcp_cursor_key"] = key
    return key


def _key_file(config) -> bytes:
    """A per-deployment random key shared by every gunicorn worker through the data directory."""
    path = config.data_path / "mcp-cursor.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    for _ in range(50):                  # another worker may be between create and write
        text = path.read_text().strip()
        if len(text) == 64:
            return bytes.fromhex(text)
        time.sleep(0.01)
    raise RuntimeError(f"unreadable MCP cursor key file {path}")


def encode(raw: bytes) -> str:
    """Unpadded base64url: how every token and cursor is written."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(text: str) -> bytes:
    """The bytes of ``encode``'s output, and only of it (ValueError otherwise): Python's decoder also takes
    other spellings of the same bytes (other values of the last character's unused bits, characters
    outside the alphabet), so a token changed there would still pass as the one the server returned."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if encode(raw) != text:
        raise ValueError("not a token this server wrote")
    return raw


def _mac(secret: bytes, purpose: str, tenant: str, payload: bytes) -> bytes:
    msg = purpose.encode() + b"|" + tenant.encode() + b"|" + payload
    return hmac.new(secret, msg, hashlib.sha256).digest()[:MAC_BYTES]


def seal(purpose: str, tenant: str, payload: dict, secret: bytes | None = None) -> str:
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    raw += _mac(secret or key(), purpose, tenant, raw)
    return encode(raw)


def unseal(purpose: str, tenant: str, token, *, field: str, code: str, secret: bytes | None = None) -> dict:
    """The payload of a token this server sealed for ``purpose`` and ``tenant``; 400 ``code`` otherwise."""
    try:
        if not isinstance(token, str) or not token or len(token) > MAX_CHARS:
            raise ValueError
        raw = decode(token)
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
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]   # (a lone surrogate too)
