"""Per-key rate limiting (docs/design.md §9): 429 + Retry-After, and the X-RateLimit headers.

The key is a hash of the presented credential (or the client address when there is none),
so limiting happens before authentication work and never logs a key. Counters live in each
worker's memory: with N gunicorn workers a key may get up to N times the configured rate.
(The fair shares of a worker's threads and slots: service/shares/; slow clients: service/guard/.)
"""
from __future__ import annotations

import collections
import hashlib
import threading
import time

from flask import Flask, g, request
from limits import parse_many
from werkzeug.exceptions import TooManyRequests
from werkzeug.http import parse_date

from .auth import bearer_token

DEFAULT_LIMIT = "1200/minute"
# Probes and scrapes are never limited (nor a request no route matched, nor a static file).
EXEMPT = frozenset({"health.healthz", "health.readyz", "metrics"})


def _key() -> str:
    # The parsed token, not the raw header: "Bearer k", "bearer  k" and "BEARER k" are one key.
    token, _ = bearer_token(request.headers.get("Authorization"))
    if token:
        return "key:" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return "addr:" + (request.remote_addr or "unknown")


def rate_limits(config, keys) -> list:
    """The configured rate limits, parsed once (smallest window first), or [] when limiting is off:
    CONTEXT_RATE_LIMIT ``auto`` (the default) is 1,200/minute per key with keys and off without;
    ``off``, ``none``, ``0`` turn it off; e.g. ``10/second;1000/hour`` sets two. ValueError names a bad one."""
    limit = (config.rate_limit or "off").strip()
    if limit.lower() == "auto":
        limit = "off" if keys.open else DEFAULT_LIMIT
    if limit.lower() in ("off", "none", "0", ""):
        return []
    try:
        return sorted(parse_many(limit))
    except ValueError:
        raise ValueError(f"CONTEXT_RATE_LIMIT={limit!r} is not a rate limit: write e.g. 1200/minute, "
                         "10/second;1000/hour, or off") from None


class MovingWindow:
    """At most ``amount`` hits per key in any window of ``seconds`` (the ``limits`` library's moving window,
    same rule), counted in this worker's memory: each key's hit times in a deque, so a hit costs the same
    however full its window is, and keys idle for a whole window are dropped once a window.

    (limits' own memory storage prepends to a list on every hit, and under load starts a timer thread again
    every 10 ms to expire them, each start holding the request that made it until the new thread ran.)"""

    def __init__(self, amount: int, seconds: float):
        self.amount, self.seconds = amount, seconds
        self.hits: dict[str, collections.deque] = {}
        self.lock = threading.Lock()
        self.swept = 0.0

    def _window(self, key: str, now: float) -> collections.deque:
        hits = self.hits.get(key)
        if hits is None:
            hits = self.hits[key] = collections.deque()
        start = now - self.seconds
        while hits and hits[0] < start:         # (a hit exactly a window old still counts, as in limits)
            hits.popleft()
        return hits

    def hit(self, key: str, now: float) -> bool:
        """Count one hit now, unless the key has ``amount`` in its window already (then False)."""
        with self.lock:
            hits = self._window(key, now)
            if len(hits) >= self.amount:
                return False
            hits.append(now)
            if now - self.swept > self.seconds:
                self.swept = now
                for idle in [k for k, h in self.hits.items() if not h or h[-1] < now - self.seconds]:
                    del self.hits[idle]
            return True

    def stats(self, key: str, now: float) -> tuple[float, int]:
        """(when the window frees a hit: its oldest hit + ``seconds``, or now; the hits it has left)."""
        with self.lock:
            hits = self._window(key, now)
            return (hits[0] if hits else now) + self.seconds, self.amount - len(hits)


class RateLimit:
    """One budget per key over every route but the exempt ones, as a moving window per limit, and the headers
    that tell a client where it stands.

    flask-limiter did the same through decorators, blueprint and exemption scopes resolved again on every
    request, and limits' memory storage under it started threads: together they cost a limited worker more
    than a whole bare ``/healthz`` (bench/README.md, "The request path"). Here the limits are parsed once
    (the ``limits`` library) and a request makes one hit per limit."""

    def __init__(self, items: list):
        self.items = items
        self.windows = [MovingWindow(item.amount, item.get_expiry()) for item in items]

    def check_rate(self) -> None:
        """Before the view: count the request against each limit; 429 at the first one it is over."""
        endpoint = request.endpoint
        if endpoint is None or endpoint in EXEMPT or endpoint.rpartition(".")[2] == "static":
            return
        key, now = _key(), time.time()
        for item, window in zip(self.items, self.windows):
            if not window.hit(key, now):
                g._rate_limit = (item, window, key)
                raise TooManyRequests(description=str(item))
        g._rate_limit = (self.items[0], self.windows[0], key)

    def rate_headers(self, response):
        """X-RateLimit-Limit, -Remaining and -Reset of the limit the request met (the one it was over, else
        the smallest window), and Retry-After: when it resets, or later if the answer already said so."""
        met = g.pop("_rate_limit", None)
        if met is None:
            return response
        item, window, key = met
        reset_time, remaining = window.stats(key, time.time())
        reset_at = int(reset_time + 1)
        response.headers.add("X-RateLimit-Limit", str(item.amount))
        response.headers.add("X-RateLimit-Remaining", str(remaining))
        response.headers.add("X-RateLimit-Reset", str(reset_at))
        existing = response.headers.get("Retry-After")
        if existing is not None:
            when = parse_date(existing)
            later = when.timestamp() if when is not None else time.time() + int(existing) if existing.isdigit() \
                else reset_at
            reset_at = max(int(later), reset_at)
        response.headers["Retry-After"] = str(int(reset_at - time.time()))
        return response


def init_app(app: Flask, keys) -> RateLimit | None:
    """The configured rate limit (None: off) checked before every view."""
    items = rate_limits(app.config["CONTEXT"], keys)
    if not items:
        return None
    limit = RateLimit(items)
    app.before_request(limit.check_rate)
    app.after_request(limit.rate_headers)
    return limit
