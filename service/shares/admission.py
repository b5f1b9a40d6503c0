"""Who may take one of a worker's threads now (docs/design.md §9, "Threads"): each key's and tenant's share of
the threads and of the search slots, asked by the slow-client guard (service/guard/parking.py) before a thread
serves a request, and what a request gives back once its thread is done with it."""
from __future__ import annotations

import threading

from flask import Flask, request

from ..auth import OPEN, KeyRing, Principal, bearer_token
from ..errors import ThreadsBusy
from .fair import FairShares, shares
from .searches import SearchSlots


# The doors that may search: a request to one waits (holding no thread) while its key's or tenant's search slots are
# taken or its tenant is past its CPU share. /mcp is every MCP method: an agent's tool call is most often a search.
SEARCH_PATHS = frozenset({"/mcp/search", "/mcp/context", "/mcp/tools", "/mcp", "/adapters/continue", "/retrieval",
                          "//retrieval"})


class Admission:
    """Whether a request that has arrived whole may take one of this worker's threads now (docs/design.md §9, "Fair
    shares"), asked by the slow-client guard (service/guard/parking.py) before a thread serves it: a request that
    must wait waits in the worker's poller, holding no thread (issue 50, H1: searches that slept up to 2 s in their
    threads, past their tenant's CPU share or waiting for a slot, held all sixteen of them).

    - One key, and one tenant, hold at most their share of the worker's threads (``CONTEXT_THREAD_KEY_SHARE``,
      ``CONTEXT_THREAD_SHARE``): a request past it waits until one of theirs ends, at most ``CONTEXT_THREAD_WAIT_S``,
      then 429 ``too_many_requests``. Without keys (one caller) this share does not apply.
    - A request to a door that searches (``SEARCH_PATHS``) waits while its key's or tenant's search slots are taken,
      or its tenant is past its CPU share, at most ``CONTEXT_SEARCH_WAIT_S``, then is refused as ``SearchSlots``
      refuses in a thread (429 ``too_many_searches``, 503 ``search_busy``).
    A request naming no key the service knows (probes; a 401 to come) goes at once.

    ``admit`` answers ``("go", release)``: serve it now and call ``release()`` once its thread is done with it;
    ``("wait", at)``: ask again once a request of this worker has ended, or at ``at`` (monotonic) at the latest;
    or ``("refuse", error)``: let the app answer ``error`` (an ApiError) at once."""

    def __init__(self, keys: KeyRing, threads: FairShares | None, slots: SearchSlots | None, thread_wait_s: float,
                 search_wait_s: float):
        self.keys, self.threads, self.slots = keys, threads, slots
        self.thread_wait_s, self.search_wait_s = thread_wait_s, search_wait_s
        # the search requests let in, until each ends: a slot is taken only once its thread runs the search, so
        # the slots alone would let every waiting search of a tenant in at once, to be refused in its thread
        self.searching = FairShares(slots.total, slots.per_tenant, slots.per_key) if slots is not None else None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, config, keys: KeyRing, slots: SearchSlots | None) -> "Admission":
        threads = None
        if not keys.open:
            n = config.threads
            threads = FairShares(n, *shares(n, config.thread_share, config.thread_key_share))
        return cls(keys, threads, slots, config.thread_wait_s, config.search_wait_s)

    @staticmethod
    def searches(method: str, path: str) -> bool:
        """Whether a request may search (a door of ``SEARCH_PATHS``; a GET of /mcp is a stream)."""
        return path in SEARCH_PATHS and (method == "POST" or (method == "GET" and path != "/mcp"))

    def caller(self, authorization: str | None) -> Principal | None:
        """Who an Authorization header names (every caller without keys), or None."""
        if self.keys.open:
            return OPEN
        token, problem = bearer_token(authorization)
        return None if problem else self.keys.authenticate(token)

    def admit(self, caller: Principal | None, searches: bool, since: float, now: float) -> tuple:
        """The verdict on a request of ``caller`` (to a door that may search: ``searches``) that has waited
        since ``since``."""
        if caller is None:
            return "go", nothing
        tenant, key = caller.tenant, caller.key_id
        searches = searches and self.searching is not None
        with self._lock:
            if self.threads is not None and self.threads.full(tenant, key) in ("key", "tenant"):
                if now - since >= self.thread_wait_s:
                    return "refuse", ThreadsBusy(
                        "This API key (or its tenant) already has its share of this server's threads busy; retry "
                        "shortly.")
                return "wait", since + self.thread_wait_s
            if searches:
                scope = self.searching.full(tenant, key) or self.slots.full(tenant, key)
                delay = self.slots.busy(tenant, key, now)[1] if scope is None else 0.0
                if scope is not None or delay > 0:
                    if now + delay - since > self.search_wait_s:
                        return "refuse", self.slots.refusal(scope) if scope else self.slots.cpu_refusal(delay)
                    return "wait", now + delay if scope is None else since + self.search_wait_s
                self.searching.add(tenant, key)
            if self.threads is not None:
                self.threads.add(tenant, key)
        return "go", self._release(tenant, key, searches)

    def _release(self, tenant: str, key: str, searched: bool):
        if self.threads is None and not searched:
            return nothing
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                with self._lock:
                    if self.threads is not None:
                        self.threads.remove(tenant, key)
                    if searched:
                        self.searching.remove(tenant, key)
        return release


def nothing() -> None:
    """What a request that holds no share gives back when its thread is done."""


_serving = threading.local()


def serving(release) -> None:
    """What the request this thread serves gives back once its thread is done (the guard sets it; None after)."""
    _serving.release = release


def let_go() -> None:
    """A request that has become a live stream gives back its share of the threads and of the search slots now:
    its own stream slots bound it from here (the hub's, docs/design.md §7), and a held stream counted against
    both would leave its tenant's next requests waiting, then refused as busy, for as long as the stream lasts."""
    release = getattr(_serving, "release", None)
    _serving.release = None
    if release is not None:
        release()


def init_app(app: Flask, keys: KeyRing, store) -> Admission:
    """This worker's ``Admission`` (the slow-client guard asks it before a thread serves a request), and the answer
    to a request it refused, raised before any view (in the door's shape, logged like any answer)."""
    admission = Admission.of(app.config["CONTEXT"], keys, store.search_slots)

    @app.before_request
    def _refused():
        error = getattr(request.environ.get("gunicorn.socket"), "refusal", None)
        if error is not None:
            raise error
    return admission
