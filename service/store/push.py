"""The push rules, once for both stores (docs/design.md §3 and §5): each backend fetches, in its push
transaction, the stored rows of every CID and parent of the batch; ``PushPlan`` decides per unit whether it
is new, a duplicate (its newer mutable fields win) or refused (a CID collision, a missing or expired parent),
and keeps each day's expiry range; the backend then assigns seqs and writes its own rows.

A unit earlier in the batch counts as stored for the ones after it: a child may follow its parent in one
batch, and the same unit twice is a duplicate the second time.
"""
from __future__ import annotations

from collections.abc import Callable

from ..errors import Conflict, Unprocessable
from ..units import Unit


def collision(cid: str) -> Conflict:
    return Conflict(f"CID {cid} already names a different unit (48-bit collision); the stored unit was not changed.",
                    field="cid")


def parent_missing(parent: str) -> Unprocessable:
    return Unprocessable(f"Parent unit {parent} does not exist or has expired.", code="parent_not_found",
                         field="parent_cid")


def too_many_days(cap: int) -> Unprocessable:
    return Unprocessable(f"This tenant may keep at most {cap} days of units (CONTEXT_MAX_DAYS_PER_TENANT); "
                         "push with a timestamp on a day it already has, or let old days expire.",
                         code="too_many_days", field="timestamp")


def check_day_cap(cap: int, new_days: int, kept: Callable[[], int]) -> None:
    """Refuse a push that would give the tenant more than ``cap`` days (0: no cap); ``kept`` counts the days
    it has (asked only when the push brings new ones)."""
    if cap and new_days and kept() + new_days > cap:
        raise too_many_days(cap)


def same_unit(row, u: Unit) -> bool:
    """Whether a stored row is this unit: a CID names content, timestamp and source (the CID rule)."""
    return row["digest"] == u.digest and row["timestamp"] == u.timestamp and row["source"] == u.source


class PushPlan:
    """One push transaction's decisions. ``stored``: CID -> stored row (at least digest, timestamp, source,
    expires_at) of every CID and parent of the batch; ``stale(row)``: whether a stored row that is not this
    unit may be replaced anyway (SQLite: the reservation of a push that crashed before its ack)."""

    def __init__(self, stored: dict, now: float, stale: Callable[[dict], bool] | None = None):
        self.known = dict(stored)
        self.now = now
        self.stale = stale
        self.expiry: dict[str, tuple[int, int]] = {}      # day -> (min, max) expires_at of this batch

    def check(self, u: Unit) -> tuple[dict | None, bool]:
        """(the row this unit duplicates, or None for a new unit; whether a stale row must go first).
        Raises the unit's refusal (409 collision, 422 parent)."""
        row = self.known.get(u.cid)
        replace = False
        if row is not None and not same_unit(row, u):
            if self.stale is None or not self.stale(row):
                raise collision(u.cid)
            row, replace = None, True
        if u.parent_cid is not None:
            parent = self.known.get(u.parent_cid)
            if parent is None or parent["expires_at"] <= self.now:
                raise parent_missing(u.parent_cid)
        return row, replace

    def planned(self, u: Unit, row: dict) -> None:
        """The unit is in this batch now (``row`` as it will be stored: the next units see it)."""
        self.known[u.cid] = row
        lo, hi = self.expiry.get(u.day, (u.expires_at, u.expires_at))
        self.expiry[u.day] = (min(lo, u.expires_at), max(hi, u.expires_at))
