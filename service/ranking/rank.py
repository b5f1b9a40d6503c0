"""The one ranking of a search (docs/design.md §6): whichever engine found the pool, the answer is ranked here,
with threads where the candidates have them (service/ranking/threads.py) and by BM25 alone where they have none.

An engine is what one path reads from (the read index, SQLite's day files, PostgreSQL's tables); it supplies
what only it knows, through ``Engine``: its best matches under the request's filters, the live units at places
of a thread, exact BM25, and which of its units are gone since it got them. This module decides everything
else, the same way for every path and store:

1. the pool: the engine's best ``max(POOL, 2k)`` matches, less the tied group at its cut (whose members depend
   on the engine's document order), plus the units read-your-writes found the engine lacks (``fresh``);
2. with no thread among them (a corpus of documents), BM25's own best k: the answer as before threads;
3. else the neighbors of the pool's best join as candidates, the k + EXTRA best by the combined estimate are
   scored exactly, and the answer is their combined score, ties by CID; units gone since the engine got them
   neither answer nor lend evidence.
"""
from __future__ import annotations

import json
from typing import Callable, Protocol, Sequence

from ..unitkeys import joined_by
from .scoring import Ranked
from .threads import EXTRA, POOL, Candidate, Evidence, Naming, asks, has_threads, pullable, settle_heads


class Engine(Protocol):
    """What a path supplies to the ranking (service/readindex/threaded.py, service/store/sqlite/engine.py,
    service/store/postgresql/engine.py)."""

    def pool(self, want: int) -> list[Candidate]:
        """The engine's best ``want`` live units for the query under the request's filters, best first (ties by
        CID where its scores are exact), each with its pool score and its place in its thread."""

    def places(self, places: list[tuple[str, int]]) -> list[Candidate]:
        """The live units at these (thread, place) that pass the request's filters (pool score 0)."""

    def exact(self, chosen: list[Candidate]) -> list[Ranked]:
        """Each candidate's exact BM25, with its fields or what loads them (``c.ranked`` where known)."""

    def gone(self, cids: list[str]) -> set[str]:
        """Of these CIDs, those deleted or expired since the engine got them."""

    def bm25_best(self, k: int, leave, pool: list[Candidate]) -> list[Ranked]:
        """BM25's own best k, ties by CID, leaving out what ``leave(cids)`` names (``pool``: the engine's best
        already read, for its first round)."""

    def candidate(self, r: Ranked, pooled: bool) -> Candidate:
        """A unit already scored exactly as a candidate (in the pool with its score, or with none)."""


def rank(engine: Engine, k: int, naming: Naming, terms: list[str], operator: str = "or",
         fresh: Sequence[Ranked] | Callable[[], list[Ranked]] = ()) -> list[Ranked]:
    """The answer's best k: ``fresh`` (units the engine lacks, exact) and the engine's. ``fresh`` may be a
    function giving them, called once the engine's pool is read: a PostgreSQL node's tail, whose statement its
    server answers while the pool's query runs (service/store/postgresql/search.py)."""
    query = frozenset(terms)
    want = max(POOL, 2 * k)
    hits = engine.pool(want)
    if callable(fresh):
        fresh = fresh()
    fresher = {r.cid for r in fresh}

    def leave(cids):
        return engine.gone(cids) | fresher.intersection(cids)
    # the pool: the engine's best, less the tied group at its cut (its members depend on document order)
    cut = [c for c in hits if c.pool > hits[-1].pool] if len(hits) == want else hits
    pool = [c for c in cut if c.cid not in fresher] + [engine.candidate(r, True) for r in fresh]
    ev = Evidence(pool)
    pulled = _pulled(engine, operator, ev, fresher)
    if not pulled and not has_threads(pool):
        return sorted(list(fresh) + engine.bm25_best(k, leave, hits), key=lambda r: r.order)[:k]
    ev.add(pulled)
    naming.mark(pool + pulled, query)
    chosen = ev.contenders(pool + pulled, k + EXTRA)
    # units deleted or expired since the engine got them neither answer nor lend evidence
    drop = engine.gone([c.cid for c in chosen if c.ranked is None] + sorted(ev.sources(chosen) - fresher))
    if drop:
        pool = [c for c in pool if c.cid not in drop]
        ev = Evidence(pool)
        pulled = _pulled(engine, operator, ev, fresher | drop)
        pulled = [c for c in pulled if c.cid not in engine.gone([c.cid for c in pulled])]
        ev.add(pulled)
        naming.mark(pool + pulled, query)
        chosen = ev.contenders(pool + pulled, k + EXTRA)
    if len(cut) < k:
        # BM25's exact best k join them: the tied group the pool's cut left out may hold some
        by_cid = {c.cid: c for c in chosen}
        for r in engine.bm25_best(k, leave, hits):
            c = by_cid.get(r.cid) or engine.candidate(r, False)
            c.ranked = r
            by_cid[c.cid] = c
        chosen = list(by_cid.values())
        naming.mark(chosen + pool + pulled, query)
    return _combined(engine, k, ev, chosen)


def _pulled(engine: Engine, operator: str, ev: Evidence, leave: set[str]) -> list[Candidate]:
    """The neighbors of the pool's best that a client put in their threads (none for AND: they would not
    hold every term)."""
    if operator == "and":
        return []
    return [c for c in engine.places(ev.missing_neighbors()) if c.cid not in leave and pullable(c)]


def _combined(engine: Engine, k: int, ev: Evidence, chosen: list[Candidate]) -> list[Ranked]:
    """The best k of ``chosen`` by combined score, each with its exact BM25."""
    scores = engine.exact(chosen)
    top = max((x.score for x in scores), default=0.0) or 1.0
    scored = settle_heads([(ev.combine(c, x.score / top), c) for c, x in zip(chosen, scores)], ev)
    order = sorted(range(len(chosen)), key=lambda i: (-scored[i][0], chosen[i].cid))[:k]
    out = []
    for i in order:
        value, c = scored[i]
        r = scores[i]
        r.combined, r.parts, r.tpos = value, c.parts, c.tpos
        out.append(r)
    return out


def unit_candidate(u: dict, r: Ranked | None, pool: float) -> Candidate:
    """A candidate from a unit's public fields (``u``: a result dict), for every path that reads them: its
    thread, place and how it joined, length, whether it asks and its source."""
    meta = u["metadata"]
    meta = json.dumps(meta) if isinstance(meta, dict) else meta
    return Candidate(u["cid"], u["thread"] or u["cid"], r.tpos if r is not None else 0,
                     joined_by(u["parent_cid"], meta), pool, None, r, None,
                     r.doc_len if r is not None else 0, asks(u["content"]), u["source"])
