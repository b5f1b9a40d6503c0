"""Search (docs/design.md §4, §6): query tokens, global BM25 over the live days.

Two paths, one ranking. Default searches read the tenant's read index (service/readindex/): one
tantivy index over every live day, so BM25's statistics are global by construction and the top k
comes from compiled block-max WAND, whatever the number of days or matches; the units it may lack
yet are read from the primaries (read-your-writes, service/store/sqlite/tail.py). Strong and ``after_seq`` reads,
and any tenant whose read index is not built yet, read the primary day shards' FTS5 tables: per
shard the matches scored with the global statistics (all of them when few, else a generous local
top-N by FTS5's own rank), merged (service/store/sqlite/fts.py). Both use FTS5's BM25 formula with Lucene's
always-positive idf and exact document lengths (the read index's candidates are scored again with
them: tantivy keeps a length in one byte). The winners' 0-1 score, explain and snippets:
service/ranking/.

Read top-down: ``Searcher.search`` picks the path, ``_search_index`` / ``_search_shards`` rank,
``_results`` shapes the answer.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from ...readindex import searcher as index, threaded
from ...readindex.reader import Readers
from ...params import SearchParams
from ...ranking.bm25 import K1, B, Bm25, idf_of, unknown_idf
from ...ranking.results import MAX_QUERY_TERMS, shape_results
from ...ranking.scoring import Ranked, Stats
from ...ranking.rank import rank
from ...ranking.tail import TokenCache, Unseen
from ...ranking.threads import Naming
from ...units import day_of
from . import fts, readsync
from .engine import Engine
from .fts import CpuBudget
from .indexer import catch_up
from .queries import fetch_all, fetch_one
from .tail import Tail, TailReader



EXPIRY_CACHE = 200_000          # catalog expiries a process keeps per tenant between catalog commits


class Searcher:
    def __init__(self, config, tokenizer, readers: Readers):
        self.config = config
        self.tokenizer = tokenizer
        self.readers = readers
        self.tokens = TokenCache()
        self.tail = TailReader(config, tokenizer, self.tokens)
        self.naming = Naming(tokenizer)
        self._live_days: dict[str, tuple[float, list[str]]] = {}
        self._expiry: dict[str, tuple[int, dict]] = {}     # tenant -> (catalog version, cid -> expiry)
        self.pool = ThreadPoolExecutor(max(1, self.config.search_threads), thread_name_prefix="search")

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def forget(self, tenant: str) -> None:
        """Drop what this process remembers of a tenant it closes (the store's ``closers``, issue 49)."""
        self._live_days.pop(tenant, None)
        self._expiry.pop(tenant, None)
        self.tail.forget(tenant)

    def view(self, t):
        """The tenant's read index for default searches, or None (not built yet, or turned off)."""
        if not self.config.replicas:
            return None
        return self.readers.view(t.name)

    # --- search -------------------------------------------------------------------------------
    def search(self, t, p: SearchParams) -> dict:
        start = time.perf_counter()
        now = int(time.time())
        first = day_of(p.since) if p.since is not None else "0000-00-00"
        last = day_of(p.until) if p.until is not None else "9999-99-99"
        view = tail = None
        if not p.strong:
            # the leader's state before the view: a view loaded after it holds every unit below its mark
            state = self.readers.state(t.name)
            view = self.view(t)
            if view is not None:
                tail = self.tail.tail(t, state, first, last)
        days = self._days(t, first, last, fresh=view is None)
        terms = self.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS]
        if p.strong:
            catch_up(t, days, self.tokenizer, self.config.index_batch, self.config.strong_wait_ms)
        results: list[dict] = []
        unseen = None
        if terms and (days or (tail and tail.days)):
            budget = CpuBudget(self.config.search_cpu_ms)
            found = self._search_index(t, p, terms, view, now, tail, budget) if view is not None else None
            if found is not None:
                ranked, stats, unseen = found
            else:
                if view is not None:    # a commit it could not load: the primaries answer instead
                    days, view, tail = self._days(t, first, last, fresh=True), None, None
                # read-your-writes on the primaries too (no read index yet): pending units by their tokens
                unseen = Unseen() if not p.strong and self.config.read_your_writes_ms > 0 else None
                ranked, stats = self._search_shards(t, p, terms, days, now, budget, unseen)
            results = self._results(p, terms, ranked, stats)
        if unseen is not None:
            pending, replica_lag = unseen.report()
        elif tail is not None:
            pending, replica_lag = self.tail.freshness(t, tail)
        else:
            pending, replica_lag = self.freshness(t, days, view)
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": len(set(days) | set(tail.days if tail else ())),
                "freshness": {"replica_lag_ms": replica_lag, "index_pending": pending}}

    def _days(self, t, first: str, last: str, fresh: bool) -> list[str]:
        """The live days in [first, last]. Searches of the read index only report how many (its
        filters do the rest), so they share one catalog read per tenant and second."""
        if fresh:
            return t.live_days(first, last)
        now = time.monotonic()
        cached = self._live_days.get(t.name)
        if cached is None or now - cached[0] > 1.0:
            cached = self._live_days[t.name] = (now, t.live_days())
        return [d for d in cached[1] if first <= d <= last]

    def freshness(self, t, days: list[str], view=None, exact: bool = False) -> tuple[int, int]:
        """(units a search of this kind cannot see yet, ms the oldest of them has waited).

        With the read index: what the leader's last pass left for the next one (every worker reads
        it from one small file), or counted now in every shard when ``exact`` (readiness, metrics).
        On the primaries: rows still pending in these shards.
        """
        if view is not None:
            if exact:
                backlog, oldest, _ = readsync.backlog(t)
            else:
                state = self.readers.state(t.name) or {}
                backlog, oldest = state.get("backlog", 0), state.get("oldest_ms")
                # plus what arrived after that pass began (a range of the catalog's primary key)
                since, first = t.catalog.read(fetch_one, "catalog_since_seq", {"seq": state.get("seq", 0)})
                backlog += since
                if first is not None:
                    oldest = min(oldest or first, first)
            return backlog, max(0, int(time.time() * 1000 - oldest)) if oldest else 0
        pending = 0
        for day in days:
            db = t.shard(day, create=False)
            if db is not None:
                pending += db.read(fetch_one, "pending_count")[0]
        return pending, 0

    # --- the read index (default searches) ------------------------------------------------------
    def _search_index(self, t, p: SearchParams, terms: list[str], view, now: int, tail: Tail | None,
                      budget: CpuBudget) -> tuple[list[Ranked], Stats, Unseen | None] | None:
        """The read index's candidates (tantivy), scored again with exact lengths, merged with the
        units it lacks (``tail``, read from the primaries); the top k with the units' fields. None
        when a commit made while the tail was read cannot be loaded."""
        for _ in range(3):
            # a term only the tail holds weighs what it would in one unit
            unknown = unknown_idf(view.ndocs) if tail is not None else 0.0
            idf = [view.idf(term) or unknown for term in terms]
            bm25 = Bm25.of(idf, index.mean_length(view, terms))
            unseen = Unseen()
            fresh = self.tail.top(t, p, terms, bm25, tail, now, budget, unseen) if tail else []
            # A pass that committed while the tail was read may have flagged rows sent that this view
            # lacks: read both again against the new commit (the primaries answer if it cannot be loaded).
            if tail is None or not self.readers.moved(t.name, view):
                break
            newer = self.view(t)
            if newer is None or newer is view:
                return None
            view = newer
        ranked = list(fresh)
        if all(idf) or p.operator == "or":
            ranked = threaded.best(view, p, terms, bm25.weights, now, lambda cids: self._gone(t, cids, now),
                                   self.naming, fresh)
        stats = Stats(idf, K1, B, index.mean_length(view, terms), view.ndocs)
        return ranked, stats, (unseen if tail is not None else None)

    def _gone(self, t, cids: list[str], now: int) -> set[str]:
        """Of these CIDs, the ones deleted or expired (by a push that changed their ttl) since the read
        index got them: they leave search at once, not at its next pass. Their catalog expiries are kept per
        tenant until the catalog next commits (``catalog_version``: every delete, forget and re-push is a commit
        there), so a search that meets units already looked up reads nothing."""
        if not cids:
            return set()
        sig = t.catalog_version()
        cached = self._expiry.get(t.name)
        if cached is None or cached[0] != sig or len(cached[1]) > EXPIRY_CACHE:
            cached = self._expiry[t.name] = (sig, {})
        known = cached[1]
        missing = [cid for cid in cids if cid not in known]
        if missing:
            rows = t.catalog.read(fetch_all, "ryw_expiry", {"cids": json.dumps(missing)})
            known.update((r["cid"], r["expires_at"]) for r in rows)
        return {cid for cid in cids if known.get(cid) is None or known[cid] <= now}

    # --- the primary files (strong reads; no read index yet) -------------------------------------
    def _search_shards(self, t, p: SearchParams, terms: list[str], days: list[str], now: int, budget: CpuBudget,
                       unseen: Unseen | None = None) -> tuple[list[Ranked], Stats | None]:
        """FTS5 over the primaries: global statistics summed over the shards, then the answer ranked as every
        path ranks it (service/ranking/rank.py) from the shards' best units under them (service/store/sqlite/
        engine.py); with ``unseen`` (read-your-writes) also the units still waiting for the indexer."""
        per_day = {}
        for day in days:
            db = t.shard(day, create=False)
            if db is not None:
                per_day[day] = (db, db.read(fts.shard_stats, terms))
        n = sum(st["ndocs"] for _, st in per_day.values())
        if n <= 0 and unseen is None:
            return [], None
        # a term no indexed unit holds weighs what it would in one (a pending unit may hold it)
        unknown = unknown_idf(n) if unseen is not None else 0.0
        idf = [idf_of(n, sum(st["df"][term] for _, st in per_day.values())) or unknown for term in terms]
        live = [term for term, w in zip(terms, idf) if w]
        if not live or (p.operator == "and" and len(live) < len(terms)):
            return [], None
        avgdl = sum(st["ntokens"] for _, st in per_day.values()) / n if n else 0.0
        bm25 = Bm25.of(idf, avgdl)
        engine = Engine(self, t, p, terms, per_day, live, bm25, now, budget, unseen)
        return rank(engine, p.top_k, self.naming, terms, p.operator), Stats(idf, K1, B, avgdl, n)

    def _map(self, fn, items):
        """fn over shards on the search pool (SQLite runs FTS5 ranking without the GIL)."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.pool.map(fn, items))

    # --- the answer ---------------------------------------------------------------------------
    def _results(self, p: SearchParams, terms: list[str], ranked: list[Ranked], stats: Stats | None) -> list[dict]:
        return shape_results(p, terms, ranked, stats, self.tokenizer)
