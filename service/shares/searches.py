"""A worker's search slots with fair shares (docs/design.md §9, "Fair shares"): at most so many searches at once,
one tenant's and one key's share of them, and the tenant's CPU share (service/shares/cpu.py) beside."""
from __future__ import annotations

import collections
import contextlib
import threading
import time

from flask import after_this_request, g, has_request_context

from ..errors import ApiError, Busy, TooManySearches
from .cpu import CpuShares
from .fair import FairShares, shares


class _Waiter:
    """A search waiting for a slot: its lock is released when a slot is handed to it."""

    __slots__ = ("tenant", "key", "lock", "granted")

    def __init__(self, tenant: str, key: str | None):
        self.tenant, self.key, self.granted = tenant, key, False
        self.lock = threading.Lock()
        self.lock.acquire()


class SearchSlots(FairShares):
    """A worker's search slots with fair shares: at most ``total`` searches at once, of which one tenant
    holds at most ``per_tenant`` and one API key at most ``per_key``, so a tenant running slow searches
    leaves slots for the others.

    In a request a search never waits in its thread (issue 50, H1: sixteen searches sleeping up to 2 s each held
    every thread of a worker): it takes a slot at once or is refused at once, 503 ``search_busy`` when the worker's
    slots are all taken, 429 ``too_many_searches`` past its key's or tenant's share or its tenant's CPU share, with
    Retry-After. Under gunicorn the wait happens before a thread is given, where it costs none (``Admission``).
    Outside a request (the live hub's own searches) a search waits up to ``wait_s``, then 503 ``search_busy``.

    A slot given back is handed to the first waiting search its shares let in, which alone is woken: a
    condition woken for all (``notify_all``) woke every waiting thread of the worker for each search that
    ended, each to take the GIL and sleep again (a twelfth of a worker's GIL under 64 connections of
    questions, bench/README.md "The request path")."""

    def __init__(self, total: int, per_tenant: int, per_key: int, wait_s: float, cpu: CpuShares | None = None):
        super().__init__(total, per_tenant, per_key)
        self.wait_s = wait_s
        self.cpu = cpu
        self._lock = threading.Lock()
        self._waiting: collections.deque[_Waiter] = collections.deque()     # in arrival order

    @classmethod
    def of(cls, config) -> "SearchSlots | None":
        n = config.max_concurrent_searches
        if n <= 0:
            return None
        cpu = CpuShares(config.search_cpu_share) if config.search_cpu_share > 0 else None
        return cls(n, *shares(n, config.search_share, config.search_key_share), config.search_wait_s, cpu)

    def _give_back(self, tenant: str, key: str | None) -> list:
        """Return a slot (under the lock); the waiters handed one, to be woken once the lock is let go."""
        self.remove(tenant, key)
        # Hand the free slots on, in arrival order, to the waiters their shares let in (others keep waiting).
        handed = []
        for waiter in list(self._waiting):
            if self.used >= self.total:
                break
            if self.full(waiter.tenant, waiter.key) is None:
                self._waiting.remove(waiter)
                self.add(waiter.tenant, waiter.key)
                waiter.granted = True
                handed.append(waiter)
        return handed

    def _wait_for_cpu(self, tenant: str) -> None:
        """Wait, holding no slot, while this tenant is past its CPU share (``CpuShares``); Busy past ``wait_s``."""
        start = time.monotonic()
        now = start
        while (delay := self.cpu.wait_for(tenant, now)) > 0:
            if now + delay - start > self.wait_s:
                raise Busy("This tenant's searches already use their share of this server's CPU while other "
                           "tenants search; retry shortly.")
            time.sleep(min(delay, 0.05))
            now = time.monotonic()

    def _wait(self, tenant: str, key: str | None) -> None:
        """Take a slot, waiting up to ``wait_s`` for one to be handed over; Busy when none is."""
        if self.cpu is not None:
            self._wait_for_cpu(tenant)
        with self._lock:
            if self.full(tenant, key) is None:      # (a waiter its shares would let in has a slot already)
                self.add(tenant, key)
                return
            waiter = _Waiter(tenant, key)
            self._waiting.append(waiter)
        if self.wait_s > 0 and waiter.lock.acquire(timeout=self.wait_s):
            return
        with self._lock:
            if waiter.granted:                      # handed a slot just as the wait ended
                return
            self._waiting.remove(waiter)
            scope = self.full(tenant, key)
        raise Busy("Too many searches at once; retry shortly." if scope in ("server", None) else
                   "This tenant already runs its share of this server's searches; retry shortly.")

    def _charge(self, tenant: str, started: float) -> None:
        """Charge the tenant the CPU its search took, and in a request also what building the answer takes after
        its last search (encoding a large answer can cost more than finding it)."""
        ended = time.thread_time()
        self.cpu.charge(tenant, ended - started, time.monotonic())
        if not has_request_context():
            return
        last = g.get("search_cpu_ended")
        g.search_cpu_ended = ended            # (a request that searches again charges from its last search on)
        if last is None:
            def answered(response):
                self.cpu.charge(tenant, time.thread_time() - g.search_cpu_ended, time.monotonic())
                return response
            after_this_request(answered)

    def refusal(self, scope: str) -> ApiError:
        """The answer to a search that finds ``scope``'s share of the slots taken."""
        if scope == "server":
            return Busy("Too many searches at once; retry shortly.")
        whose = "API key" if scope == "key" else "tenant"
        return TooManySearches(f"This {whose} already runs its share of this server's searches; retry shortly.")

    @staticmethod
    def cpu_refusal(delay: float) -> ApiError:
        return TooManySearches("This tenant's searches already use their share of this server's CPU while other "
                               "tenants search; retry after Retry-After seconds.", wait_s=delay)

    def busy(self, tenant: str, key: str | None, now: float) -> tuple[str | None, float]:
        """Why a search of ``tenant`` could not take a slot now: (the scope whose share is full, or None; seconds
        until its tenant is back within its CPU share, 0 when it is). Read without taking a slot."""
        delay = self.cpu.wait_for(tenant, now) if self.cpu is not None else 0.0
        return self.full(tenant, key), delay

    def _take_now(self, tenant: str, key: str | None) -> None:
        if self.cpu is not None and (delay := self.cpu.wait_for(tenant, time.monotonic())) > 0:
            raise self.cpu_refusal(delay)
        with self._lock:
            scope = self.full(tenant, key)
            if scope is None:
                self.add(tenant, key)
                return
        raise self.refusal(scope)

    @contextlib.contextmanager
    def hold(self, tenant: str, key: str | None = None):
        """One slot for the duration of the block: in a request taken at once or refused (429, 503); outside one
        waited for up to ``wait_s``, then ``Busy``."""
        if has_request_context():
            self._take_now(tenant, key)
        else:
            self._wait(tenant, key)
        started = time.thread_time()
        try:
            yield
        finally:
            if self.cpu is not None:
                self._charge(tenant, started)
            with self._lock:
                handed = self._give_back(tenant, key)
            for waiter in handed:       # woken outside the lock: a waker the scheduler stops holds no one up
                waiter.lock.release()
