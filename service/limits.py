"""Per-key rate limiting (docs/design.md §9) with flask-limiter: 429 + Retry-After.
(Slow clients are bounded by service/gunicorn_guard.py.)

The key is a hash of the presented credential (or the client address when there is none),
so limiting happens before authentication work and never logs a key. Counters live in each
worker's memory: with N gunicorn workers a key may get up to N times the configured rate.
"""
from __future__ import annotations

import hashlib

from flask import Flask, request
from flask_limiter import Limiter

from .auth import bearer_token

DEFAULT_LIMIT = "1200/minute"


def _key() -> str:
    # The parsed token, not the raw header: "Bearer k", "bearer  k" and "BEARER k" are one key.
    token, _ = bearer_token(request.headers.get("Authorization"))
    if token:
        return "key:" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return "addr:" + (request.remote_addr or "unknown")


def init_app(app: Flask) -> None:
    limit = (app.config["CONTEXT"].rate_limit or "off").strip()
    if limit.lower() == "auto":
        limit = "off" if app.extensions["context_keys"].open else DEFAULT_LIMIT
    if limit.lower() in ("off", "none", "0", ""):
        return
    # application_limits: one budget per key across all routes.
    limiter = Limiter(key_func=_key, app=app, application_limits=[limit], storage_uri="memory://",
                      headers_enabled=True, strategy="moving-window")
    # Probes and scrapes are never limited.
    for view in ("health.healthz", "health.readyz", "metrics"):
        if view in app.view_functions:
            limiter.exempt(app.view_functions[view])
    app.extensions["context_limiter"] = limiter
