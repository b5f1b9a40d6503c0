"""Read-your-writes' scoring, on either store: units an index lacks are scored from their tokens, made once
per process (``TokenCache``), exactly as the index's rows are scored; what a search cannot read in time is
``Unseen`` (its freshness report)."""
from __future__ import annotations

import threading
import time

from ..params import SearchParams
from .bm25 import Bm25, ShardHit


class TokenCache:
    """Tokens of units still waiting for the indexer, made by searches (read-your-writes), kept per
    process so that each is made once; bounded in bytes, oldest out first."""

    def __init__(self, max_bytes: int = 32 << 20):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: dict[tuple, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str, day: str, rowid: int, cid: str) -> tuple[str, int] | None:
        return self._items.get((tenant, day, rowid, cid))

    def put(self, tenant: str, day: str, rowid: int, cid: str, tokens: list[str]) -> tuple[str, int]:
        # spaces doubled, as fts.fts_scoring_sql does in SQL: " term " occurrences then never overlap
        entry = (" " + "  ".join(tokens) + " ", len(tokens))
        with self._lock:
            self._items[(tenant, day, rowid, cid)] = entry
            self.bytes += len(entry[0])
            while self.bytes > self.max_bytes and self._items:
                old = self._items.pop(next(iter(self._items)))
                self.bytes -= len(old[0])
        return entry


class Unseen:
    """Units acknowledged before a search that it could not read in time (freshness)."""

    def __init__(self):
        self.count = 0
        self.oldest_ms: int | None = None

    def add(self, pushed_ms: int | None, n: int = 1) -> None:
        self.count += n
        if pushed_ms is not None:
            self.oldest_ms = pushed_ms if self.oldest_ms is None else min(self.oldest_ms, pushed_ms)

    def report(self) -> tuple[int, int]:
        return self.count, max(0, int(time.time() * 1000 - self.oldest_ms)) if self.oldest_ms else 0


class TailBudget:
    """What read-your-writes may still spend on one search: wall time until ``read_your_writes_ms`` has
    passed, and CPU against ``search_cpu_ms`` together with the search's other scoring (``cpu``: the
    SQLite store's CpuBudget; else counted here). A unit is tokenized only when its size, at the rate
    this process has measured, fits what is left, so no single large unit overruns the budget; what is
    not read is ``Unseen`` (the answer's freshness) and waits for the indexer."""

    rate = 2e6                 # bytes per CPU second of tokenizing, measured by every search (a low start)

    def __init__(self, ms: int, cpu=None, cpu_ms: int = 0):
        self.deadline = time.monotonic() + ms / 1000
        self.cpu = cpu
        self.limit = (cpu.limit if cpu is not None else (cpu_ms / 1000 if cpu_ms > 0 else None))
        self.spent = 0.0       # CPU spent here when there is no ``cpu`` to count on
        self.read = 0          # units tokenized
        self._lock = threading.Lock()

    def expired(self) -> bool:
        return time.monotonic() > self.deadline or (self.limit is not None and self._spent() >= self.limit)

    def admits(self, nbytes: int) -> bool:
        """Whether tokenizing ``nbytes`` more fits the time and CPU left."""
        cost = nbytes / TailBudget.rate
        if time.monotonic() + cost > self.deadline:
            return False
        return self.limit is None or self._spent() + cost <= self.limit

    def tokens(self, tokenizer, text: str) -> list[str]:
        """``tokenizer.tokens(text)``, its CPU counted (and the rate learnt)."""
        start = time.thread_time()
        toks = tokenizer.tokens(text)
        took = time.thread_time() - start
        if took > 0.002:
            TailBudget.rate = 0.7 * TailBudget.rate + 0.3 * (len(text) / took)
        self.charge(took)
        with self._lock:
            self.read += 1
        return toks

    def charge(self, seconds: float) -> None:
        if self.cpu is not None:
            self.cpu.charge(seconds)
        else:
            with self._lock:
                self.spent += seconds

    def _spent(self) -> float:
        return self.cpu.spent if self.cpu is not None else self.spent


def best(hits: list[ShardHit], k: int) -> list[ShardHit]:
    """The best k of one shard's hits, each row once (reads of a row that changed state between them
    may both find it)."""
    seen: set[int] = set()
    out = []
    for h in sorted(hits, key=lambda h: h.order):
        if h.rowid not in seen:
            seen.add(h.rowid)
            out.append(h)
    return out[:k]


def score_tokens(entry: tuple[str, int], r, p: SearchParams, terms: list[str], bm25: Bm25) -> ShardHit | None:
    """One waiting unit scored from its tokens in Python, exactly as fts_scoring_sql scores a row."""
    padded, ntok = entry
    return score_counts([padded.count(f" {term} ") for term in terms], ntok, r["cid"], r["id"], p, bm25)


def score_counts(tfs: list[int], ntok: int, cid: str, rowid: int, p: SearchParams, bm25: Bm25) -> ShardHit | None:
    """One unit scored from its query terms' frequencies, exactly as fts_scoring_sql scores a row."""
    if not ntok or (p.operator == "and" and not all(tfs)) or not any(tfs):
        return None
    return ShardHit(bm25.score(tfs, bm25.norm(ntok)), cid, rowid, ntok, tfs)

