"""Credentials masked before a hook stores anything (secrets never leave the machine).

The rules are ``secretscan``'s, the one detector the service's tool registry refuses credentials with too:
what a rule finds becomes ``[REDACTED:<rule>]``, and a key name, URL user or auth scheme before the secret is
kept, so the stored text still says *what* was there. It reads its input in linear time, so tool output an
attacker controls (a fetched page) cannot keep a hook busy. Over-masking a harmless value costs little;
storing a live key in a shared memory costs a rotation.
"""
from __future__ import annotations

from typing import Any, Iterable

from . import secretscan
from .cid import compute_cid
from .secretscan import RULES, find, secret_name  # noqa: F401  (the names this module has always offered)


def mask(text: str, literals: Iterable[str] = ()) -> str:
    """``text`` with every credential-looking value replaced; ``literals`` (e.g. the hook's own API key)
    are masked wherever they appear, whatever their shape."""
    return secretscan.mask(text, literals)


def mask_value(value: Any, literals: Iterable[str] = ()) -> Any:
    """Every string of a JSON value masked, keys included (a unit's metadata: ``cwd``, ``session_id``, a tool's
    input); the value of a key named like a secret (``PRIVATE-TOKEN``, ``passphrase``, ``auth``) goes whole."""
    return secretscan.mask_value(value, literals)


def mask_unit(unit: dict, literals: Iterable[str] = ()) -> dict:
    """A unit about to be pushed with every stored string masked: content, source and metadata. Its CID is
    computed again when masking changed what it covers (content and source)."""
    out = dict(unit)
    for field in ("content", "source"):
        if isinstance(out.get(field), str):
            out[field] = mask(out[field], literals)
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = mask_value(out["metadata"], literals)
    if "cid" in out and (out.get("content"), out.get("source")) != (unit.get("content"), unit.get("source")):
        out["cid"] = compute_cid(out["content"], out["timestamp"], out["source"])
    return out
