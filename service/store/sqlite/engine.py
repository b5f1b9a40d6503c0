"""The primary day files' side of the ranking (service/ranking/rank.py), for strong searches and any default
search the read index cannot answer: the pool is the live days' best matches under the global BM25 (FTS5
per day, scored exactly in SQL, service/store/sqlite/fts.py; with read-your-writes also the units still
waiting for the indexer, by their tokens), merged across days; neighbors are read by the catalog's thread
index, then from their day files under the request's filters. Every score here is exact, and rows are read
live: nothing is gone since it was read.
"""
from __future__ import annotations

import json
from dataclasses import replace

from ...ranking.bm25 import Bm25
from ...ranking.scoring import Ranked
from ...ranking.tail import TailBudget, best
from ...ranking.threads import Candidate
from ..exact import ExactEngine
from ...units import unit_dict
from . import fts
from .queries import fetch_all


class Engine(ExactEngine):
    """One search of a tenant's day files (``ranking.Engine``). ``per_day``: day -> (its Db, its statistics);
    ``live``: the query terms some indexed unit holds; ``unseen``: read-your-writes' report (None: none)."""

    def __init__(self, searcher, t, p, terms: list[str], per_day: dict, live: list[str], bm25: Bm25, now: int,
                 budget, unseen):
        self.searcher, self.t, self.p, self.terms, self.per_day = searcher, t, p, terms, per_day
        self.live, self.bm25, self.now, self.budget, self.unseen = live, bm25, now, budget, unseen

    def pool(self, want: int) -> list[Candidate]:
        p = replace(self.p, top_k=want)
        ryw = TailBudget(self.searcher.config.read_your_writes_ms, self.budget)    # read-your-writes' time and CPU
        # FTS5's own rank keeps a shard's local best (only where it holds too many matches to score each one):
        # 3x the answer, as many as the pool; not 3x the pool, which tripled the rows scored in SQL
        local_n = max(self.searcher.config.local_top_n, 3 * self.p.top_k, want)

        def top(day):
            db, st = self.per_day[day]
            # (with read-your-writes every term: a row the indexer took since the statistics were read
            # is in FTS5 now with a term they did not count)
            match = [term for term in dict.fromkeys(self.live) if st["df"][term] or self.unseen is not None]
            # the waiting rows before the indexed ones: one the indexer takes in between is read twice
            hits = [] if self.unseen is None else self.searcher.tail.pending_top(
                self.t, db, day, p, self.terms, self.bm25, self.now, ryw, self.unseen, self.budget)
            if match and not (p.operator == "and" and len(match) < len(set(self.live))):
                # Score every match exactly unless the shard holds too many (the sum of df bounds them).
                exact = sum(st["df"][term] for term in match) <= self.searcher.config.exact_match_limit
                # (bm25.for_rows: nothing may have been indexed when the statistics were read)
                hits += db.read(self.budget.run, fts.shard_top, p, fts.fts_query(match, p.operator), self.terms,
                                self.bm25.for_rows(), None if exact else local_n, want, self.now)
            return [(hit, db) for hit in best(hits, len(hits))]

        found = [x for part in self.searcher._map(top, list(self.per_day)) for x in part]
        found.sort(key=lambda x: x[0].order)
        ranked = sorted(self._fetch(found[:want]), key=lambda r: r.order)
        return [self.candidate(r, True) for r in ranked]

    def _fetch(self, found: list) -> list[Ranked]:
        """The units of the winning (hit, shard) pairs, one read per shard."""
        by_db: dict[int, tuple] = {}
        for hit, db in found:
            by_db.setdefault(id(db), (db, []))[1].append(hit)
        ranked = []
        for db, hits in by_db.values():
            rows = db.read(fts.rows_by_id, [h.rowid for h in hits])
            ranked += [Ranked(unit_dict(rows[h.rowid]), h.score, h.ntok, h.tfs, rows[h.rowid]["tpos"] or 0)
                       for h in hits if h.rowid in rows]
        return ranked

    def places(self, places: list[tuple[str, int]]) -> list[Candidate]:
        if not places:
            return []
        located = self.t.catalog.read(fetch_all, "catalog_places", {"places": json.dumps(places), "now": self.now})
        by_day: dict[str, list[str]] = {}
        for r in located:
            by_day.setdefault(r["day"], []).append(r["cid"])
        out = []
        scoring = self.bm25.for_rows()
        for day, cids in by_day.items():
            db = self.t.shard(day, create=False)
            if db is None:
                continue
            for row in db.read(fts.units_with_tokens, cids, self.p, self.now):
                tokens = row["tokens"].split() if row["tokens"] is not None else \
                    self.searcher.tokenizer.tokens(row["content"])
                tfs = [tokens.count(term) for term in self.terms]
                ntok = len(tokens)
                out.append(self.neighbor(row, ntok, tfs, scoring))
        return out
