"""BM25 as the service computes it everywhere, written once: k1 1.2, b 0.75 (tantivy's, fixed in the
engine), Lucene's always-positive idf, exact document lengths; the length norm and a term's score in Python
(``length_norm``, ``term_score``) and as SQL for both dialects (``scoring_expressions``); and one scored unit
(``ShardHit``).

Every scorer calls these, in Python and in SQL alike, with the floating-point operations in one order: the
read index's rescoring, read-your-writes, explain, tool search and both stores' statements. Ties are told
apart by equal floats (service/readindex/searcher.py settle_ties), so a second copy that grouped an
operation differently would split ties between paths (tests/test_code_shape.py keeps the expressions here)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

K1, B = 1.2, 0.75


def idf_of(n: int, df: int) -> float:
    """Lucene's idf: always positive, so small tenants (a term in most of few units) still rank sanely."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0


def unknown_idf(n: int) -> float:
    """The idf of a term the index does not hold yet, as it will have once the one unit holding it is in."""
    return idf_of(n + 1, 1)


def length_norm(n: int, avgdl: float, k1: float = K1, b: float = B) -> float:
    """BM25's length factor k1 * (1 - b + b * n / avgdl) of a document of ``n`` tokens."""
    return k1 * (1 - b + b * n / avgdl)


def term_weight(idf: float, k1: float = K1) -> float:
    """A query term's weight in BM25, idf × (k1 + 1): the most one occurrence-rich document can get from it."""
    return idf * (k1 + 1)


def term_score(weight: float, tf: int, norm: float) -> float:
    """One query term's share of a document's score: ``weight`` (idf × (k1 + 1)) × tf / (tf + norm). It is
    below ``weight`` whatever tf is (the bound PostgreSQL's pruning stands on)."""
    return weight * tf / (tf + norm)


def scoring_expressions(param, n_terms: int) -> tuple[str, str]:
    """The same two expressions as SQL: (the length norm over a column ``ntok``, the score summed over
    columns tf0, tf1, ... and a column ``norm``). ``param(name)`` spells a bound parameter in the dialect
    (SQLite ``:name``, psycopg ``%(name)s``): k1, b, avgdl and each term's weight w<i>."""
    k1, b, avgdl = param("k1"), param("b"), param("avgdl")
    norm = f"{k1} * (1 - {b} + {b} * ntok / {avgdl})"
    return norm, " + ".join(f"{param(f'w{i}')} * tf{i} / (tf{i} + norm)" for i in range(n_terms))


@dataclass(frozen=True)
class Bm25:
    """What scoring needs besides the terms: per-term weights (idf × (k1 + 1)), the average length and
    the engine's parameters."""
    weights: list[float]
    avgdl: float
    k1: float = K1
    b: float = B

    @classmethod
    def of(cls, idf: list[float], avgdl: float) -> "Bm25":
        """The weights of these idfs under the service's k1 and b."""
        return cls([term_weight(w) for w in idf], avgdl)

    def norm(self, n: int) -> float:
        """The length norm of a document of ``n`` tokens; with nothing indexed yet (no average length) a
        document is normalised by its own length."""
        return length_norm(n, self.avgdl, self.k1, self.b) if self.avgdl else self.k1

    def score(self, tfs: list[int], norm: float) -> float:
        """A document's score from its query terms' frequencies (in the order of ``weights``)."""
        return sum(term_score(w, tf, norm) for w, tf in zip(self.weights, tfs))

    def for_rows(self) -> "Bm25":
        """These weights for scoring rows in SQL: with nothing indexed yet there is no average length,
        so each row is normalised by its own (b = 0), as tail.score_tokens does."""
        return self if self.avgdl else replace(self, avgdl=1.0, b=0.0)


@dataclass(frozen=True)
class ShardHit:
    """One unit of one shard (a SQLite day file, a PostgreSQL partition) under the global BM25: its score,
    CID (the tie-break), row id (on PostgreSQL its seq), length in tokens and each query term's frequency."""
    score: float
    cid: str
    rowid: int
    ntok: int
    tfs: list[int]

    @classmethod
    def of(cls, row) -> "ShardHit":
        return cls(row[0], row[1], row[2], row[3], list(row[4:]))

    @property
    def order(self) -> tuple:
        """Best first; ties by CID, so the order is the same however the corpus is sharded."""
        return -self.score, self.cid

