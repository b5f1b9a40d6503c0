"""BM25 as the service computes it everywhere: k1 1.2, b 0.75 (tantivy's, fixed in the engine), Lucene's
always-positive idf, exact document lengths; and one scored unit (``ShardHit``)."""
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


@dataclass(frozen=True)
class Bm25:
    """What scoring needs besides the terms: per-term weights (idf × (k1 + 1)), the average length and
    the engine's parameters."""
    weights: list[float]
    avgdl: float
    k1: float = K1
    b: float = B

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

