"""The read index's side of the ranking (service/ranking/rank.py): one view's pool, neighbors and exact BM25,
merged with the units it lacks (read-your-writes' ``fresh``, scored exactly by the store).

The pool is tantivy's best under the request's filters; its units' CIDs, threads, places (with how each joined
and whether it asks), lengths and sources are fast fields, so the evidence costs no stored read. Neighbors are
read by their thread key; the contenders' exact BM25 comes from their stored tokens (service/readindex/
searcher.py), and BM25's own best k (a corpus without threads) is ``searcher.best``'s.
"""
from __future__ import annotations

from typing import Callable, Literal, Sequence

from tantivy import Occur, Query

from ..ranking import rank as ranking
from ..ranking.bm25 import length_norm
from ..ranking.scoring import Ranked
from ..ranking.threads import Candidate
from . import searcher as index
from .reader import Hit, View
from .schema import place_fields, source_hash, thread_key

FIELDS = ("cidn", "thread", "place", "len", "srch")
VIEW_CACHE = 50_000           # documents (and places) whose fields a view keeps


def best(view: View, p, terms: list[str], weights: list[float], now: int, gone, naming,
         fresh: Sequence[Ranked] | Callable[[], list[Ranked]] = ()) -> list[Ranked]:
    """The answer's best k: ``fresh`` (the units the index lacks, exact) and the index's, ranked as every path
    ranks (service/ranking/rank.py)."""
    return ranking.rank(Engine(view, p, terms, weights, now, gone), p.top_k, naming, terms, p.operator, fresh)


class Engine:
    """One search of one view (``ranking.Engine``)."""

    def __init__(self, view: View, p, terms: list[str], weights: list[float], now: int, gone):
        self.view, self.p, self.terms, self.weights, self.now, self.gone = view, p, terms, weights, now, gone

    def pool(self, want: int) -> list[Candidate]:
        return candidates(self.view, index.search(self.view, self.p, self.terms, self.now, want=want))

    def places(self, places: list[tuple[str, int]]) -> list[Candidate]:
        return neighbors(self.view, self.p, self.now, places)

    def exact(self, chosen: list[Candidate]) -> list[Ranked]:
        return exact(self.view, self.terms, self.weights, chosen)

    def bm25_best(self, k: int, leave, pool: list[Candidate]) -> list[Ranked]:
        return index.best(self.view, self.p, self.terms, self.weights, self.now, leave, first=[c.key for c in pool])

    @staticmethod
    def candidate(r: Ranked, pooled: bool) -> Candidate:
        return ranking.unit_candidate(r.fields(), r, r.score if pooled else 0.0)


def candidates(view: View, hits: list[Hit]) -> list[Candidate]:
    """The units of these hits: CID, thread, place, how each joined, whether it asks, length and source, read
    from fast fields (one call per field for the documents this view has not met yet: a view is one commit, and
    searches meet the same units again; a source from its hash, by the view's sources)."""
    if not hits:
        return []
    known = _bounded(view, "fields")
    at = [(h.address.segment_ord, h.address.doc) for h in hits]
    new = [h.address for h, a in zip(hits, at) if a not in known]
    if new:
        sources = _sources(view)
        for a, c, t, place, n, s in zip(new, *(view.searcher.fast_field_values(name, new) for name in FIELDS)):
            tpos, asking, joined = place_fields(place)
            known[(a.segment_ord, a.doc)] = (f"{c:012x}", f"{t:012x}", tpos, joined, n, asking, sources.get(s, ""))
    out = []
    for h, a in zip(hits, at):
        cid, thread, tpos, joined, n, asking, source = known[a]
        out.append(Candidate(cid, thread, tpos, joined, h.score, h, None, None, n, asking, source))
    return out


def _sources(view: View) -> dict[int, str]:
    """The view's sources by their hash (its term dictionary: a tenant has few)."""
    by_hash = view.cache.sources
    if by_hash is None:
        by_hash = view.cache.sources = {source_hash(s): s for s, _ in view.searcher.terms_with_prefix("src", "")}
    return by_hash


def _bounded(view: View, name: Literal["fields", "places"]) -> dict:
    """One of the view's caches of documents (a view lives until the next commit), emptied past VIEW_CACHE entries
    (a new dict: a search still holding the old one reads on)."""
    cache = getattr(view.cache, name)
    if len(cache) > VIEW_CACHE:
        cache = {}
        setattr(view.cache, name, cache)
    return cache


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


def exact(view: View, terms: list[str], weights: list[float], contenders: list[Candidate]) -> list[Ranked]:
    """Each contender's exact BM25 from its stored tokens (its stored fields read only if it is answered; the
    Ranked of a unit already scored exactly)."""
    searcher = view.searcher
    from_index = [c for c in contenders if c.ranked is None]
    if not from_index:
        return [c.ranked for c in contenders]
    any_hit = next((c.key for c in from_index if c.pool > 0), None)
    avgdl = index.average_length(view, terms, any_hit) if any_hit is not None else index.mean_length(view, terms)
    scoring = index.scoring_terms(terms, weights)
    out = []
    for c in contenders:
        if c.ranked is not None:
            out.append(c.ranked)
            continue
        x = index.score_exactly(searcher, c.key, c.ntok, length_norm(c.ntok, avgdl), scoring, len(terms), view.schema)
        out.append(Ranked(None, x.score, x.length, x.tfs, c.tpos, load=index.loader(searcher, x), known_cid=c.cid))
    return out
