"""The push rules, once for both stores (docs/design.md §3 and §5): each backend fetches, in its push
transaction, the stored rows of every CID and parent of the batch; ``PushPlan`` decides per unit whether it
is new, a duplicate (its newer mutable fields win) or refused (a CID collision, a missing or expired parent),
and keeps each day's expiry range; the backend then assigns seqs and writes its own rows.

A unit earlier in the batch counts as stored for the ones after it: a child may follow its parent in one
batch, and the same unit twice is a duplicate the second time.

A new unit's thread and its place in it are decided here too (``Threads``, docs/design.md §3 "Threads"),
from what the backend's ``ThreadLookup`` reads in the same transaction: so a unit belongs to its thread
from the moment it is acknowledged, with no scan at query time.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..errors import Conflict, Unprocessable
from ..units import Unit
from ..unitkeys import session_thread


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


RECENT = 64                 # a source's latest units planned in one batch, looked through for the previous


class ThreadLookup(Protocol):
    """What thread assignment reads from a backend's catalog, in the push's transaction."""

    def last_pos(self, thread: str) -> int | None:
        """The highest place taken in this thread, or None when it has no stored unit."""

    def previous(self, source: str, lo: int, hi: int) -> str | None:
        """The thread of the source's latest stored unit with a timestamp in [lo, hi], or None."""


class Threads:
    """A push's thread assignments (docs/design.md §3 "Threads"): a child joins its parent's thread; a unit
    with ``metadata.session`` the thread that names; with ``gap`` (CONTEXT_THREAD_GAP_S, off by default) any
    other the thread of its source's previous unit 1 s to ``gap`` s older (units of the same second, a bulk
    import, stay apart); else it starts a thread named by its own CID. Its place is the thread's next."""

    def __init__(self, lookup: ThreadLookup, gap: int = 0):
        self.lookup = lookup
        self.gap = gap
        self.ends: dict[str, int] = {}                  # thread -> highest place taken (this batch included)
        self.recent: dict[str, list[tuple[int, str]]] = {}  # source -> (timestamp, thread) planned here

    def assign(self, u, parent: dict | None) -> tuple[str, int]:
        if parent is not None:
            thread = parent["thread"] or parent["cid"]    # (a parent stored before threads: its own)
        else:
            thread = session_thread(u.metadata_json()) or self._previous(u.source, u.timestamp) or u.cid
        if thread not in self.ends:
            last = self.lookup.last_pos(thread)
            self.ends[thread] = -1 if last is None else last
        self.ends[thread] += 1
        recent = self.recent.setdefault(u.source, [])
        recent.append((u.timestamp, thread))
        del recent[:-RECENT]
        return thread, self.ends[thread]

    def _previous(self, source: str, ts: int) -> str | None:
        if self.gap <= 0:
            return None
        lo, hi = ts - self.gap, ts - 1
        here = [(t, thread) for t, thread in self.recent.get(source, ()) if lo <= t <= hi]
        if here:
            return max(here)[1]
        return self.lookup.previous(source, lo, hi)


class _Nothing:
    """A ``ThreadLookup`` with nothing stored: an upgrade's ``Threads`` holds every assignment itself."""

    @staticmethod
    def last_pos(thread: str) -> None:
        return None

    @staticmethod
    def previous(source: str, lo: int, hi: int) -> None:
        return None


class _Stored:
    """A catalog row as ``Threads.assign`` reads a unit: lineage (and time) only, since no catalog holds
    metadata, so both stores give an upgraded unit the same thread."""

    def __init__(self, r):
        self.cid, self.source, self.timestamp = r["cid"], r["source"], r["timestamp"]

    @staticmethod
    def metadata_json() -> None:
        return None


class StoredInOrder:
    """Threads for units stored before threads existed, read back in acknowledgement order (an upgrade): a
    child joins its parent's thread; a parent no longer stored, or acknowledged after its child, leaves it a
    thread of its own; with ``gap``, time adjacency."""

    def __init__(self, gap: int = 0):
        self.threads = Threads(_Nothing(), gap)
        self.known: dict[str, dict] = {}

    def assign(self, r) -> tuple[str, int]:
        """(thread, place) of the next stored row (cid, source, timestamp, parent_cid)."""
        parent = self.known.get(r["parent_cid"]) if r["parent_cid"] else None
        thread, tpos = self.threads.assign(_Stored(r), parent)
        self.known[r["cid"]] = {"cid": r["cid"], "thread": thread}
        return thread, tpos


class PushPlan:
    """One push transaction's decisions. ``stored``: CID -> stored row (at least digest, timestamp, source,
    expires_at) of every CID and parent of the batch; ``stale(row)``: whether a stored row that is not this
    unit may be replaced anyway (SQLite: the reservation of a push that crashed before its ack)."""

    def __init__(self, stored: dict, now: float, stale: Callable[[dict], bool] | None = None,
                 threads: ThreadLookup | None = None, gap: int = 0):
        self.known = dict(stored)
        self.now = now
        self.stale = stale
        self.expiry: dict[str, tuple[int, int]] = {}      # day -> (min, max) expires_at of this batch
        self.threads = Threads(threads, gap) if threads is not None else None

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

    def thread(self, u, row: dict | None) -> tuple[str | None, int | None]:
        """(thread, place) of a unit ``check`` passed: a duplicate keeps the one it was first stored with."""
        if row is not None:
            return row.get("thread"), row.get("tpos")
        return self.threads.assign(u, self.known[u.parent_cid] if u.parent_cid else None)

    def planned(self, u: Unit, row: dict) -> None:
        """The unit is in this batch now (``row`` as it will be stored: the next units see it)."""
        self.known[u.cid] = row
        lo, hi = self.expiry.get(u.day, (u.expires_at, u.expires_at))
        self.expiry[u.day] = (min(lo, u.expires_at), max(hi, u.expires_at))
