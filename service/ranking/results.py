"""The answer of a search on either store: its winners shaped in order, with the 0-1 score, snippets and
explain."""
from __future__ import annotations

from ..params import SearchParams
from .scoring import Ranked, Scale, Stats, explain
from .snippets import snippet
from .threads import explain_parts

MAX_QUERY_TERMS = 64          # a query's terms past this are ignored (every engine call grows with them)
# An answer's contents at most (like a listing page and lineage): past it, fewer results than top_k. 100 results of
# 1 MB units answered 98 MB, which a slow reader kept one of a worker's request handlers writing for minutes
# (issue 39, finding 2).
ANSWER_CONTENT_BYTES = 4 << 20


def shape_results(p: SearchParams, terms: list[str], ranked: list[Ranked], stats: Stats | None, tokenizer) -> list[dict]:
    """Shape the winners: order, score in 0-1 (``scoring.Scale``), min_score, at most ANSWER_CONTENT_BYTES of
    contents (the first result always), snippet and explain (both storage backends: service/store/postgresql/
    search.py answers with it too)."""
    if not ranked:
        return []
    ranked.sort(key=lambda r: r.order)
    # coverage from the best BM25 among them; the score in proportion to the rank (BM25, or the combined
    # score where threads ranked: service/ranking/threads.py), the first's being the best
    scale = Scale.of(max(r.score for r in ranked), stats.idf, stats.documents)
    top = ranked[0].rank
    out = []
    size = 0
    for r in ranked:
        score = scale.relative(r.rank, top)
        if score < p.min_score or len(out) == p.top_k:
            break
        unit = r.fields()
        size += len(unit["content"].encode("utf-8"))
        if out and size > ANSWER_CONTENT_BYTES:
            break
        item = dict(unit)
        item.pop("seq", None)
        item["score"] = round(score, 6)
        item["bm25_score"] = round(r.score, 6)
        if p.highlight:
            item["snippet"] = snippet(item["content"], terms, tokenizer)
        if p.explain:
            item["explain"] = explain(r, terms, stats, scale)
            item["explain"]["ranking"] = "bm25" if r.parts is None else "threads"
            if r.parts is not None:
                item["explain"]["threads"] = explain_parts(r.parts, r.combined, unit["thread"])
        out.append(item)
    return out
