"""What a search answers with its winners (docs/design.md §6): the 0-1 ``score``, ``explain``, and
which results are worth a model's context."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .bm25 import length_norm, term_score, term_weight, unknown_idf

# Context built for a model (packed context, prompts) leaves out results ranked under this share of the
# best one (its raw BM25 where BM25 alone ranks): on the judged sets fewer than 1 % of the relevant top-10 units do
# (bench/score_scale.py, "relative"), while a weak tail would pad the prompt with noise.
NEAR_BEST = 0.4


@dataclass
class Ranked:
    """One winning unit: its public fields, raw BM25 score, and what explain reports; where threads ranked
    it (service/ranking/threads.py), its combined score and the parts explain shows. A read index's answer
    may come with ``unit`` None, its CID and a ``load`` that reads its stored fields when the answer needs
    them (``fields``): an answer bounded in bytes reads no unit past its bound."""
    unit: dict | None
    score: float
    doc_len: int          # in tokens, exact on both paths
    tfs: list[int]
    tpos: int = 0         # its place in its thread (unit["thread"])
    combined: float | None = None
    parts: dict | None = None
    load: object = None   # () -> the unit's public fields, while ``unit`` is None
    known_cid: str | None = None

    @property
    def cid(self) -> str:
        return self.known_cid if self.unit is None else self.unit["cid"]

    def fields(self) -> dict:
        if self.unit is None:
            self.unit = self.load()
        return self.unit

    @property
    def rank(self) -> float:
        """What orders the answer: the combined score where threads ranked it, else BM25."""
        return self.score if self.combined is None else self.combined

    @property
    def order(self) -> tuple:
        return -self.rank, self.cid


@dataclass(frozen=True)
class Stats:
    """The statistics a search scored with: per-term idf, BM25's k1 and b, the average length and the
    number of documents (explain reports them; the score scale needs idf and documents)."""
    idf: list[float]
    k1: float
    b: float
    avgdl: float | None
    documents: int


@dataclass(frozen=True)
class Scale:
    """The 0-1 ``score`` of a query's results (docs/consistency-and-scores.md).

    score = bm25 / best × sqrt(coverage), where best is the query's best raw BM25 and coverage =
    min(1, best / Σ idf) over the query's terms: 1 when the best unit holds every query term about
    once at average length (each term then scores its idf), less when it matches only part of the
    query. A term no unit holds counts with the idf it would have in a single unit, so a query the
    store only partly knows scores lower. So the best match of a query it answers well scores 1, the
    others in proportion. Measured on the judged sets (bench/score_scale.py): a threshold of 0.5 keeps
    96 % of the relevant units in the top 10 on both sets, where the former bm25 / max-attainable
    kept 28 % (STARD) and 38 % (SciFact).
    """
    best: float
    coverage: float

    @classmethod
    def of(cls, best: float, idf: list[float], documents: int) -> "Scale":
        unknown = unknown_idf(documents)
        weight = sum(w if w else unknown for w in idf)
        return cls(best, min(1.0, best / weight) if weight > 0 else 0.0)

    def score(self, bm25: float) -> float:
        return self.relative(bm25, self.best)

    def relative(self, rank: float, top: float) -> float:
        """The 0-1 score of a result ranked ``rank`` where the first is ``top`` (BM25, or the combined score
        where threads ranked, docs/consistency-and-scores.md)."""
        if top <= 0:
            return 0.0
        return min(1.0, rank / top) * math.sqrt(self.coverage)


def near_best(results: list[dict], share: float = NEAR_BEST) -> tuple[list[dict], list[dict]]:
    """(results within ``share`` of the best one's rank, the others): what is worth a model's context. The 0-1
    score is in proportion to the rank (BM25, or the combined score where threads ranked)."""
    if not results:
        return [], []
    floor = share * max(r["score"] for r in results)
    return [r for r in results if r["score"] >= floor], [r for r in results if r["score"] < floor]


def explain(r: Ranked, terms: list[str], stats: Stats, scale: Scale) -> dict:
    """Per-term idf and tf contributions of one result (``explain: true``)."""
    k1, b, avgdl = stats.k1, stats.b, stats.avgdl
    norm = length_norm(r.doc_len, avgdl, k1, b) if avgdl else None
    return {
        "doc_len": r.doc_len, "doc_len_scored": r.doc_len,
        "avg_doc_len": round(avgdl, 3) if avgdl else None, "documents": stats.documents,
        "k1": k1, "b": b, "max_attainable": round(sum(term_weight(w, k1) for w in stats.idf), 6),
        "best_bm25": round(scale.best, 6), "best_coverage": round(scale.coverage, 6),
        "terms": [{"term": term, "idf": round(w, 6), "tf": tf,
                   "score": round(term_score(term_weight(w, k1), tf, norm), 6) if norm else None}
                  for term, w, tf in zip(terms, stats.idf, r.tfs)]}
