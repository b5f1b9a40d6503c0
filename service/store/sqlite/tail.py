"""Read-your-writes for default searches (docs/consistency-and-scores.md): the *tail*, the units
acknowledged to a tenant that its read index may lack, read from the primary day files and scored
with the read index's statistics.

Past the low-water mark of the leader's last pass (every unit below it is in the index) a search
reads, per day: the units in FTS5 but not sent (or changed since) by SQL, and those still waiting
for the indexer by their tokens, made by the first search that meets them (``TokenCache``) and
stored in the row for other workers and the indexer. What it cannot read in time is ``Unseen``.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from ...params import SearchParams
from ...ranking.bm25 import Bm25, ShardHit
from ...ranking.scoring import Ranked
from ...errors import TooCostly
from ...ranking.tail import TailBudget, TokenCache, Unseen, best, score_tokens
from ...units import unit_dict
from ..filters import filters
from . import fts
from .fts import CpuBudget
from .queries import fetch_one, sql

log = logging.getLogger(__name__)

# A day with at most this many units the read index lacks is scanned row by row (by their partial
# index); with more (a bulk import), FTS5 finds the matches among them.
TAIL_SCAN_MAX = 5000


@dataclass(frozen=True)
class Tail:
    """What a default search reads from the primaries because the read index may lack it: the units
    at or past the low-water mark of the leader's last pass (every unit below it is in the index)."""
    low: int
    seq: int                  # the tenant's newest unit when the search began
    days: dict[str, int]      # day -> units at or past ``low``


class TailReader:
    """Reads one tenant's tail for a search: which days, their best units, what stays unseen."""

    def __init__(self, config, tokenizer, tokens: TokenCache):
        self.config = config
        self.tokenizer = tokenizer
        self.tokens = tokens
        self._read: dict[str, tuple] = {}      # tenant -> ((catalog number, low, first, last), (seq, days))

    def forget(self, tenant: str) -> None:
        """Drop what was read of a tenant this process closes."""
        self._read.pop(tenant, None)

    def tail(self, t, state: dict | None, first: str, last: str) -> Tail | None:
        """The days of the units a default search reads from the primaries, or None when
        read-your-writes is off or they are too many (a bulk import: freshness reports them)."""
        if self.config.read_your_writes_ms <= 0:
            return None
        low = (state or {}).get("low", 0)
        # What the catalog says of them holds until it next commits: read again only then (or for another
        # mark or range). The change number is read first, so a commit during the read shows next time.
        key = (t.catalog_version(), low, first, last)
        known = self._read.get(t.name)
        if known is not None and known[0] == key:
            seq, days = known[1]
        else:
            def read(c):
                seq = c.execute(sql("catalog_max_seq")).fetchone()[0]
                days = {r["day"]: r["n"] for r in c.execute(
                    sql("ryw_tail_days"), {"low": low, "first": first, "last": last})}
                return seq, days
            seq, days = t.catalog.read(read)
            self._read[t.name] = (key, (seq, days))
        if sum(days.values()) > self.config.read_your_writes_max:
            return None
        return Tail(low, seq, dict(days))

    def freshness(self, t, tail: Tail) -> tuple[int, int]:
        """The units acknowledged before the search that it could not see (still pending after the
        catch-up), and how long the oldest of them has waited."""
        pending, oldest = 0, None
        for day in tail.days:
            db = t.shard(day, create=False)
            if db is None:
                continue
            n, first = db.read(fetch_one, "ryw_pending", {"seq": tail.seq})
            pending += n
            if n:
                oldest = first if oldest is None else min(oldest, first)
        return pending, max(0, int(time.time() * 1000 - oldest)) if oldest else 0

    def top(self, t, p: SearchParams, terms: list[str], bm25: Bm25, tail: Tail, now: int,
            budget: CpuBudget, unseen: Unseen) -> list[Ranked]:
        """The best k of the units the read index lacks, scored like the index's with its statistics,
        within read_your_writes_ms; the rest are ``unseen``."""
        live = [term for term, w in zip(terms, bm25.weights) if w]
        found = []
        ryw = TailBudget(self.config.read_your_writes_ms, budget)
        for day, n in sorted(tail.days.items(), reverse=True):     # newest first, as _tokens
            db = t.shard(day, create=False)
            if db is None or not live:
                continue
            if ryw.expired():
                unseen.add(None, n)         # no time or CPU left: the read index answers alone for them
                continue
            args: dict = {"low": tail.low}
            where = ["u.indexed IN (1, 3)", "u.seq >= :low", "u.ntok > 0"] + filters(p, args)
            if n <= TAIL_SCAN_MAX or db.read(fetch_one, "ryw_unsent")[0] <= TAIL_SCAN_MAX:
                source, require = fts.unsent_source(where, None), p.operator
            else:
                args["match"] = fts.fts_query(list(dict.fromkeys(live)), p.operator)
                source, require = fts.unsent_source(where, args["match"]), None
            # the waiting rows before the indexed ones: a row the indexer takes in between is then read
            # twice (kept once), never missed
            hits = self.pending_top(t, db, day, p, terms, bm25, now, ryw, unseen, budget)
            try:
                hits += db.read(budget.run, fts.score, source, args, terms, bm25, p.top_k, now, require)
            except TooCostly:
                unseen.add(None, n)         # past search_cpu_ms: reported as not seen, not a 422
            hits = best(hits, p.top_k)
            if hits:
                units = db.read(fts.rows_by_id, [h.rowid for h in hits])
                found += [Ranked(unit_dict(units[h.rowid]), h.score, h.ntok, h.tfs, units[h.rowid]["tpos"] or 0)
                          for h in hits if h.rowid in units]
        found.sort(key=lambda r: r.order)
        return found[:p.top_k]

    def pending_top(self, t, db, day: str, p: SearchParams, terms: list[str], bm25: Bm25, now: int,
                    ryw: TailBudget, unseen: Unseen, budget: CpuBudget | None = None) -> list[ShardHit]:
        """The best k units of this shard still waiting for the indexer. Their tokens are made by the
        first search that meets them (while ``ryw`` allows, unit by unit) and stored in the row when the
        file is free at once, so other workers and the indexer reuse them; until then this process keeps
        them. What the budget leaves unread is ``unseen``."""
        args: dict = {"now": now}
        where = ["u.indexed = 0"] + filters(p, args)
        # Each row moves one way: no tokens, tokens stored by a search, indexed. Read in that order (the
        # caller reads the indexed ones after this), a row that moves on between two reads is read twice
        # (kept once), never missed.
        bare = db.read(fts.pending_bare, where, args)
        hits: list[ShardHit] = []
        if bare:
            known = self._tokens(t, db, day, bare, ryw, unseen)
            for r in bare:
                entry = known.get(r["id"])
                hit = score_tokens(entry, r, p, terms, bm25) if entry is not None else None
                if hit is not None:
                    hits.append(hit)
        # the tokens are in the row: scored in SQL like the others
        source = fts.pending_source(where + ["u.ntok > 0"])
        run = budget.run if budget is not None else (lambda conn, fn, *a: fn(conn, *a))
        try:
            hits += db.read(run, fts.score, source, dict(args), terms, bm25.for_rows(), p.top_k, now, p.operator)
        except TooCostly:
            # past search_cpu_ms: these rows are reported as not seen (the answer stays a 200)
            n, oldest = db.read(fts.pending_unseen, source, args)
            unseen.add(oldest, n)
        return best(hits, p.top_k)

    def _tokens(self, t, db, day: str, bare: list, ryw: TailBudget, unseen: Unseen) -> dict:
        """rowid -> (padded tokens, length) of these waiting units: cached, or made now one by one while
        ``ryw`` admits each by its size (and offered to the row); those left are ``unseen``. Newest first:
        the unit a caller just pushed is read at once, and the indexer takes the queue oldest first."""
        known = {r["id"]: self.tokens.get(t.name, day, r["id"], r["cid"]) for r in bare}
        missing = sorted((r for r in bare if known[r["id"]] is None), key=lambda r: r["id"], reverse=True)
        made = []
        for i, r in enumerate(missing):
            if ryw.expired():
                for rest in missing[i:]:
                    unseen.add(rest["pushed_ms"])
                break
            row = db.read(fetch_one, "units_content_by_ids", {"ids": json.dumps([r["id"]])})
            if row is None:
                continue                    # taken by the indexer, or removed, since
            if not ryw.admits(len(row["content"])):
                unseen.add(r["pushed_ms"])  # too large for what is left: the indexer makes its tokens
                continue
            toks = ryw.tokens(self.tokenizer, row["content"])
            known[r["id"]] = self.tokens.put(t.name, day, r["id"], r["cid"], toks)
            made.append({"id": r["id"], "tokens": " ".join(toks), "ntok": len(toks)})
        if made:
            try:
                db.try_write(lambda c: c.executemany(sql("ryw_store_tokens"), made))
            except Exception as e:  # noqa: BLE001  (sharing them is optional: the indexer makes them anyway)
                log.debug("tokens of pending units not stored: %s", e)
        return known
