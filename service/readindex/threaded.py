"""A default search's answer ranked with threads (service/ranking/threads.py) from one view of a read index,
merged with the units it lacks (read-your-writes' ``fresh``, scored exactly by the store).

The pool is tantivy's best POOL under the request's filters, cut where its score last changes (so two indexes
of the same units pool the same units, whatever their document order); its units' threads, places and links
are fast fields. Where no two candidates share a thread (a corpus of documents) the answer is ``searcher.best``'s
exact BM25 order, from the same tantivy read. Otherwise the neighbours of the pool's best are read by their
thread key, the candidates with the best combined estimate (CONTENDERS × k) get their exact BM25 from their
stored tokens, and the answer is their combined score, ties by CID.
"""
from __future__ import annotations

from tantivy import Query

from ..ranking.bm25 import length_norm
from ..ranking.scoring import Ranked
from ..ranking.threads import CONTENDERS, POOL, Candidate, Evidence, has_threads, settle_heads
from . import searcher as index
from .reader import Hit, View
from .schema import thread_key, unit_of

FIELDS = ("cidn", "thread", "tpos", "lin")


def best(view: View, p, terms: list[str], weights: list[float], now: int, gone,
         fresh: list[Ranked] = ()) -> list[Ranked]:
    """The answer's best k: ``fresh`` (the units the index lacks, exact) and the index's, thread-aware."""
    k = p.top_k
    want = max(POOL, index.RESCORE_FACTOR * k)
    hits = index.search(view, p, terms, now, want=want)
    if not hits and not fresh:
        return []
    # (the tied group at the cut, whose members depend on document order, left out; unless it is all)
    pool_hits = [h for h in hits if h.score > hits[-1].score] if len(hits) == want else hits
    pool_hits = pool_hits or hits
    fresher = {r.unit["cid"] for r in fresh}
    pool = [c for c in candidates(view, pool_hits) if c.cid not in fresher] + [from_ranked(r) for r in fresh]
    if not has_threads(pool):
        return list(fresh) + index.best(view, p, terms, weights, now,
                                        lambda cids: gone(cids) | fresher.intersection(cids), first=hits)
    ev = Evidence(pool)
    if p.operator != "and":
        pulled = [c for c in neighbours(view, p, now, ev.missing_neighbours(pool)) if c.cid not in fresher]
        ev.add(pulled)
        pool += pulled
    pool.sort(key=lambda c: (-ev.estimate(c), c.cid))
    contenders = pool[:CONTENDERS * k]
    drop = gone([c.cid for c in contenders if c.key is not None])
    contenders = [c for c in contenders if c.cid not in drop]
    ranked = exact(view, terms, weights, contenders, hits[0] if hits else None)
    top = max((r.score for r in ranked), default=0.0) or 1.0
    scored = settle_heads([(ev.combine(c, r.score / top), c) for c, r in zip(contenders, ranked)], ev)
    for (value, c), r in zip(scored, ranked):
        r.combined, r.parts, r.tpos = value, c.parts, c.tpos
    ranked.sort(key=lambda r: r.order)
    return ranked[:k]


def candidates(view: View, hits: list[Hit]) -> list[Candidate]:
    """The pool's units: thread, place and link read from fast fields, in one call per field."""
    if not hits:
        return []
    addresses = [h.address for h in hits]
    cidn, thread, tpos, lin = (view.searcher.fast_field_values(name, addresses) for name in FIELDS)
    return [Candidate(f"{c:012x}", f"{t:012x}", pos, bool(link), h.score, h)
            for h, c, t, pos, link in zip(hits, cidn, thread, tpos, lin)]


def from_ranked(r: Ranked) -> Candidate:
    """A unit the index lacks, scored exactly from its tokens, as a candidate (its own handle)."""
    u = r.unit
    return Candidate(u["cid"], u["thread"], r.tpos, bool(u["parent_cid"]), r.score, None, r)


def neighbours(view: View, p, now: int, places: list[tuple[str, int]]) -> list[Candidate]:
    """The live units at these places (thread, tpos) that pass the request's filters."""
    if not places:
        return []
    query = Query.term_set_query(view.schema, "tkey", [thread_key(t, pos) for t, pos in places])
    found = index.live_best(view, query, p, now, len(places))
    for c in (out := candidates(view, found)):
        c.pool = 0.0
    return out


def exact(view: View, terms: list[str], weights: list[float], contenders: list[Candidate], any_hit) -> list[Ranked]:
    """Each contender with its exact BM25 and stored fields (units the index lacks already have theirs)."""
    searcher = view.searcher
    from_index = [c for c in contenders if c.key is not None]
    lengths = dict(zip((id(c) for c in from_index),
                       searcher.fast_field_values("len", [c.key.address for c in from_index]) if from_index else []))
    avgdl = index.average_length(view, terms, any_hit) if any_hit is not None else index.mean_length(view, terms)
    scoring = index.scoring_terms(terms, weights)
    out = []
    for c in contenders:
        if c.key is None:
            out.append(c.ranked)
            continue
        n = lengths[id(c)]
        x = index.score_exactly(searcher, c.key, n, length_norm(n, avgdl), scoring, len(terms))
        out.append(Ranked(unit_of(x.doc), x.score, x.length, x.tfs))
    return out
