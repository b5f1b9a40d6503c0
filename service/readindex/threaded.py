"""A default search's answer ranked with threads (service/ranking/threads.py) from one view of a read index,
merged with the units it lacks (read-your-writes' ``fresh``, scored exactly by the store).

The pool is tantivy's best POOL under the request's filters, cut where its score last changes (so two indexes
of the same units pool the same units, whatever their document order); its units' threads, places and links
are fast fields. Where no two candidates share a thread (a corpus of documents) the answer is ``searcher.best``'s
exact BM25 order, from the same tantivy read. Otherwise the neighbors of the pool's best are read by their
thread key, the candidates with the best combined estimate (CONTENDERS × k) get their exact BM25 from their
stored tokens, and the answer is their combined score, ties by CID.
"""
from __future__ import annotations

import json

from tantivy import Query

from ..ranking.bm25 import length_norm
from ..ranking.scoring import Ranked
from ..ranking.threads import CONTENDERS, POOL, Candidate, Evidence, has_threads, pullable, settle_heads
from . import searcher as index
from .reader import Hit, View
from .schema import thread_key, unit_of
from ..units import joined_by

FIELDS = ("cidn", "thread", "tpos", "joined")


def best(view: View, p, terms: list[str], weights: list[float], now: int, gone,
         fresh: list[Ranked] = ()) -> list[Ranked]:
    """The answer's best k: ``fresh`` (the units the index lacks, exact) and the index's, thread-aware."""
    want = max(POOL, index.RESCORE_FACTOR * p.top_k)
    hits = index.search(view, p, terms, now, want=want)
    fresher = {r.unit["cid"] for r in fresh}
    plain = index.best(view, p, terms, weights, now, lambda cids: gone(cids) | fresher.intersection(cids),
                       first=hits)
    # the pool: tantivy's best, less the tied group at the cut (its members depend on document order)
    pooled = {id(h) for h in ([h for h in hits if h.score > hits[-1].score] if len(hits) == want else hits)}
    pool = [c for c in candidates(view, hits) if c.cid not in fresher and id(c.key) in pooled]
    pool += [from_ranked(r) for r in fresh]
    pulled = _pulled(view, p, now, pool, fresher)
    if not pulled and not has_threads(pool):
        return list(fresh) + plain             # BM25 alone: the exact order, as without threads
    # units deleted or expired since the index got them lend no evidence (nor bring in their neighbors)
    drop = gone([c.cid for c in pool + pulled if c.ranked is None])
    if drop:
        pool = [c for c in pool if c.cid not in drop]
        pulled = [c for c in _pulled(view, p, now, pool, fresher | drop)]
        pulled = [c for c in pulled if c.cid not in gone([c.cid for c in pulled])]
    return _rank(view, terms, weights, p.top_k, pool, pulled, plain, hits[0] if hits else None)


def _pulled(view: View, p, now: int, pool: list[Candidate], leave: set[str]) -> list[Candidate]:
    """The neighbors of the pool's best that a client put in their threads (none for AND: they would not
    hold every term)."""
    if p.operator == "and":
        return []
    found = neighbors(view, p, now, Evidence(pool).missing_neighbors(pool))
    return [c for c in found if c.cid not in leave and pullable(c)]


def _rank(view: View, terms: list[str], weights: list[float], k: int, pool: list[Candidate],
          pulled: list[Candidate], plain: list[Ranked], any_hit) -> list[Ranked]:
    """The best k by combined score of the best estimates and BM25's exact best k (``plain``: whatever ties
    the pool's cut left out), each with its exact BM25."""
    ev = Evidence(pool)
    ev.add(pulled)
    ranking = sorted(pool + pulled, key=lambda c: (-ev.estimate(c), c.cid))
    contenders = {c.cid: c for c in ranking[:CONTENDERS * k]}
    by_cid = {c.cid: c for c in ranking}
    for r in plain:
        c = by_cid.get(r.unit["cid"]) or from_ranked(r, pooled=False)
        c.ranked = r
        contenders[c.cid] = c
    chosen = list(contenders.values())
    ranked = exact(view, terms, weights, chosen, any_hit)
    top = max((r.score for r in ranked), default=0.0) or 1.0
    scored = settle_heads([(ev.combine(c, r.score / top), c) for c, r in zip(chosen, ranked)], ev)
    for (value, c), r in zip(scored, ranked):
        r.combined, r.parts, r.tpos = value, c.parts, c.tpos
    ranked.sort(key=lambda r: r.order)
    return ranked[:k]


def candidates(view: View, hits: list[Hit]) -> list[Candidate]:
    """The pool's units: thread, place and link read from fast fields, in one call per field."""
    if not hits:
        return []
    addresses = [h.address for h in hits]
    cidn, thread, tpos, joined = (view.searcher.fast_field_values(name, addresses) for name in FIELDS)
    return [Candidate(f"{c:012x}", f"{t:012x}", pos, how, h.score, h)
            for h, c, t, pos, how in zip(hits, cidn, thread, tpos, joined)]


def from_ranked(r: Ranked, pooled: bool = True) -> Candidate:
    """A unit already scored exactly (one the index lacks, or among BM25's best k) as a candidate; in the pool's
    evidence with that score, or with none (``pooled`` False: past the pool's cut)."""
    u = r.unit
    meta = json.dumps(u["metadata"]) if u["metadata"] else None
    return Candidate(u["cid"], u["thread"], r.tpos, joined_by(u["parent_cid"], meta), r.score if pooled else 0.0,
                     None, r)


def neighbors(view: View, p, now: int, places: list[tuple[str, int]]) -> list[Candidate]:
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
    from_index = [c for c in contenders if c.ranked is None]
    lengths = dict(zip((id(c) for c in from_index),
                       searcher.fast_field_values("len", [c.key.address for c in from_index]) if from_index else []))
    avgdl = index.average_length(view, terms, any_hit) if any_hit is not None else index.mean_length(view, terms)
    scoring = index.scoring_terms(terms, weights)
    out = []
    for c in contenders:
        if c.ranked is not None:
            out.append(c.ranked)
            continue
        n = lengths[id(c)]
        x = index.score_exactly(searcher, c.key, n, length_norm(n, avgdl), scoring, len(terms))
        out.append(Ranked(unit_of(x.doc), x.score, x.length, x.tfs))
    return out
