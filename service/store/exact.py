"""What both stores' primaries give the ranking alike (service/ranking/rank.py's ``Engine``): every score exact and
every row read live, so the pool needs no rescoring, BM25's own best are the pool's first, and nothing is gone
since it was read (the read index's engine, service/readindex/threaded.py, differs in all three)."""
from __future__ import annotations

from ..ranking.bm25 import Bm25
from ..ranking.rank import unit_candidate
from ..ranking.scoring import Ranked
from ..ranking.threads import Candidate
from ..units import unit_dict


class ExactEngine:
    @staticmethod
    def exact(chosen: list[Candidate]) -> list[Ranked]:
        return [c.ranked for c in chosen]

    @staticmethod
    def gone(cids: list[str]) -> set[str]:
        return set()

    @staticmethod
    def bm25_best(k: int, leave, pool: list[Candidate]) -> list[Ranked]:
        return [c.ranked for c in pool[:k]]

    @staticmethod
    def candidate(r: Ranked, pooled: bool) -> Candidate:
        return unit_candidate(r.fields(), r, r.score if pooled else 0.0)

    @staticmethod
    def neighbor(row, ntok: int, tfs: list[int], scoring: Bm25) -> Candidate:
        """A live unit read at a place of a thread, scored from its terms' frequencies (it matched nothing in the
        pool, so it lends no evidence of its own: pool share 0)."""
        r = Ranked(unit_dict(row), scoring.score(tfs, scoring.norm(ntok)) if ntok else 0.0, ntok, tfs,
                   row["tpos"] or 0)
        return ExactEngine.candidate(r, False)
