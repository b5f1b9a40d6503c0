"""Searching one view of a read index: the best documents by tantivy's BM25 under the request's filters,
scored again with exact lengths (tantivy keeps a length in one byte)."""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass

from tantivy import FieldType, Occur, Query

from ..ranking.bm25 import length_norm, term_score
from ..ranking.scoring import Ranked
from .reader import Hit, View
from .schema import place_fields, unit_of

RESCORE_FACTOR = 2            # the read index's candidates per result, scored again with exact lengths
# ... at most this many when near ties need more: past it the answer is the exact order of
# tantivy's best 200 (at 1M units a cap of 1000 put p99 at 82 ms, 200 at 21 ms; score lists
# still equal exhaustive scoring on every bench query, bench/README.md)
RESCORE_MAX = 200
COUNT_PASSES = 20_000         # token comparisons past which a candidate's terms are counted in one pass
# Past this length a candidate's term counts come from the index's postings (tantivy's explanation of one term
# query each, ~40 µs), not from its stored tokens: a unit may hold 1 MiB, and splitting 200 of them took a
# default search 15-36 s (issue 39, finding 3). Its stored fields are read only if it is answered.
LARGE_TOKENS = 2048
# A tie at the k-th place is settled by CID, as the primaries settle it, over up to this many documents at
# or above the tied score (a corpus of templated units ties thousands); past it, the ties the engine's
# document order gives.
TIE_MAX = 20_480
TIE_EPS = 1e-6                # f32 rounding between tantivy's scores of exactly tied units


def best(view: View, p, terms: list[str], weights: list[float], now: int, gone,
         first: list[Hit] | None = None) -> list[Ranked]:
    """The read index's best k by exact BM25, with the units' stored fields, leaving out those ``gone(cids)``
    names (the store's: deleted, expired or changed since the index got them, or read fresher from the store).
    ``first``: tantivy's best already read (``search`` with at least RESCORE_FACTOR × k wanted), for the first
    round. Each answer carries its place in its thread (for thread-aware ranking, service/readindex/threaded.py)."""
    k = p.top_k
    want = RESCORE_FACTOR * k
    for _ in range(8):
        hits = first[:want] if first is not None else search(view, p, terms, now, want=want)
        first = None
        scored, complete = rescore(view, hits, terms, weights, k)
        last = complete or len(hits) < want or want >= RESCORE_MAX
        if last and len(hits) == want:
            # (also past RESCORE_MAX: a tie of lengths past 40, or of f32 scores, is never "complete")
            scored = settle_ties(view, p, terms, weights, now, hits, scored, k)
        # in answer order, ties by CID (from a fast field: the units tied past k are never read)
        cids = [f"{c:012x}" for c in view.searcher.fast_field_values("cidn", [x.hit.address for x in scored])]
        order = sorted(range(len(scored)), key=lambda i: (-scored[i].score, cids[i]))
        drop = gone(cids) if cids else set()
        if drop and len(cids) - len(drop) < p.top_k and len(hits) == want and k < p.top_k + len(drop):
            k = p.top_k + len(drop)       # room for the next best in place of the dropped ones
            want = max(want, RESCORE_FACTOR * k)
            continue
        if last:
            break
        want *= 4     # a document past these candidates could still win with its exact length
    answered = [i for i in order if cids[i] not in drop][:p.top_k]
    place = view.searcher.fast_field_values("place", [scored[i].hit.address for i in answered]) if answered else []
    return [Ranked(None, scored[i].score, scored[i].length, scored[i].tfs, place_fields(pos)[0],
                   load=loader(view.searcher, scored[i]), known_cid=cids[i]) for i, pos in zip(answered, place)]


def loader(searcher, x: "Scored"):
    """What reads a candidate's public fields when its answer needs them (``Ranked.fields``)."""
    return lambda: unit_of(x.document(searcher))


def search(view: View, p, terms: list[str], now: int, want: int | None = None) -> list[Hit]:
    """The best ``want`` (default top k) live documents for the query terms and the request's
    filters, by tantivy's score (lengths in one byte)."""
    schema = view.schema
    occur = Occur.Must if p.operator == "and" else Occur.Should
    return live_best(view, Query.boolean_query([(occur, Query.term_query(schema, "t", term)) for term in terms]),
                     p, now, want or p.top_k)


def live_best(view: View, query, p, now: int, want: int) -> list[Hit]:
    """The best ``want`` live documents of ``query`` that pass the request's filters."""
    schema = view.schema
    filters = []
    if p.types:
        filters.append(Query.term_set_query(schema, "type", list(p.types)))
    if p.source and p.source != "*":
        if p.source.endswith("*"):
            # the source names with this prefix, from the term dictionary: no pattern syntax involved
            names = [name for name, _ in view.searcher.terms_with_prefix("src", p.source[:-1])]
            if not names:
                return []
            filters.append(Query.term_set_query(schema, "src", names))
        else:
            filters.append(Query.term_query(schema, "src", p.source))
    if p.since is not None or p.until is not None:
        filters.append(Query.range_query(schema, "ts", FieldType.Integer, p.since, p.until))
    if p.parent_cid:
        filters.append(Query.term_query(schema, "parent", p.parent_cid))
    if p.project is not None:
        filters.append(Query.boolean_query([(Occur.Should, Query.term_query(schema, "project", p.project)),
                                            (Occur.Should, Query.term_query(schema, "global", 1))]))
    if filters:
        query = _filtered(query, filters)
    # Expired documents (not yet purged by the janitor) are dropped after ranking, which keeps the
    # plain disjunction tantivy evaluates fastest; when they crowd the top, a range filter instead.
    limit = want
    while True:
        hits = view.searcher.search(query, limit, count=False).hits
        expiry = view.searcher.fast_field_values("exp", [a for _, a in hits])
        live = [Hit(score, address) for (score, address), exp in zip(hits, expiry) if exp is not None and exp > now]
        if len(live) >= want or len(hits) < limit:
            return live[:want]
        if limit >= 1024:
            query, limit = _filtered(query, [Query.range_query(schema, "exp", FieldType.Integer, now + 1, None)]), want
            continue
        limit *= 4


def _filtered(query, filters):
    """``query``'s scores, restricted to documents that pass every filter (which adds nothing to scores)."""
    both = filters[0] if len(filters) == 1 else Query.boolean_query([(Occur.Must, f) for f in filters])
    return Query.boolean_query([(Occur.Must, query), (Occur.Must, Query.const_score_query(both, 0.0))])


@dataclass
class Scored:
    """A candidate scored again with its exact length; tfs per query term; its stored document (None until
    read, for a long unit counted from the postings)."""
    hit: Hit
    score: float
    length: int
    tfs: list[int]
    doc: object

    def document(self, searcher):
        if self.doc is None:
            self.doc = searcher.doc(self.hit.address)
        return self.doc


def rescore(view: View, hits: list[Hit], terms: list[str], weights: list[float], k: int) -> tuple[list[Scored], bool]:
    """The best k of the candidates by BM25 with exact lengths, and whether they are the best k of
    the whole index (``hits`` being tantivy's best, lengths in one byte).

    tantivy keeps a length exactly up to 40 tokens, then within 1/8, which reorders near ties. A
    longer exact length only lowers a score, by at most the factor (1 + n) / (1 + n_exact) (n the
    length norm): so a candidate whose tantivy score is below the k-th best lower bound cannot win,
    and no document past the candidates can either once that bound reaches the last candidate's
    score. The rest are scored exactly from their stored tokens: one stored-document read per
    candidate (the same read that answers a hit), whatever the number of query terms, and the query
    terms counted in its tokens in compiled code (``list.count`` per term, or one ``Counter`` pass over a
    long unit)."""
    if not hits:
        return [], True
    searcher = view.searcher
    lengths = searcher.fast_field_values("len", [h.address for h in hits])
    avgdl = average_length(view, terms, hits[0])
    used = [length_norm(encoded_length(n), avgdl) for n in lengths]
    exact = [length_norm(n, avgdl) for n in lengths]
    low = sorted((min(h.score, h.score * (1 + u) / (1 + e)) for h, u, e in zip(hits, used, exact)), reverse=True)
    bound = low[k - 1] * (1 - 1e-9) if len(low) >= k else 0.0     # (1e-9: float rounding is not a win)
    scoring = scoring_terms(terms, weights)
    out = [score_exactly(searcher, h, lengths[i], exact[i], scoring, len(terms), view.schema)
           for i, h in enumerate(hits) if h.score >= bound]
    out.sort(key=lambda x: -x.score)
    # No document past the candidates scores more than the last one did in tantivy; once the k-th
    # exact score reaches that, none can win.
    complete = len(out) < k or out[k - 1].score * (1 + 1e-9) >= hits[-1].score
    # candidates tied with the k-th stay: the caller breaks ties by CID, as the primaries' path does
    end = k
    while end < len(out) and out[end].score == out[k - 1].score:
        end += 1
    return out[:end], complete


def scoring_terms(terms: list[str], weights: list[float]) -> list[tuple[int, str, float]]:
    """(position, term, weight) of the terms the index holds (weight > 0); the others have no frequency."""
    return [(j, term, w) for j, (term, w) in enumerate(zip(terms, weights)) if w]


def score_exactly(searcher, h: Hit, length: int, norm: float, scoring: list, n_terms: int, schema=None) -> Scored:
    """One candidate's BM25 with its exact length (``norm``: k1's length factor): its query terms counted
    in its stored tokens, or, past LARGE_TOKENS (with ``schema``), read from the postings."""
    if schema is not None and length > LARGE_TOKENS:
        doc, count = None, lambda term: term_frequency(searcher, schema, term, h.address)
    else:
        doc = searcher.doc(h.address)
        tokens = (doc.get_first("t") or "").split()
        # one pass per term over a short unit; one pass in all over a longer one
        count = collections.Counter(tokens).__getitem__ if len(tokens) * len(scoring) > COUNT_PASSES else tokens.count
    tfs = [0] * n_terms
    score = 0.0
    for j, term, w in scoring:
        tf = tfs[j] = count(term)
        score += term_score(w, tf, norm)
    return Scored(h, score, length, tfs, doc)


def term_frequency(searcher, schema, term: str, address) -> int:
    """How often ``term`` occurs in one document, from tantivy's explanation of its term query (the
    postings: no stored field is read)."""
    try:
        tree = json.loads(Query.term_query(schema, "t", term).explain(searcher, address).to_json(), strict=False)
    except ValueError:
        return 0                                  # (the document does not hold the term)
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.get("description", "").startswith("freq,"):
            return int(node["value"])
        stack.extend(node.get("details") or [])
    return 0


def settle_ties(view: View, p, terms: list[str], weights: list[float], now: int, hits: list[Hit],
                scored: list[Scored], k: int) -> list[Scored]:
    """The best k when the k-th exact score ``s`` may be shared past the candidates: ties ordered by CID
    over every document that reaches ``s`` (up to TIE_MAX), as the primaries order them, so that any two
    indexes of the same units (two nodes, a rebuild) give the same k whatever their document order.

    Exactly tied units have the same term counts and length, so tantivy scores them alike: more of
    tantivy's best are asked for until its last is below the tied units' tantivy score. The CIDs of
    those at or above it come from a fast field, in one call; only those the CID order reaches are read
    and scored exactly, and one joins the k if it does score ``s``."""
    if len(scored) < k:
        return scored
    s = scored[k - 1].score
    better = [x for x in scored if x.score > s]
    tied = [x for x in scored if x.score == s]
    # Units that tie exactly have the same term counts and length, so tantivy gives them one score too
    # (in f32, with its own idf: not comparable with s itself, a common term's idf is off by 1e-4 in f32)
    floor = min(x.hit.score for x in tied) * (1 - TIE_EPS)
    if hits[-1].score < floor:
        return scored                   # no document past the candidates ties
    limit = len(hits)
    while True:
        limit = min(limit * 4, TIE_MAX)
        more = search(view, p, terms, now, want=limit)
        if len(more) < limit or more[-1].score < floor or limit >= TIE_MAX:
            break
    seen = {(h.address.segment_ord, h.address.doc) for h in hits}
    extra = [h for h in more if h.score >= floor and (h.address.segment_ord, h.address.doc) not in seen]
    if not extra:
        return scored
    searcher = view.searcher
    cidn = searcher.fast_field_values("cidn", [x.hit.address for x in tied] + [h.address for h in extra])
    if any(c is None for c in cidn):
        return scored                   # (an index written before the field: rebuilt at its next start)
    lengths = searcher.fast_field_values("len", [h.address for h in extra])
    avgdl = average_length(view, terms, hits[0])
    scoring = scoring_terms(terms, weights)
    order = sorted(range(len(cidn)), key=cidn.__getitem__)
    out = list(better)
    for i in order:
        if len(out) == k:
            break
        if i < len(tied):
            out.append(tied[i])
            continue
        e = i - len(tied)
        x = score_exactly(searcher, extra[e], lengths[e], length_norm(lengths[e], avgdl), scoring, len(terms),
                          view.schema)
        if x.score >= s:
            out.append(x)
    out.sort(key=lambda x: -x.score)
    return out


def mean_length(view: View, terms: list[str]) -> float:
    """The average document length for scoring units the index does not hold yet: tantivy's own
    (``average_length``, from any document matching a query term), else, when none matches, the
    mean of the exact lengths."""
    if view.cache.avgdl is None:
        query = Query.boolean_query([(Occur.Should, Query.term_query(view.schema, "t", term)) for term in terms])
        hits = view.searcher.search(query, 1, count=False).hits
        if hits:
            return average_length(view, terms, Hit(*hits[0]))
        if view.cache.mean_len is None:
            agg = view.searcher.aggregate(Query.all_query(), {"len": {"avg": {"field": "len"}}})
            view.cache.mean_len = (agg.get("len") or {}).get("value") or 1.0
        return view.cache.mean_len
    return view.cache.avgdl


def average_length(view: View, terms: list[str], hit: Hit) -> float:
    """The average document length of this commit as tantivy computes it, read from its explanation
    of one hit (once per commit)."""
    if view.cache.avgdl is None:
        query = Query.boolean_query([(Occur.Should, Query.term_query(view.schema, "t", term)) for term in terms])
        tree = json.loads(query.explain(view.searcher, hit.address).to_json(), strict=False)
        stack, avgdl = [tree], None
        while stack and avgdl is None:
            node = stack.pop()
            if node.get("description", "").startswith("avgdl"):
                avgdl = node["value"]
            stack.extend(node.get("details") or [])
        view.cache.avgdl = avgdl or 1.0
    return view.cache.avgdl


# Lucene's SmallFloat.intToByte4, which tantivy uses to store a document's length in one byte.
def _long_to_int4(i: int) -> int:
    bits = i.bit_length()
    if bits < 4:
        return i
    shift = bits - 4
    return ((i >> shift) & 7) | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits, shift = i & 7, (i >> 3) - 1
    return bits if shift == -1 else (bits | 8) << shift


_FREE = 255 - _long_to_int4(2 ** 31 - 1)
FIELDNORMS = [i if i < _FREE else _FREE + _int4_to_long(i - _FREE) for i in range(256)]


def _encoded(n: int) -> int:
    lo, hi = 0, 255
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if FIELDNORMS[mid] <= n:
            lo = mid
        else:
            hi = mid - 1
    return FIELDNORMS[lo]


_ENCODED = [_encoded(n) for n in range(4096)]


def encoded_length(n: int) -> int:
    """The document length tantivy scores with: the largest table value not above n."""
    return _ENCODED[n] if n < 4096 else _encoded(n)
