"""Per-key rate limiting (docs/design.md §9): 429 + Retry-After; the fair shares of a worker's search slots
(``SearchSlots``; stream slots: service/hub.py), of its threads (``Admission``, asked by the slow-client guard
before a thread serves a request) and of the threads that write large answers (``AnswerSlots``).
(Slow clients are bounded by service/guard/.)

The key is a hash of the presented credential (or the client address when there is none),
so limiting happens before authentication work and never logs a key. Counters live in each
worker's memory: with N gunicorn workers a key may get up to N times the configured rate.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import math
import threading
import time

from flask import Flask, after_this_request, current_app, g, has_request_context, request
from limits import parse_many
from werkzeug.exceptions import TooManyRequests
from werkzeug.http import parse_date

from .auth import OPEN, KeyRing, Principal, bearer_token
from .errors import ApiError, Busy, ThreadsBusy, TooManySearches, respond

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


def init_app(app: Flask) -> None:
    items = rate_limits(app.config["CONTEXT"], app.extensions["context_keys"])
    if not items:
        return
    limit = RateLimit(items)
    app.before_request(limit.check_rate)
    app.after_request(limit.rate_headers)
    app.extensions["context_rate_limit"] = limit


def share(configured: int, total: int) -> int:
    """One tenant's (or key's) share of ``total`` slots: ``configured``, or with -1 half of them, at least 1."""
    if configured >= 0:
        return max(1, min(configured, total)) if total > 0 else configured
    return max(1, total // 2)


def shares(total: int, tenant_share: int, key_share: int) -> tuple[int, int]:
    """(one tenant's, one key's share of ``total`` slots): each as ``share`` gives it, a key's -1 meaning its
    tenant's, and a key never above its tenant."""
    tenant = share(tenant_share, total)
    key = share(key_share, total) if key_share >= 0 else tenant
    return tenant, min(key, tenant)


def caller_key() -> str | None:
    """The key id of the request being served, or None outside a request (the live hub's own searches)."""
    if not has_request_context():
        return None
    principal = g.get("principal")
    return getattr(principal, "key_id", None)


class FairShares:
    """What is held at once, in all and per tenant and per API key, against each one's cap."""

    def __init__(self, total: int, per_tenant: int, per_key: int):
        self.total, self.per_tenant, self.per_key = total, per_tenant, per_key
        self.used = 0
        self.tenants: dict[str, int] = {}
        self.keys: dict[str, int] = {}

    def full(self, tenant: str, key: str | None) -> str | None:
        """Whose share one more would pass ("server", "key", "tenant": the worker's own first), or None."""
        if self.used >= self.total:
            return "server"
        if key is not None and self.keys.get(key, 0) >= self.per_key:
            return "key"
        return "tenant" if self.tenants.get(tenant, 0) >= self.per_tenant else None

    def add(self, tenant: str, key: str | None) -> None:
        self.used += 1
        self.tenants[tenant] = self.tenants.get(tenant, 0) + 1
        if key is not None:
            self.keys[key] = self.keys.get(key, 0) + 1

    def remove(self, tenant: str, key: str | None) -> None:
        self.used -= 1
        for counts, name in ((self.tenants, tenant), (self.keys, key)):
            if name is not None:
                counts[name] -= 1
                if not counts[name]:
                    del counts[name]


class _Waiter:
    """A search waiting for a slot: its lock is released when a slot is handed to it."""

    __slots__ = ("tenant", "key", "lock", "granted")

    def __init__(self, tenant: str, key: str | None):
        self.tenant, self.key, self.granted = tenant, key, False
        self.lock = threading.Lock()
        self.lock.acquire()


class CpuShares:
    """What each tenant's searches cost this worker in CPU over about the last ``window_s`` (thread time, decayed
    exponentially), so a tenant searching without pause can be held to ``share`` of the worker's CPU while
    another tenant searches too. Slots alone could not do it: a tenant within its share of slots still keeps the
    interpreter busy, and another's search, however small, waits for the lock between every step (eight
    threads of one tenant searching 1 MB units made another's searches 6-10x slower, bench/large_units.py).

    A tenant past its share is held only while a lighter tenant (one within its share) has searched within
    ``3 * window_s``: a tenant alone gets the whole worker, and tenants all past their shares are not held
    (they share the worker as their slots let them, and no CPU is left idle for nobody)."""

    def __init__(self, share: float, window_s: float = 1.0):
        self.share, self.window = share, window_s
        self.spent: dict[str, tuple[float, float]] = {}     # tenant -> (CPU seconds decayed to `at`, at)
        self.seen: dict[str, float] = {}                    # tenant -> when it last searched
        self.lock = threading.Lock()

    def _spent(self, tenant: str, now: float) -> float:
        spent, at = self.spent.get(tenant, (0.0, now))
        return spent * math.exp((at - now) / self.window)

    def charge(self, tenant: str, cpu_s: float, now: float) -> None:
        with self.lock:
            self.spent[tenant] = (self._spent(tenant, now) + cpu_s, now)
            self.seen[tenant] = now
            if len(self.seen) > 64:                         # forget tenants idle for a while
                idle = now - 10 * self.window
                for name in [t for t, when in self.seen.items() if when < idle]:
                    del self.seen[name]
                    self.spent.pop(name, None)

    def wait_for(self, tenant: str, now: float) -> float:
        """Seconds until ``tenant`` is back within its share (0 when it is, or when no lighter tenant searches)."""
        with self.lock:
            self.seen[tenant] = now
            spent, limit = self._spent(tenant, now), self.share * self.window
            if spent <= limit:
                return 0.0
            recent = now - 3 * self.window
            if not any(when >= recent and self._spent(name, now) <= limit
                       for name, when in self.seen.items() if name != tenant):
                return 0.0
            return self.window * math.log(spent / limit)


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


class AnswerSlots(FairShares):
    """The threads of a worker that write large answers (over ``threshold`` bytes: exports, big searches,
    lineage, listing pages). A client may read an answer as slowly as the guard allows (service/guard/responses.py:
    one over 8 MiB is written by its thread, paced), so 16 slow readers of exports once held every thread of
    both workers. A worker writes at most ``total`` such answers at once, one tenant ``per_tenant`` and one key
    ``per_key`` of them; past a share the answer is refused at once (waiting would hold a thread too)."""

    def __init__(self, total: int, per_tenant: int, per_key: int, threshold: int):
        super().__init__(total, per_tenant, per_key)
        self.threshold = threshold
        self._lock = threading.Lock()

    @classmethod
    def of(cls, config) -> "AnswerSlots":
        total = config.large_answers if config.large_answers >= 0 else max(1, config.threads // 2)
        return cls(total, *shares(total, config.large_answer_share, config.large_answer_key_share),
                   config.large_answer_bytes)

    def take(self, tenant: str, key: str | None):
        """A release callable for one slot, or raise ApiError: 429 past the key's or tenant's share, 503 past
        the worker's."""
        with self._lock:
            scope = self.full(tenant, key)
            if scope is None:
                self.add(tenant, key)
        if scope is not None:
            whose = {"key": "This API key", "tenant": "This tenant", "server": "This server"}[scope]
            raise ApiError(f"{whose} is already sending its share of large answers (over {self.threshold} bytes) at "
                           "once; retry shortly, or ask for less (filters, a smaller top_k or limit).",
                           code="too_many_large_answers", status=503 if scope == "server" else 429,
                           headers={"Retry-After": "1"})
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self.remove(tenant, key)
        return release


def init_admission(app: Flask) -> None:
    """This worker's ``Admission`` (the slow-client guard asks it before a thread serves a request), and the answer
    to a request it refused, raised before any view (in the door's shape, logged like any answer)."""
    config, store = app.config["CONTEXT"], app.extensions["context_store"]
    app.extensions["context_admission"] = Admission.of(config, app.extensions["context_keys"], store.search_slots)

    @app.before_request
    def _refused():
        error = getattr(request.environ.get("gunicorn.socket"), "refusal", None)
        if error is not None:
            raise error


def take_answer_slot():
    """A slot for the large answer the current request is about to send (its principal's tenant and key)."""
    principal = g.get("principal")
    slots: AnswerSlots = current_app.extensions["context_answers"]
    return slots.take(principal.tenant if principal else "-", getattr(principal, "key_id", None))


def init_answers(app: Flask) -> None:
    """Every answer over the threshold takes a slot while its thread writes it (a streamed one, the export,
    takes its own: service/api/manage.py)."""
    slots = AnswerSlots.of(app.config["CONTEXT"])
    app.extensions["context_answers"] = slots

    @app.after_request
    def _large_answer(response):
        if (response.is_streamed or (response.content_length or 0) <= slots.threshold or response.status_code >= 400
                or g.get("principal") is None):     # the public documents (OpenAPI, console files) are small
            return response
        try:
            release = take_answer_slot()
        except ApiError as e:
            return respond(e.status, e.code, e.message, headers=e.headers)
        response.response = released_when_sent(response.response, release)   # Content-Length stays set
        return response


def released_when_sent(body, release):
    """``body``'s pieces, then ``release()``: once the server has taken the last piece (or dropped the client,
    which closes this generator). Also where no server closes the response (a test client)."""
    try:
        yield from body
    finally:
        release()
