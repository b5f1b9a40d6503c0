"""A default search's answer ranked with threads (service/ranking/threads.py) from one view of a read index,
merged with the units it lacks (read-your-writes' ``fresh``, scored exactly by the store).

The pool is tantivy's best POOL under the request's filters, cut where its score last changes (so two indexes
of the same units pool the same units, whatever their document order); its units' threads, places and how each
joined are fast fields. Where no two candidates share a thread and none has a neighbor to read (a corpus of
documents) the answer is ``searcher.best``'s exact BM25 order, from the same tantivy read. Otherwise the
neighbors of the pool's best are read by their thread key, the k + EXTRA candidates with the best combined
estimate get their exact BM25 from their stored tokens, and the answer is their combined score, ties by CID.
"""
from __future__ import annotations

import json

from tantivy import Occur, Query

from ..ranking.bm25 import length_norm
from ..ranking.scoring import Ranked
from ..ranking.threads import EXTRA, POOL, Candidate, Evidence, has_threads, pullable, settle_heads
from . import searcher as index
from .reader import Hit, View
from .schema import thread_key
from ..unitkeys import joined_by

FIELDS = ("cidn", "thread", "place")
VIEW_CACHE = 50_000           # documents (and places) whose fields a view keeps


def best(view: View, p, terms: list[str], weights: list[float], now: int, gone,
         fresh: list[Ranked] = ()) -> list[Ranked]:
    """The answer's best k: ``fresh`` (the units the index lacks, exact) and the index's, thread-aware."""
    k = p.top_k
    want = max(POOL, index.RESCORE_FACTOR * k)
    hits = index.search(view, p, terms, now, want=want)
    fresher = {r.cid for r in fresh}

    def leave(cids):
        return gone(cids) | fresher.intersection(cids)
    # the pool: tantivy's best, less the tied group at its cut (its members depend on document order)
    cut = [h for h in hits if h.score > hits[-1].score] if len(hits) == want else hits
    pool = [c for c in candidates(view, cut) if c.cid not in fresher] + [from_ranked(r) for r in fresh]
    ev = Evidence(pool)
    pulled = _pulled(view, p, now, ev, fresher)
    if not pulled and not has_threads(pool):
        return list(fresh) + index.best(view, p, terms, weights, now, leave, first=hits)
    ev.add(pulled)
    chosen = ev.contenders(pool + pulled, k + EXTRA)
    # units deleted or expired since the index got them neither answer nor lend evidence
    drop = gone([c.cid for c in chosen if c.ranked is None] + sorted(ev.sources(chosen) - fresher))
    if drop:
        pool = [c for c in pool if c.cid not in drop]
        ev = Evidence(pool)
        pulled = _pulled(view, p, now, ev, fresher | drop)
        pulled = [c for c in pulled if c.cid not in gone([c.cid for c in pulled])]
        ev.add(pulled)
        chosen = ev.contenders(pool + pulled, k + EXTRA)
    if len(cut) < k:
        # BM25's exact best k join them: the tied group the pool's cut left out may hold some
        by_cid = {c.cid: c for c in chosen}
        for r in index.best(view, p, terms, weights, now, leave, first=hits):
            c = by_cid.get(r.cid) or from_ranked(r, pooled=False)
            c.ranked = r
            by_cid[c.cid] = c
        chosen = list(by_cid.values())
    return _rank(view, terms, weights, k, ev, chosen, hits[0] if hits else None)


def _pulled(view: View, p, now: int, ev: Evidence, leave: set[str]) -> list[Candidate]:
    """The neighbors of the pool's best that a client put in their threads (none for AND: they would not
    hold every term)."""
    if p.operator == "and":
        return []
    return [c for c in neighbors(view, p, now, ev.missing_neighbors()) if c.cid not in leave and pullable(c)]


def _rank(view: View, terms: list[str], weights: list[float], k: int, ev: Evidence, chosen: list[Candidate],
          any_hit) -> list[Ranked]:
    """The best k of ``chosen`` by combined score, each with its exact BM25 (the stored fields of those answered
    decoded only)."""
    scores = exact(view, terms, weights, chosen, any_hit)
    top = max((x.score for x in scores), default=0.0) or 1.0
    scored = settle_heads([(ev.combine(c, x.score / top), c) for c, x in zip(chosen, scores)], ev)
    order = sorted(range(len(chosen)), key=lambda i: (-scored[i][0], chosen[i].cid))[:k]
    out = []
    for i in order:
        value, c = scored[i]
        x = scores[i]
        r = c.ranked if c.ranked is not None else Ranked(None, x.score, x.length, x.tfs,
                                                         load=index.loader(view.searcher, x), known_cid=c.cid)
        r.combined, r.parts, r.tpos = value, c.parts, c.tpos
        out.append(r)
    return out


def candidates(view: View, hits: list[Hit]) -> list[Candidate]:
    """The pool's units: CID, thread, place and how each joined, read from fast fields (one call per field for
    the documents this view has not met yet: a view is one commit, and searches meet the same units again)."""
    if not hits:
        return []
    known = _bounded(view, "fields")
    new = [h.address for h in hits if (h.address.segment_ord, h.address.doc) not in known]
    if new:
        for a, *values in zip(new, *(view.searcher.fast_field_values(name, new) for name in FIELDS)):
            known[(a.segment_ord, a.doc)] = values
    out = []
    for h in hits:
        c, t, pos = known[(h.address.segment_ord, h.address.doc)]
        out.append(Candidate(f"{c:012x}", f"{t:012x}", pos >> 2, pos & 3, h.score, h))
    return out


def _bounded(view: View, name: str) -> dict:
    """A per-view cache (a view lives until the next commit), emptied past VIEW_CACHE entries."""
    cache = view.cache.get(name)
    if cache is None or len(cache) > VIEW_CACHE:
        cache = view.cache[name] = {}
    return cache


def from_ranked(r: Ranked, pooled: bool = True) -> Candidate:
    """A unit already scored exactly (one the index lacks, or among BM25's best k) as a candidate; in the pool's
    evidence with that score, or with none (``pooled`` False: past the pool's cut)."""
    u = r.fields()
    meta = json.dumps(u["metadata"]) if u["metadata"] else None
    return Candidate(u["cid"], u["thread"], r.tpos, joined_by(u["parent_cid"], meta), r.score if pooled else 0.0,
                     None, r)


def neighbors(view: View, p, now: int, places: list[tuple[str, int]]) -> list[Candidate]:
    """The live units at these places (thread, tpos) that pass the request's filters. Without filters, what
    each place holds is kept per view (its document and expiry): searches ask for the same places again."""
    if not places:
        return []
    keys = [thread_key(t, pos) for t, pos in places]
    if p.types or (p.source and p.source != "*") or p.since is not None or p.until is not None or p.parent_cid \
            or p.project is not None:
        found = index.live_best(view, _places_query(view, keys), p, now, len(keys))
    else:
        known = _bounded(view, "places")
        missing = [k for k in keys if k not in known]
        if missing:
            hits = [Hit(0.0, a) for _, a in view.searcher.search(_places_query(view, missing), len(missing),
                                                                  count=False).hits]
            expiry = view.searcher.fast_field_values("exp", [h.address for h in hits])
            for k in missing:
                known[k] = None
            for c, exp in zip(candidates(view, hits), expiry):
                known[thread_key(c.thread, c.tpos)] = (c.key, exp)
        found = [e[0] for e in (known[k] for k in keys) if e is not None and e[1] is not None and e[1] > now]
    for c in (out := candidates(view, found)):
        c.pool = 0.0
    return out


def _places_query(view: View, keys: list[str]):
    # (a disjunction of term lookups: a term set query walks the whole term dictionary, 4x the cost here)
    return Query.boolean_query([(Occur.Should, Query.term_query(view.schema, "tkey", k)) for k in keys])


def exact(view: View, terms: list[str], weights: list[float], contenders: list[Candidate], any_hit) -> list:
    """Each contender's exact BM25 (``score``, and its stored document: ``searcher.Scored``; the Ranked of a
    unit already scored exactly)."""
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
        out.append(index.score_exactly(searcher, c.key, n, length_norm(n, avgdl), scoring, len(terms), view.schema))
    return out
