"""Live context, the delivery side: one hub per gunicorn worker fans out to its open streams.

A listener (an MCP ``subscriptions/listen`` stream, service/mcp/listen.py, or a GET /mcp/stream,
service/api/stream.py) is one long-lived response on one gunicorn thread. The hub's single thread
looks, only for tenants that have listeners here, at the shared sources (the feed of new units, the
change log) and hands each listener what it watches. Nothing is queued between workers: whichever
worker took a push, every worker reads it from storage. The sources are the backend's Sources: SQLite's
files (service/store/sqlite/live.py, polled every ``listen_poll_ms``) or the tables every PostgreSQL node shares
(service/store/postgresql/live.py, woken by LISTEN/NOTIFY); the API and MCP layers never tell them apart.

Bounds (README, docs/configuration.md):
- per worker at most ``config.stream_cap`` open streams (each holds a gunicorn thread; the others
  stay free for requests), refused with 503 + Retry-After beyond; of them one tenant and one key hold
  at most their share (``shares``: half by default), refused with 429 + Retry-After beyond, so a
  tenant at its limit leaves slots to the others;
- per API key and per tenant, over every worker, ``max_listeners_per_key`` / ``max_listeners_per_tenant``
  (counted in ``<data>/streams.db``, on PostgreSQL in a table over every node; a dead worker's rows stop
  counting after STALE_MS), 429 beyond;
- a stream that delivered nothing for ``listen_idle_s`` ends (with a final message), as do all of a
  worker's streams when it shuts down; a closed client is noticed within a second.
"""
from __future__ import annotations

import heapq
import logging
import select
import socket
import threading
import time

from .errors import ApiError
from .shares.admission import let_go
from .shares.fair import shares
from .live import FeedUnit, LimitReached
from .params import parse_search
from .uris import UNITS_PREFIX, search_uri

log = logging.getLogger(__name__)

TOUCH_S = 3.0              # how often a worker refreshes its rows
FEED_LIMIT = 1000          # units read per tenant and tick
SEARCH_WAIT_S = 10.0       # longest a search subscription waits for the read index to show a new unit
SEARCH_TOP_K = 10          # what resources/read of context://search/{query} shows (service/mcp/resources.py)
LIST = "list"              # the pending marker of a resources list change
FULL_LOOK_S = 1.0          # a hub woken for some tenants still looks at every one this often (or listen_poll_ms)


def client_gone(sock) -> bool:
    """True once the peer closed the connection (readable, and a peek reads end-of-file)."""
    raw = getattr(sock, "_sock", sock)          # service/guard/ wraps gunicorn's socket
    if raw is None:
        return False
    try:
        readable, _, _ = select.select([raw], [], [], 0)
        if not readable:
            return False
        return raw.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class Listener:
    """One open stream. The hub calls ``on_*`` from its thread; the stream's own thread waits in
    ``wait`` and takes what was handed over. Subclasses say what they watch and how they render it."""

    kind = "listen"
    cids: frozenset[str] = frozenset()          # context://units/{cid} subscriptions
    uris: frozenset[str] = frozenset()          # any URI the change log may name
    queries: dict[str, frozenset[str]] = {}     # context://search/{query} subscriptions: query -> terms
    wants_list = False                          # resources list changes
    wants_units = False                         # every new unit (GET /mcp/stream)

    def __init__(self, hub: "Hub", tenant: str, key_id: str, sock=None):
        self.hub, self.tenant, self.key_id, self.sock = hub, tenant, key_id, sock
        self.cond = threading.Condition()
        self.closing: str | None = None         # why the server ends the stream: "shutdown" | "idle"
        self.slot: str | None = None
        self.since_seq = self.since_n = 0       # the feed and change log as they were when it opened
        self.last_delivery = time.monotonic()

    # --- hub side (hub thread, hub lock held) ---------------------------------------------------
    def notify(self, key: str) -> None:
        """A subscribed URI (or LIST) changed."""

    def offer(self, units: list[FeedUnit], resolved: int) -> None:
        """New units in seq order, up to ``resolved`` (streams only)."""

    def end(self, reason: str) -> None:
        with self.cond:
            if self.closing is None:
                self.closing = reason
            self.cond.notify_all()

    # --- stream side --------------------------------------------------------------------------
    def ready(self) -> bool:
        """Something to send (or to read: a stream catching up)."""
        return False

    def take(self) -> list[bytes]:
        """The frames ready to send now."""
        return []

    def final(self, reason: str) -> bytes:
        """The last frame when the server ends the stream."""
        return b""

    def body(self, first: list[bytes], write_timeout: float) -> "Body":
        """The response body: ``first``, then whatever arrives, heartbeats on a quiet stream, and the final
        frame when the server ends it. A write blocked ``write_timeout`` (a client that reads nothing) ends it."""
        if self.sock is not None:
            try:
                self.sock.settimeout(write_timeout)
            except OSError:
                pass
        return Body(self, self._frames(first))

    def _frames(self, first: list[bytes]):
        cfg = self.hub.config
        heartbeat, idle = max(0.05, cfg.listen_heartbeat_s), cfg.listen_idle_s
        try:
            yield from first
            self.last_delivery = beat = time.monotonic()
            while True:
                out = self.take()
                if out:
                    yield from out
                    self.last_delivery = beat = time.monotonic()
                    continue
                if self.closing is not None:
                    yield self.final(self.closing)
                    return
                if self.ready():
                    continue
                if self.gone():
                    return                        # the client closed: that cancels the stream
                now = time.monotonic()
                if idle > 0 and now - self.last_delivery >= idle:
                    self.end("idle")
                    continue
                if now - beat >= heartbeat:
                    yield b":\n\n"                 # an SSE comment keeps proxies and idle timeouts at bay
                    beat = now
                    continue
                self.wait(min(1.0, heartbeat - (now - beat)))
        finally:
            self.hub.close(self)

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.ready() or self.closing is not None, timeout)

    def gone(self) -> bool:
        return self.sock is not None and client_gone(self.sock)


class Body:
    """A stream's response iterable. gunicorn calls ``close`` when the response ends however it ends,
    even when it never started: the listener is always released."""

    def __init__(self, lst: Listener, frames):
        self.lst, self.frames = lst, frames

    def __iter__(self):
        return self.frames

    def close(self) -> None:
        self.frames.close()
        self.lst.hub.close(self.lst)


class Watch:
    """One tenant's listeners in this worker, indexed by what they watch, and the tenant's cursors."""

    def __init__(self, tenant: str, seq: int, n: int):
        self.tenant = tenant
        self.seq = seq                      # the feed is resolved up to here
        self.n = n                          # the change log is read up to here
        self.listeners: set[Listener] = set()
        self.by_cid: dict[str, set[Listener]] = {}
        self.by_uri: dict[str, set[Listener]] = {}
        self.by_query: dict[str, set[Listener]] = {}
        self.terms: dict[str, frozenset[str]] = {}
        self.candidates: dict[str, list[tuple[int, str, float]]] = {}   # query -> (seq, cid, first seen)
        self.top: dict[str, set[str]] = {}                            # query -> cids of its last top k
        self.searched_state: dict[str, object] = {}
        self.expiry: dict[str, int] = {}
        self.heap: list[tuple[int, str]] = []

    def add(self, lst: Listener) -> None:
        self.listeners.add(lst)
        for cid in lst.cids:
            self.by_cid.setdefault(cid, set()).add(lst)
        for uri in lst.uris:
            self.by_uri.setdefault(uri, set()).add(lst)
        for q, terms in lst.queries.items():
            self.by_query.setdefault(q, set()).add(lst)
            self.terms[q] = terms

    def remove(self, lst: Listener) -> None:
        self.listeners.discard(lst)
        for index, keys in ((self.by_cid, lst.cids), (self.by_uri, lst.uris), (self.by_query, lst.queries)):
            for k in keys:
                group = index.get(k)
                if group is not None:
                    group.discard(lst)
                    if not group:
                        del index[k]
        for q in list(self.terms):
            if q not in self.by_query:
                for d in (self.terms, self.candidates, self.top, self.searched_state):
                    d.pop(q, None)
        for cid in list(self.expiry):
            if cid not in self.by_cid:
                del self.expiry[cid]

    def expire_at(self, cid: str, when: int | None) -> None:
        if when is None or cid not in self.by_cid:
            return
        self.expiry[cid] = when
        heapq.heappush(self.heap, (when, cid))


class Hub:
    """This worker's listeners and the thread that feeds them."""

    def __init__(self, store, sources):
        self.store = store
        self.config = store.config
        self.sources = sources              # the backend's Sources (service/store/base.py SourcesApi)
        self.changes = sources.changes
        self.slots = sources.slots
        self.lock = threading.RLock()
        self.watches: dict[str, Watch] = {}
        self.count = 0
        self.by_tenant: dict[str, int] = {}     # this worker's open streams per tenant and per key
        self.by_key: dict[str, int] = {}
        self.worker = None                  # gunicorn's worker (service/gunicorn_conf.py): alive or stopping
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._touched = 0.0

    # --- opening and closing ------------------------------------------------------------------
    def open(self, lst: Listener) -> Watch:
        """Register a listener (LimitReached when a limit is met); its watch's cursors start now."""
        if self._stop.is_set() or (self.worker is not None and not self.worker.alive):
            raise LimitReached("server", 0, "This server process is shutting down; retry (another will answer).")
        cap = self.config.stream_cap
        with self.lock:
            if self.count >= cap:
                raise LimitReached("server", cap, f"This server process holds its {cap} open streams "
                                   "(CONTEXT_MAX_STREAMS, at most CONTEXT_THREADS - 2; each holds a thread); "
                                   "close one, retry (another process may answer), or raise both.")
            # fair shares of this worker's slots: one tenant (or key) at its share leaves room for others
            tenant_share, key_share = self.shares()
            if self.by_key.get(lst.key_id, 0) >= key_share:
                raise LimitReached("key", key_share, f"This API key holds its share of this server process's "
                                   f"streams (at most {key_share} of {cap}: CONTEXT_STREAM_KEY_SHARE); close one or "
                                   "retry later.")
            if self.by_tenant.get(lst.tenant, 0) >= tenant_share:
                raise LimitReached("tenant", tenant_share, f"This tenant holds its share of this server "
                                   f"process's streams (at most {tenant_share} of {cap}: CONTEXT_STREAM_SHARE); "
                                   "close one or retry later.")
            self._count(lst, 1)
        try:
            lst.slot = self.slots.take(lst.tenant, lst.key_id, lst.kind)
        except BaseException:
            with self.lock:
                self._count(lst, -1)
            raise
        try:
            with self.lock:
                # Read under the lock the hub dispatches under: whatever is newer reaches this listener,
                # whatever is not is older than it (a watch shared with other listeners may still hand
                # over units acknowledged before this one opened: it skips them by their seq).
                seq, n = self.sources.positions(lst.tenant)
                lst.since_seq, lst.since_n = seq, n
                w = self.watches.get(lst.tenant)
                if w is None:
                    w = self.watches[lst.tenant] = Watch(lst.tenant, seq, n)
                w.add(lst)
            self._start()
            let_go()
            return w
        except BaseException:
            self.close(lst)
            raise

    def close(self, lst: Listener) -> None:
        """Unregister (idempotent) and free the listener's slots."""
        with self.lock:
            w = self.watches.get(lst.tenant)
            if w is not None and lst in w.listeners:
                w.remove(lst)
                if not w.listeners:
                    del self.watches[lst.tenant]
            slot, lst.slot = lst.slot, None
            if slot is not None:
                self._count(lst, -1)
        if slot is not None:
            try:
                self.slots.release(slot)
            except Exception:  # noqa: BLE001 - the row stops counting after STALE_MS anyway
                log.exception("could not release a stream slot")

    def shares(self) -> tuple[int, int]:
        """(streams one tenant, one key may hold in this worker): CONTEXT_STREAM_SHARE / _KEY_SHARE, by
        default half the worker's stream slots, at least 1. With no API keys there is one tenant and no key to
        leave room for: it may hold every slot (a keyless local start serves several agent sessions; issue 51)."""
        cfg = self.config
        if cfg.keyless:
            return cfg.stream_cap, cfg.stream_cap
        return shares(cfg.stream_cap, cfg.stream_share, cfg.stream_key_share)

    def streams(self, tenant: str) -> dict:
        """What /mcp/stats says of a tenant's live streams: open now over every worker (and node), the most it may
        hold over them (CONTEXT_MAX_LISTENERS_PER_TENANT), and one worker's stream slots and the tenant's share."""
        cfg = self.config
        return {"open": self.slots.count(tenant), "tenant_limit": cfg.max_listeners_per_tenant,
                "per_worker": cfg.stream_cap, "tenant_share_per_worker": self.shares()[0]}

    def _count(self, lst: Listener, step: int) -> None:
        """Count a listener in (+1) or out (-1) of this worker's totals (hub lock held)."""
        self.count += step
        for counts, name in ((self.by_tenant, lst.tenant), (self.by_key, lst.key_id)):
            counts[name] = counts.get(name, 0) + step
            if counts[name] <= 0:
                del counts[name]

    def cursor(self, tenant: str) -> int | None:
        with self.lock:
            w = self.watches.get(tenant)
            return w.seq if w is not None else None

    # --- the thread -----------------------------------------------------------------------------
    def _start(self) -> None:
        with self.lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="live-hub", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """End every stream (each sends its final message) and stop the thread."""
        self._stop.set()
        self._end_all("shutdown")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sources.close()

    def _end_all(self, reason: str) -> None:
        with self.lock:
            listeners = [lst for w in self.watches.values() for lst in w.listeners]
        for lst in listeners:
            lst.end(reason)

    def _run(self) -> None:
        interval = max(0.01, self.config.listen_poll_ms / 1000)
        everyone = time.monotonic()
        while not self._stop.is_set():
            changed = self.sources.wait(interval, self._stop)
            if self._stop.is_set():
                break
            if self.worker is not None and not self.worker.alive:
                self._end_all("shutdown")        # gunicorn is stopping this worker: end streams gracefully
                continue
            if changed is None or time.monotonic() - everyone >= max(FULL_LOOK_S, interval):
                changed, everyone = None, time.monotonic()   # expiries, slow searches, a lost wake-up
            with self.lock:
                watching = bool(self.watches)
                watches = [w for w in self.watches.values() if changed is None or w.tenant in changed]
            for w in watches:
                try:
                    self.tick(w)
                except Exception:  # noqa: BLE001 - keep feeding the others; the next tick retries
                    log.exception("live hub: tenant %s", w.tenant)
            if watching and time.monotonic() - self._touched > TOUCH_S:
                self._touched = time.monotonic()
                try:
                    self.slots.touch()
                except Exception:  # noqa: BLE001
                    log.exception("live hub: could not refresh stream slots")

    def tick(self, w: Watch) -> None:
        """One look at a tenant's feed, change log, search subscriptions and expiries."""
        name = w.tenant
        seq, n = self.sources.positions(name)
        if seq > w.seq:
            units, resolved = self.sources.feed(name, w.seq, FEED_LIMIT)
            with self.lock:
                self._units(w, units, resolved)
        if n > w.n:
            events = self.changes.since(name, w.n)
            with self.lock:
                self._changes(w, events)
        if w.candidates:
            self._searches(w)
        now = int(time.time())
        with self.lock:
            while w.heap and w.heap[0][0] <= now:
                when, cid = heapq.heappop(w.heap)
                if w.expiry.get(cid) == when:
                    del w.expiry[cid]
                    self._tell(w.by_cid.get(cid), UNITS_PREFIX + cid)

    # --- fan-out (hub lock held) -----------------------------------------------------------------
    @staticmethod
    def _tell(listeners, key: str, *, seq: int | None = None, n: int | None = None) -> None:
        """Notify each listener that opened before the change (its ``seq`` in the feed, or ``n`` in the log)."""
        for lst in list(listeners or ()):
            if (seq is None or seq > lst.since_seq) and (n is None or n > lst.since_n):
                lst.notify(key)

    def _units(self, w: Watch, units: list[FeedUnit], resolved: int) -> None:
        w.seq = max(w.seq, resolved)
        for lst in w.listeners:
            if lst.wants_units:
                lst.offer(units, resolved)
        if not units:
            return
        now = time.monotonic()
        for u in units:
            if u.cid in w.by_cid:
                self._tell(w.by_cid[u.cid], UNITS_PREFIX + u.cid, seq=u.seq)
                w.expire_at(u.cid, u.expires_at)
        self._tell([lst for lst in w.listeners if lst.wants_list], LIST, seq=units[-1].seq)
        for q, terms in w.terms.items():
            found = [(u.seq, u.cid, now) for u in units if terms & u.terms]
            if found:
                w.candidates.setdefault(q, []).extend(found)

    def _changes(self, w: Watch, events) -> None:
        for ev in events:
            n = ev["n"]
            w.n = max(w.n, n)
            uri = ev["uri"]
            self._tell(w.by_uri.get(uri), uri, n=n)
            if uri.startswith(UNITS_PREFIX):
                cid = uri[len(UNITS_PREFIX):]
                if cid in w.by_cid:
                    self._tell(w.by_cid[cid], uri, n=n)
                    if ev["kind"] == "changed":
                        w.expire_at(cid, self.sources.expiry(w.tenant, cid))
                if ev["kind"] == "deleted":
                    self._tell([lst for lst in w.listeners if lst.wants_list], LIST, n=n)
                for q, top in w.top.items():
                    if cid in top:
                        self._tell(w.by_query.get(q), _search_key(q), n=n)

    def _searches(self, w: Watch) -> None:
        """Search subscriptions with candidates: tell the listeners once a new unit is among the search's
        top k as a default search (what resources/read shows) returns it; drop a candidate once such a
        search is known to see it and it is not there; past SEARCH_WAIT_S tell them anyway (a bulk
        import can leave more units than read-your-writes reads: they wait for the read index)."""
        state = self._index_state(w.tenant)
        now = time.monotonic()
        with self.lock:
            work = {q: list(c) for q, c in w.candidates.items() if c}
        for q, cands in work.items():
            newest = max(c[2] for c in cands)
            if w.searched_state.get(q) == (state, newest) and now - min(c[2] for c in cands) < SEARCH_WAIT_S:
                continue                        # nothing new to learn until the read index moves
            top = self.top_cids(w.tenant, q)
            if top is None:
                continue                        # searches busy: next tick
            fire, keep = 0, []                  # fire: the newest seq that changes what the search shows
            for seq, cid, first in cands:
                if cid in top:
                    fire = max(fire, seq)
                elif not self._visible(state, seq):
                    if now - first > SEARCH_WAIT_S:
                        fire = max(fire, seq)
                    else:
                        keep.append((seq, cid, first))
            with self.lock:
                w.top[q] = top
                w.searched_state[q] = (state, newest)
                rest = w.candidates.get(q, [])[len(cands):]     # arrived while searching
                if q in w.terms:
                    w.candidates[q] = keep + rest
                if fire:
                    self._tell(w.by_query.get(q), _search_key(q), seq=fire)

    def top_cids(self, tenant: str, query: str) -> set[str] | None:
        """The CIDs a default search for ``query`` returns (as resources/read of its URI), None when busy."""
        try:
            found = self.store.search(tenant, parse_search({"query": query, "top_k": SEARCH_TOP_K}, self.config))
        except ApiError as e:
            if e.status in (429, 503):              # (busy: no slot, or past a share, for now)
                return None
            return set()
        return {r["cid"] for r in found["results"]}

    def _index_state(self, tenant: str):
        """What decides whether a default search sees a new unit: None when it surely does (it reads the
        primaries, or read-your-writes covers every unit the read index may lack), else the read index's
        (low-water mark, seq of its last pass, backlog then)."""
        state = self.store.read_index_state(tenant)
        if state is None:
            return None
        low = state.get("low", 0)
        cfg = self.config
        if cfg.read_your_writes_ms > 0 and self.store.max_seq(tenant) - low <= cfg.read_your_writes_max:
            return None                         # service/store/sqlite/search.py reads the units past the mark itself
        return low, state.get("seq", 0), state.get("backlog", 1)

    @staticmethod
    def _visible(state, seq: int) -> bool:
        """Whether a default search begun now sees the unit with this seq (indexed: it is in the feed)."""
        if state is None:
            return True
        low, index_seq, backlog = state
        return seq < low or (index_seq >= seq and backlog == 0)


def _search_key(query: str) -> str:
    return search_uri(query)
