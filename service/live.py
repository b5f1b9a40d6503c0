"""Live context's vocabulary, on either store: what a new unit looks like to listeners (``FeedUnit``), which
units a stream delivers (``Match``), the URIs changes name, and the limits on open streams. What each
store reads them from is its ``Sources`` (service/store/base.py); service/hub.py fans them out. The URIs are
service/uris.py's."""
from __future__ import annotations

from dataclasses import dataclass

KEEP_EVENTS_MS = 10 * 60 * 1000    # change-log rows kept: a listener further behind re-reads what it watches
STALE_MS = 15_000                  # a stream slot not refreshed for this long belongs to a dead worker


@dataclass(frozen=True)
class FeedUnit:
    """What listeners match a new unit on (the content is read only for streams that deliver it)."""
    seq: int
    cid: str
    type: str
    source: str
    timestamp: int
    expires_at: int
    terms: frozenset[str]


@dataclass(frozen=True)
class Match:
    """Which new units a GET /mcp/stream delivers: query terms (any, or all with operator "and";
    none: every unit), types and source (exact, or a prefix ending in '*'), as search filters them."""
    terms: tuple[str, ...] = ()
    operator: str = "or"
    types: tuple[str, ...] | None = None
    source: str | None = None

    def __call__(self, u: FeedUnit) -> bool:
        if self.types and u.type not in self.types:
            return False
        if self.source:
            if self.source.endswith("*"):
                if not u.source.startswith(self.source[:-1]):
                    return False
            elif u.source != self.source:
                return False
        if not self.terms:
            return True
        hits = [term in u.terms for term in self.terms]
        return all(hits) if self.operator == "and" else any(hits)


class LimitReached(Exception):
    """Too many open streams: ``scope`` is "key", "tenant" (429) or "server" (this worker, 503)."""

    def __init__(self, scope: str, limit: int, message: str | None = None):
        self.scope, self.limit = scope, limit
        what = {"key": "this API key", "tenant": "this tenant", "server": "this server process"}[scope]
        super().__init__(message or f"Too many open streams for {what} (at most {limit}); close one or retry later.")

    @property
    def status(self) -> int:
        return 503 if self.scope == "server" else 429
