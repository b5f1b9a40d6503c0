"""Thread-aware ranking (docs/design.md §6 "Threads in ranking"), the same on every path and store: a unit's
rank combines its own BM25 with what surrounds it in its thread.

    combined(u) = bm25(u) / best
                + THREAD × thread(u)       the best share of u's thread in the pool (u itself included)
                + NEAR_1 × near(u, 1)      the best share at u's place ± 1
                + NEAR_2 × near(u, 2)      the best share at u's place ± 2
                + ASKED × asked(u)         the share of the unit just before u, when that unit asks ("?")
                + NAMED × named(u)         1 when the query names u's source (a term of its tokens)
                + LENGTH × min(1, ntok(u) / LENGTH_FULL)

- ``share`` is a unit's BM25 in the *pool* (the query's best matches) over the pool's best, so a unit's own
  share is at most 1; a thread's head (below) lends no near or asked evidence;
- a turn that shares no word with the question is found through its thread (a session about the question),
  the turns beside it (the question it answers, the remark that follows), the turn that asked it, and who
  said it (a question names the person whose turn holds the answer: "What does Melanie do to destress?");
- the length prior lifts a turn that says something over a short reply ("Sure!") among equal evidence.

A thread's **head** is a unit with no parent in a thread where the candidates hold units with one (a session
root, whose text is a header). It has no evidence of its own and is ranked below every matching unit of its
thread, so structure never crowds out content; its own match still counts as evidence for its thread (a
header's names and dates are the whole session's).

Neighbors that match nothing join the candidates only in threads a client made (by parents or
metadata.session): a thread of units that only followed each other in time lends evidence to the units that
match, and brings in none that do not (a source's unrelated notes stay out of each other's answers).

Every path checks ``has_threads`` first and ranks by BM25 alone when no candidate shares a thread and none has
a neighbor to read: corpora of documents rank as before, to the float.

Weights chosen on LoCoMo's development half with leave-one-conversation-out checks (bench/memory.py; every
lever tried, kept or not, in bench/README.md "Agent memory"): evidence R@10 0.743 -> 0.79, R@5 0.630 -> 0.72.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..unitkeys import JOINED_BY_PARENT, JOINED_BY_TIME

THREAD = 0.8
NEAR_1 = 0.4
NEAR_2 = 0.4
ASKED = 0.8
NAMED = 0.8
LENGTH = 0.4
LENGTH_FULL = 40          # tokens past which a unit's length adds nothing more
WINDOW = 2                # the places each side a unit's near evidence (and the pulled neighbors) reach
POOL = 50                 # the best matches thread and near evidence are read from (at least 2 × k, the
                          # candidates BM25's own rescoring reads: one engine query serves both)
PULL = 10                 # the neighbors (± WINDOW) of this many of the pool's best join the candidates
EXTRA = 3                 # candidates past k whose own BM25 is made exact (chosen by the combined estimate)


@dataclass(slots=True)
class Candidate:
    """A unit that may be answered: where it sits in its thread, what the ranking reads of it, and its BM25 as
    the pool has it (``pool``: the engine's own score, exact where that is what the path has)."""
    cid: str
    thread: str
    tpos: int
    joined: int               # how it joined its thread (unitkeys.JOINED_BY_*)
    pool: float               # 0 for a neighbor pulled in that is not among the pool's best
    key: object = None        # the path's handle on it (a read-index hit, a row)
    ranked: object = None     # its Ranked where the path has it already (exact BM25 and fields)
    parts: dict | None = None  # explain's parts, once combined
    ntok: int = 0             # its length in tokens
    asks: bool = False        # its content asks (holds "?")
    source: str = ""
    named: bool = False       # the query names its source (``Naming.mark``)


def asks(content: str) -> bool:
    """Whether a unit asks: it holds a question mark (NFKC folds the full-width one)."""
    return "?" in content or "\uff1f" in content


class Naming:
    """Which sources a query names. A source is named when the query holds one of the tokens that tell it apart
    from the other sources among the candidates (the service's tokenizer: ``locomo_melanie`` -> ``locomo``,
    ``melani``, where ``locomo`` is every speaker's and ``melani`` hers alone; ``notes_ann`` is named by
    ``ann``, not by ``note``). A source's tokens are made once per process (a tenant has few sources)."""
    MAX = 4096

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._tokens: dict[str, frozenset] = {}
        self._holders: dict[str, set] = {}      # a token -> the kept sources that hold it

    def tokens(self, source: str) -> frozenset:
        toks = self._tokens.get(source)
        if toks is None:
            toks = frozenset(self.tokenizer.tokens(source))
            if len(self._tokens) < self.MAX:
                for t in toks:
                    self._holders.setdefault(t, set()).add(source)
                self._tokens[source] = toks
        return toks

    def _names_any(self, sources: set, terms: frozenset) -> bool:
        """Whether a token of one of ``sources`` is among ``terms``: by the query's terms (a few lookups)
        once every source is kept, else source by source."""
        met = sources.difference(self._tokens)      # (a set less a dict's keys: no copy of the dict)
        for s in met:
            self.tokens(s)
        if met and met.difference(self._tokens):
            return any(not self.tokens(s).isdisjoint(terms) for s in sources)
        holders = self._holders
        return any(not holders[t].isdisjoint(sources) for t in terms if t in holders)

    def mark(self, candidates: list[Candidate], terms: frozenset) -> None:
        """Set ``named`` on each candidate, its source told apart from the others' among ``candidates``."""
        sources = {c.source for c in candidates}
        if not self._names_any(sources, terms):
            return                              # (the query holds no source's token: nothing is named)
        seen: dict[str, int] = {}
        for s in sources:
            for t in self.tokens(s):
                seen[t] = seen.get(t, 0) + 1
        named = {s for s in sources if any(seen[t] == 1 for t in self.tokens(s) & terms)}
        for c in candidates:
            c.named = c.source in named


class Evidence:
    """The pool's evidence, per thread and per place, made once per search."""

    def __init__(self, pool: list[Candidate]):
        self.ordered = sorted(pool, key=lambda c: (-c.pool, c.cid))
        self.best = (self.ordered[0].pool if self.ordered else 0.0) or 1.0
        self.at = {(c.thread, c.tpos): c for c in pool}
        self.linked = {c.thread for c in pool if c.joined == JOINED_BY_PARENT}
        self.top: dict[str, Candidate] = {}           # per thread, its best match (ties by CID)
        for c in self.ordered:
            self.top.setdefault(c.thread, c)
        self._shares: tuple[dict, dict] | None = None

    def add(self, more: list[Candidate]) -> None:
        """Neighbors pulled in: places taken and links, no evidence (they are not among the best)."""
        for c in more:
            self.at.setdefault((c.thread, c.tpos), c)
            if c.joined == JOINED_BY_PARENT:
                self.linked.add(c.thread)
        self._shares = None

    def head(self, c: Candidate) -> bool:
        return c.joined != JOINED_BY_PARENT and c.thread in self.linked

    def _lender(self, c: Candidate | None) -> Candidate | None:
        """``c`` when it lends evidence to the units around it: a match of the pool, not a head."""
        return c if c is not None and c.pool > 0 and not self.head(c) else None

    def near(self, c: Candidate, d: int) -> Candidate | None:
        """The better matching of the units ``d`` places before and after ``c`` (ties by CID)."""
        best = None
        for n in (self._lender(self.at.get((c.thread, c.tpos - d))), self._lender(self.at.get((c.thread, c.tpos + d)))):
            if n is not None and (best is None or (n.pool, n.cid) > (best.pool, best.cid)):
                best = n
        return best

    def asker(self, c: Candidate) -> Candidate | None:
        """The unit just before ``c`` when it asks and matches (the question ``c`` may answer)."""
        n = self._lender(self.at.get((c.thread, c.tpos - 1)))
        return n if n is not None and n.asks else None

    def missing_neighbors(self) -> list[tuple[str, int]]:
        """The places within WINDOW of the pool's best PULL that no candidate holds (they are read, and those a
        client put in the thread join: ``pullable``); none past a unit that only followed another in time."""
        out = []
        for c in self.ordered[:PULL]:
            if c.joined == JOINED_BY_TIME and c.tpos > 0 and c.thread not in self.linked:
                continue
            for d in range(1, WINDOW + 1):
                for pos in (c.tpos - d, c.tpos + d):
                    if pos >= 0 and (c.thread, pos) not in self.at:
                        out.append((c.thread, pos))
        return list(dict.fromkeys(out))

    def _share(self, c: Candidate | None) -> float:
        return c.pool / self.best if c is not None else 0.0

    def parts(self, c: Candidate, own: float) -> dict:
        """Each part of ``c``'s combined score with ``own`` (its BM25 / best), and whose match lent it."""
        top, n1, n2, asker = self.top.get(c.thread), self.near(c, 1), self.near(c, 2), self.asker(c)
        return {"own": own, "thread": self._share(top), "thread_from": top.cid if top is not None else None,
                "near_1": self._share(n1), "near_1_from": n1.cid if n1 is not None else None,
                "near_2": self._share(n2), "near_2_from": n2.cid if n2 is not None else None,
                "asked": self._share(asker), "asked_from": asker.cid if asker is not None else None,
                "named": c.named, "length": min(1.0, c.ntok / LENGTH_FULL)}

    def _lent(self) -> tuple[dict, dict]:
        """Per place, the share its unit lends (a lender's), and the same for those that ask: made once for
        the candidates' estimates, which need only the shares (the better of two places is the larger)."""
        if self._shares is None:
            lends, asking, linked = {}, {}, self.linked
            for place, c in self.at.items():
                if c.pool > 0 and (c.joined == JOINED_BY_PARENT or c.thread not in linked):     # (``_lender``)
                    lends[place] = c.pool / self.best
                    if c.asks:
                        asking[place] = lends[place]
            self._shares = lends, asking
        return self._shares

    def contenders(self, candidates: list[Candidate], n: int) -> list[Candidate]:
        """The ``n`` best candidates by the estimate, ties by CID: the combined score with the pool's BM25 for
        the unit's own (which candidates are worth an exact one), read from the places' shares without
        explain's parts (the search's most repeated step)."""
        lends, asking = self._lent()
        tops = {t: c.pool / self.best for t, c in self.top.items()}
        linked, best, get = self.linked, self.best, lends.get
        ranked = []
        for i, c in enumerate(candidates):
            t, pos = c.thread, c.tpos
            if c.joined != JOINED_BY_PARENT and t in linked:            # a head: its own share alone
                value = c.pool / best
            else:
                value = formula(c.pool / best, tops.get(t, 0.0), max(get((t, pos - 1), 0.0), get((t, pos + 1), 0.0)),
                                max(get((t, pos - 2), 0.0), get((t, pos + 2), 0.0)), asking.get((t, pos - 1), 0.0),
                                c.named, min(1.0, c.ntok / LENGTH_FULL))
            ranked.append((-value, c.cid, i))
        ranked.sort()
        return [candidates[i] for _, _, i in ranked[:n]]

    def sources(self, chosen: list[Candidate]) -> set[str]:
        """The units whose matches lend these candidates their evidence."""
        out = set()
        for c in chosen:
            for lender in (self.top.get(c.thread), self.near(c, 1), self.near(c, 2), self.asker(c)):
                if lender is not None:
                    out.add(lender.cid)
        return out

    def combine(self, c: Candidate, own: float) -> float:
        """The combined score with ``own`` (its BM25 / best); explain's parts recorded on ``c``."""
        if self.head(c):
            c.parts = {"own": own, "head": True}
            return own
        c.parts = self.parts(c, own)
        return total(c.parts)


def total(p: dict) -> float:
    """The combined score of these parts."""
    return formula(p["own"], p["thread"], p["near_1"], p["near_2"], p["asked"], p["named"], p["length"])


def formula(own: float, thread: float, near_1: float, near_2: float, asked: float, named: bool,
            length: float) -> float:
    """The combined score (the formula above; the one place it is written)."""
    return (own + THREAD * thread + NEAR_1 * near_1 + NEAR_2 * near_2 + ASKED * asked
            + (NAMED if named else 0.0) + LENGTH * length)


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


WEIGHTS = {"thread": THREAD, "near_1": NEAR_1, "near_2": NEAR_2, "asked": ASKED, "named": NAMED, "length": LENGTH}


def explain_parts(p: dict, combined: float, thread: str) -> dict:
    """What ``explain`` shows of the thread-aware rank (``p``: a candidate's parts; rounded as the rest of
    explain)."""
    out = {"ranking": "threads", "combined": round(combined, 6), "own_share": round(p["own"], 6), "thread": thread,
           "weights": {**WEIGHTS, "length_full": LENGTH_FULL}}
    if p.get("head"):
        out["head"] = True
        out["below_thread"] = bool(p.get("below_thread"))
        return out
    for name in ("thread", "near_1", "near_2", "asked"):
        out[f"{name}_evidence"] = round(p[name], 6)
        out[f"{name}_evidence_from"] = p[f"{name}_from"]
    out["named"] = p["named"]
    out["length_share"] = round(p["length"], 6)
    return out
