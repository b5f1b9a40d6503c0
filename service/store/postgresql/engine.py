"""PostgreSQL's tables' side of the ranking (service/ranking/rank.py), for strong searches and default searches
a node's read index cannot answer: the pool is the tenant's best indexed units under the global BM25 (scored
in SQL over their term frequencies, service/store/postgresql/search.py) and, with read-your-writes, the queued
units scored from their content; neighbors are read by the catalog's thread index, then from their days'
partitions under the request's filters. Every score here is exact and every row is read in the search's one
snapshot: nothing is gone since it was read.
"""
from __future__ import annotations

from dataclasses import replace

from ...ranking.bm25 import Bm25
from ...ranking.scoring import Ranked
from ...ranking.threads import Candidate
from ..exact import ExactEngine
from ...units import unit_dict
from ..filters import passes
from .queries import sql
from .rows import units_at


class Engine(ExactEngine):
    """One search of a tenant's tables on one connection (``ranking.Engine``). ``hits(p, want)`` reads the best
    ``want`` (ShardHit, day) pairs: the caller's scoring, with its pruning and queued units."""

    def __init__(self, conn, tenant: str, p, terms: list[str], bm25: Bm25, now: int, hits, tokenizer):
        self.conn, self.tenant, self.p, self.terms, self.bm25, self.now = conn, tenant, p, terms, bm25, now
        self.hits, self.tokenizer = hits, tokenizer

    def pool(self, want: int) -> list[Candidate]:
        hits = sorted(self.hits(replace(self.p, top_k=want), want), key=lambda h: h[0].order)[:want]
        units = units_at(self.conn, self.tenant, [(h.cid, day) for h, day in hits])
        return [self.candidate(Ranked(unit_dict(units[h.cid]), h.score, h.ntok, h.tfs, units[h.cid]["tpos"] or 0), True)
                for h, _ in hits if h.cid in units]

    def places(self, places: list[tuple[str, int]]) -> list[Candidate]:
        if not places:
            return []
        located = self.conn.execute(sql("catalog_places"), {
            "tenant": self.tenant, "threads": [t for t, _ in places], "tposes": [pos for _, pos in places],
            "now": self.now}).fetchall()
        rows = units_at(self.conn, self.tenant, [(r["cid"], r["day"]) for r in located])
        rows = {cid: r for cid, r in rows.items() if passes(r, self.p, self.now)}
        if not rows:
            return []
        indexed = {r["cid"]: r for r in self.conn.execute(sql("unit_terms_of"), {"tenant": self.tenant,
                                                                                 "cids": list(rows)})}
        scoring = self.bm25.for_rows()
        out = []
        for cid, row in rows.items():
            terms = indexed.get(cid)
            if terms is not None:
                ntok, tfs = terms["ntok"], [int(terms["tfs"].get(term, 0)) for term in self.terms]
            else:                       # (still queued: its tokens made here)
                tokens = self.tokenizer.tokens(row["content"])
                ntok, tfs = len(tokens), [tokens.count(term) for term in self.terms]
            out.append(self.neighbor(row, ntok, tfs, scoring))
        return out
