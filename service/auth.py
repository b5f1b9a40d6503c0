"""API keys (docs/design.md §9): key -> tenant + scopes, stored hashed, looked up by the presented key's hash."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from dataclasses import dataclass
from functools import wraps

from flask import g, request

from .errors import Forbidden, Unauthorized
from .formats import TENANT_RE
from .state import app_state

log = logging.getLogger(__name__)

SCOPES = ("push", "search", "admin")
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Principal:
    tenant: str
    scopes: frozenset[str]
    key_id: str          # first hex digits of the key hash: safe to log and to rate-limit on


OPEN = Principal(DEFAULT_TENANT, frozenset(SCOPES), "open")     # every caller when no keys are configured


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """The configured keys, hashed. Empty ring = single ``default`` tenant, no auth."""

    def __init__(self, entries: list[tuple[str, str, frozenset[str]]]):
        self.entries = entries   # (sha256 hex, tenant, scopes)
        # Who each hash is, made once (a later entry of the same hash wins, as the file is read). A look-up
        # by the presented key's hash reveals nothing a comparison with every entry hid: to steer where it
        # looks, a caller would need keys whose SHA-256 it chose, which it cannot make.
        self.principals = {key_hash: Principal(tenant, scopes, key_hash[:12]) for key_hash, tenant, scopes in entries}

    @property
    def open(self) -> bool:
        return not self.entries

    @classmethod
    def from_config(cls, config) -> "KeyRing":
        entries = []
        for name, value in (("CONTEXT_API_KEYS_FILE", config.api_keys_file), ("CONTEXT_API_KEYS", config.api_keys)):
            if value is not None and not str(value).strip():
                # Set but empty is a mistake (a typo, a missing compose variable), never "no keys".
                raise ValueError(f"{name} is set but empty: name the keys, or unset {name} to run without keys "
                                 "(loopback only).")
        if config.api_keys_file:
            entries += _read_keys_file(config.api_keys_file)
        if config.api_keys:
            # Development form: "key:tenant:push+search;key2:tenant2:search"
            for part in config.api_keys.split(";"):
                if not part.strip():
                    continue
                key, tenant, scopes = (part.strip().split(":") + ["", ""])[:3]
                scope_list = [s for s in scopes.replace(",", "+").split("+") if s] or list(SCOPES[:2])
                try:
                    entries.append(_entry({"key": key, "tenant": tenant, "scopes": scope_list}))
                except ValueError as e:    # docker-compose.yml builds it from .env's CONTEXT_API_KEY
                    raise ValueError(f"CONTEXT_API_KEYS (under docker compose: CONTEXT_API_KEY in .env): {e}") from None
            if not entries:
                raise ValueError("CONTEXT_API_KEYS is set but names no key; unset it to run without keys.")
        return cls(entries)

    def authenticate(self, presented: str | None) -> Principal | None:
        """Who a presented key is (one hash and one look-up, however many keys: issue 42), or None."""
        if presented is None:
            return None
        return self.principals.get(hash_key(presented))

    def accepts(self, header: str | None) -> bool:
        """Whether an Authorization header names one of these keys (always, without keys): the slow-client
        guard asks it before a body is read, outside any request (current_principal says why not)."""
        if self.open:
            return True
        token, problem = bearer_token(header)
        return problem is None and self.authenticate(token) is not None


ENTRY_FIELDS = {"key", "key_sha256", "tenant", "scopes", "label", "created_at"}
MIN_KEY_CHARS = 16
# Words that mark a key copied from an example rather than generated (.env.example's "change-me").
PLACEHOLDERS = ("change-me", "changeme", "change_me", "replace-me", "replaceme", "your-key", "your_key",
                "your-api-key", "placeholder", "example", "secret", "password", "xxxx")


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words (a message must not echo a key that may be in it)."""
    return {dict: "an object", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _read_keys_file(path: str) -> list[tuple[str, str, frozenset[str]]]:
    """Every entry of a keys file; ValueError (the start stops) when it yields no key or has
    unknown fields: a typo must never turn authentication off."""
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except ValueError as e:
            raise ValueError(f"keys file {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or set(data) != {"keys"}:
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f'keys file {path}: expected {{"keys": [...]}} and nothing else, found {found}')
    if not isinstance(data["keys"], list):
        # {"keys": "nope"} has the right key: say what is wrong with its value
        raise ValueError(f'keys file {path}: "keys" must be a list of key entries '
                         f'([{{"key_sha256": ..., "tenant": ..., "scopes": [...]}}]), found {_json_kind(data["keys"])}')
    if not data["keys"]:
        raise ValueError(f"keys file {path} holds no keys; add one with `context-mode keys add`, "
                         "or unset CONTEXT_API_KEYS_FILE to run without keys (loopback only)")
    entries = []
    for i, item in enumerate(data["keys"]):
        if not isinstance(item, dict):
            raise ValueError(f"keys file {path}: entry {i} is not an object")
        unknown = sorted(set(item) - ENTRY_FIELDS)
        if unknown:
            raise ValueError(f"keys file {path}: entry {i} has unknown field(s) {unknown}; "
                             f"known: {sorted(ENTRY_FIELDS)}")
        try:
            entries.append(_entry(item))
        except ValueError as e:
            raise ValueError(f"keys file {path}: entry {i}: {e}") from None
    return entries


def weak_key_problem(key: str) -> str | None:
    """Why a plain key must not be used, or None: too short, or a placeholder from an example."""
    lowered = key.lower()
    if any(word in lowered for word in PLACEHOLDERS):     # first: .env.example's change-me is short too
        return "this key is a placeholder from an example; generate a real one with `context-mode keys add`"
    if len(key) < MIN_KEY_CHARS:
        return f"a key must be at least {MIN_KEY_CHARS} characters (generate one with `context-mode keys add`)"
    return None


def _entry(item: dict) -> tuple[str, str, frozenset[str]]:
    tenant = item.get("tenant", "")
    if not TENANT_RE.match(tenant or ""):
        raise ValueError(f"invalid tenant name {tenant!r} (must match {TENANT_RE.pattern})")
    scopes = frozenset(item.get("scopes") or ())
    unknown = scopes - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s) {sorted(unknown)}; known: {SCOPES}")
    if "key_sha256" in item:
        key_hash = item["key_sha256"].lower() if isinstance(item["key_sha256"], str) else ""
        if len(key_hash) != 64 or not all(c in "0123456789abcdef" for c in key_hash):
            raise ValueError("key_sha256 must be 64 hex digits")
    elif item.get("key"):
        if not isinstance(item["key"], str):
            raise ValueError("'key' must be a string")
        problem = weak_key_problem(item["key"])
        if problem:
            raise ValueError(f"refused key for tenant {tenant!r}: {problem}")
        key_hash = hash_key(item["key"])
    else:
        raise ValueError("each key needs 'key_sha256' (or 'key' for development)")
    return key_hash, tenant, scopes


def new_key() -> str:
    return "cms_" + secrets.token_urlsafe(32)


def add_key(path: str, tenant: str, scopes: list[str]) -> str:
    """Append a new key's hash to the keys file; return the plain key (shown once)."""
    key = new_key()
    entry = {"key_sha256": hash_key(key), "tenant": tenant, "scopes": sorted(scopes)}
    _entry(entry)  # validate
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        data = {"keys": []}
    data.setdefault("keys", []).append(entry)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    return key


def _keys_document(path: str) -> dict:
    """The keys file as JSON, for listing and revoking (no checks: `keys list` must show a broken file's entries)."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def list_keys(path: str) -> list[dict]:
    """Each entry's id (the first 12 hex digits of its hash, as logged), tenant, scopes, and whether
    the file holds it in plain text (development form); never the key itself."""
    out = []
    for item in _keys_document(path).get("keys", []):
        key_hash, tenant, scopes = _entry(item)
        out.append({"id": key_hash[:12], "tenant": tenant, "scopes": sorted(scopes), "plain": "key" in item
                    and "key_sha256" not in item})
    return out


def revoke_key(path: str, key_id: str) -> dict:
    """Remove the one entry whose hash starts with ``key_id`` (at least 8 hex digits); return it as listed."""
    key_id = key_id.strip().lower()
    if len(key_id) < 8 or any(c not in "0123456789abcdef" for c in key_id):
        raise ValueError("a key id is at least 8 hex digits, as `keys list` prints it")
    data = _keys_document(path)
    items = data.get("keys", [])
    matches = [i for i, item in enumerate(items) if _entry(item)[0].startswith(key_id)]
    if not matches:
        raise ValueError(f"no key with id {key_id} in {path}")
    if len(matches) > 1:
        raise ValueError(f"{len(matches)} keys start with {key_id}; give more digits")
    item = items.pop(matches[0])
    key_hash, tenant, scopes = _entry(item)
    tmp = f"{path}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)                  # atomic: a server starting meanwhile reads the old or new file
    return {"id": key_hash[:12], "tenant": tenant, "scopes": sorted(scopes)}


def bearer_token(header: str | None) -> tuple[str | None, str | None]:
    """(token, problem): problem is 'missing' or 'malformed' when there is no usable token."""
    if not header:
        return None, "missing"
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None, "malformed"
    return token, None


def presents_a_key() -> bool:
    """Whether the request's Authorization header names a configured key (always true without keys): a
    body is read only then, so a caller without a key gets its 401 before sending it (docs/design.md §9).
    The request is authenticated here once (``current_principal``): the view reuses the answer."""
    try:
        current_principal()
    except Unauthorized:
        return False
    return True


def current_principal() -> Principal:
    """Authenticate the request (once) and return who is calling; 401 when that fails."""
    if "principal" in g:
        return g.principal
    ring = app_state().keys
    if ring.open:
        g.principal = OPEN
        return OPEN
    token, problem = bearer_token(request.headers.get("Authorization"))
    if problem == "missing":
        raise Unauthorized("Missing 'Authorization: Bearer <key>' header.", code="missing_api_key")
    if problem == "malformed":
        raise Unauthorized("Malformed Authorization header; expected 'Bearer <key>'.", code="malformed_api_key")
    principal = ring.authenticate(token)
    if principal is None:
        raise Unauthorized("Invalid API key.", code="invalid_api_key")
    g.principal = principal
    return principal


def require(scope: str):
    """View decorator: authenticate, check ``scope``, pass ``tenant`` to the view."""
    def deco(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            p = current_principal()
            if scope not in p.scopes:
                raise Forbidden(f"This API key lacks the {scope!r} scope.", code="missing_scope")
            return view(p.tenant, *args, **kwargs)
        return wrapper
    return deco
