"""Thread-aware ranking (docs/design.md §6 "Threads in ranking"), on either store and either path: a unit's
rank combines its own BM25 with the evidence of its thread and of its neighbors in the thread.

    combined(u) = bm25(u) / best  +  THREAD_WEIGHT × thread(u)  +  NEIGHBOR_WEIGHT × neighbor(u)

- ``best`` is the best BM25 among the answer's candidates, so a unit's own share is at most 1;
- ``thread(u)``: the best share (BM25 / the pool's best) of any unit of u's thread in the *pool*, the query's
  best matches (u itself included), plus SECOND × the second best's: a turn of a session that is about the
  question gains on an equal turn of an unrelated session;
- ``neighbor(u)``: the best share of the units just before and after u in its thread (its place ± 1), a head
  excepted: the turn that answers sits beside the one that asks.

A thread's **head** is a unit with no parent in a thread where the candidates hold units with one (a session
root, whose text is a header). It has no thread or neighbor evidence of its own and is ranked below every
matching unit of its thread, so structure never crowds out content; its own match still counts as evidence
for its thread (a header's names and dates are the whole session's).

Neighbors that match nothing join the candidates only in threads a client made (by parents or
metadata.session): a thread of units that only followed each other in time lends evidence to the units that
match, and brings in none that do not (a source's unrelated notes stay out of each other's answers).

A unit whose thread holds no other candidate and no neighbor gains exactly THREAD_WEIGHT × its own share, so
among such units the order is BM25's: corpora of documents rank as before, to the float (every path checks
``has_threads`` first and ranks by BM25 alone when no candidate shares a thread).

Weights chosen on LoCoMo's development half (bench/memory.py; the table in bench/README.md): a plateau from
0.5 to 1.0 and 0.3 to 0.6; at 0.6 and 0.4, evidence recall@10 0.604 -> 0.74 with a client's session roots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..unitkeys import JOINED_BY_PARENT, JOINED_BY_TIME

THREAD_WEIGHT = 0.6
SECOND = 0.5              # the share of a thread's second-best match in its evidence
NEIGHBOR_WEIGHT = 0.4
POOL = 50                 # the best matches thread and neighbor evidence are read from (at least 2 × k, the
                          # candidates BM25's own rescoring reads: one tantivy query serves both; LoCoMo's
                          # R@10 0.730 with 20, 0.743 with 50 and with 100)
PULL = 10                 # the neighbors of this many of the pool's best join the candidates (they may match nothing)
EXTRA = 3                 # candidates past k whose own BM25 is made exact (chosen by the combined estimate)


@dataclass
class Candidate:
    """A unit that may be answered: where it sits in its thread and its BM25 as the pool has it (``pool``:
    the read index's own score, or the exact one where that is what the path has)."""
    cid: str
    thread: str
    tpos: int
    joined: int               # how it joined its thread (unitkeys.JOINED_BY_*)
    pool: float               # 0 for a neighbor pulled in that matches nothing
    key: object = None        # the path's handle on it (a read-index hit, a row)
    ranked: object = None     # its Ranked where the path has it already (exact BM25 and fields)
    parts: dict = field(default_factory=dict)


class Evidence:
    """The pool's evidence, per thread and per place, made once per search."""

    def __init__(self, pool: list[Candidate]):
        self.ordered = sorted(pool, key=lambda c: (-c.pool, c.cid))
        self.best = (self.ordered[0].pool if self.ordered else 0.0) or 1.0
        self.at = {(c.thread, c.tpos): c for c in pool}
        self.linked = {c.thread for c in pool if c.joined == JOINED_BY_PARENT}
        # per thread, its best two matches (best first; ties by CID) and their evidence
        self.top: dict[str, list[Candidate]] = {}
        for c in self.ordered:
            top = self.top.setdefault(c.thread, [])
            if len(top) < 2:
                top.append(c)
        self.value = {t: (top[0].pool + (SECOND * top[1].pool if len(top) > 1 else 0.0)) / self.best
                      for t, top in self.top.items()}

    def add(self, more: list[Candidate]) -> None:
        """Neighbors pulled in: places taken and links, no evidence (they are not among the best)."""
        for c in more:
            self.at.setdefault((c.thread, c.tpos), c)
            if c.joined == JOINED_BY_PARENT:
                self.linked.add(c.thread)

    def head(self, c: Candidate) -> bool:
        return c.joined != JOINED_BY_PARENT and c.thread in self.linked

    def neighbor(self, c: Candidate) -> Candidate | None:
        before, after = self.at.get((c.thread, c.tpos - 1)), self.at.get((c.thread, c.tpos + 1))
        found = [n for n in (before, after) if n is not None and n.pool > 0 and not self.head(n)]
        if len(found) == 2:
            return max(found, key=lambda n: (n.pool, n.cid))
        return found[0] if found else None

    def missing_neighbors(self) -> list[tuple[str, int]]:
        """The places next to the pool's best PULL that no candidate holds (they are read, and those a client
        put in the thread join: ``pullable``); none past a unit that only followed another in time."""
        out = []
        for c in self.ordered[:PULL]:
            if c.joined == JOINED_BY_TIME and c.tpos > 0 and c.thread not in self.linked:
                continue
            for pos in (c.tpos - 1, c.tpos + 1):
                if pos >= 0 and (c.thread, pos) not in self.at:
                    out.append((c.thread, pos))
        return list(dict.fromkeys(out))

    def estimate(self, c: Candidate) -> float:
        """The combined score with the pool's BM25 for the unit's own: which candidates are worth an exact one."""
        own = c.pool / self.best
        if self.head(c):
            return own
        near = self.neighbor(c)
        return (own + THREAD_WEIGHT * self.value.get(c.thread, 0.0)
                + (NEIGHBOR_WEIGHT * near.pool / self.best if near is not None else 0.0))

    def contenders(self, candidates: list[Candidate], n: int) -> list[Candidate]:
        """The ``n`` best candidates by the estimate, ties by CID."""
        ranked = sorted((-self.estimate(c), c.cid, i) for i, c in enumerate(candidates))
        return [candidates[i] for _, _, i in ranked[:n]]

    def sources(self, chosen: list[Candidate]) -> set[str]:
        """The units whose matches lend these candidates their evidence."""
        out = set()
        for c in chosen:
            out.update(m.cid for m in self.top.get(c.thread, ()))
            near = self.neighbor(c)
            if near is not None:
                out.add(near.cid)
        return out

    def combine(self, c: Candidate, own: float) -> float:
        """The combined score with ``own`` (its BM25 / best); explain's parts recorded on ``c``."""
        if self.head(c):
            c.parts = {"own": own, "head": True}
            return own
        top, near = self.top.get(c.thread, []), self.neighbor(c)
        thread = self.value.get(c.thread, 0.0)
        neighbor = near.pool / self.best if near is not None else 0.0
        c.parts = {"own": own, "thread": thread, "thread_from": [m.cid for m in top],
                   "neighbor": neighbor, "neighbor_from": near.cid if near is not None else None}
        return own + THREAD_WEIGHT * thread + NEIGHBOR_WEIGHT * neighbor


def pullable(c: Candidate) -> bool:
    """Whether a neighbor read by its place may join the candidates: a client put it in the thread (by its
    parent or metadata.session), it did not only follow another unit in time (CONTEXT_THREAD_GAP_S)."""
    return c.joined != JOINED_BY_TIME


def has_threads(pool: list[Candidate]) -> bool:
    """Whether any two candidates share a thread, or one joined a thread: else (no neighbor read either)
    BM25 alone ranks."""
    threads = [c.thread for c in pool]
    if len(set(threads)) < len(threads):
        return True
    return any(c.joined != JOINED_BY_TIME or c.tpos > 0 for c in pool)


def settle_heads(scored: list[tuple[float, Candidate]], ev: Evidence) -> list[tuple[float, Candidate]]:
    """Each head below every matching unit of its thread among ``scored`` (combined, candidate)."""
    lowest: dict[str, float] = {}
    for value, c in scored:
        if not ev.head(c) and c.pool > 0:
            lowest[c.thread] = min(lowest.get(c.thread, math.inf), value)
    out = []
    for value, c in scored:
        if ev.head(c) and c.thread in lowest and value >= lowest[c.thread]:
            value = math.nextafter(lowest[c.thread], -math.inf)
            c.parts["below_thread"] = True
        out.append((value, c))
    return out


def explain_parts(p: dict, combined: float, thread: str) -> dict:
    """What ``explain`` shows of the thread-aware rank (``p``: a candidate's parts; rounded as the rest of
    explain)."""
    out = {"combined": round(combined, 6), "own_share": round(p["own"], 6), "thread": thread,
           "thread_weight": THREAD_WEIGHT, "second_share": SECOND, "neighbor_weight": NEIGHBOR_WEIGHT}
    if p.get("head"):
        out["head"] = True
        out["below_thread"] = bool(p.get("below_thread"))
        return out
    out.update({"thread_evidence": round(p["thread"], 6), "thread_evidence_from": p["thread_from"],
                "neighbor_evidence": round(p["neighbor"], 6), "neighbor_evidence_from": p["neighbor_from"]})
    return out
