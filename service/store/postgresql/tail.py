"""Read-your-writes over a node's read index (docs/design.md §6.2): what a default search reads from PostgreSQL
besides the node's index, in one statement: the *tail* (every live unit at or past the index's low-water
mark, and every unit re-pushed since the index's state), and the change log since that state (deleted and
changed units leave the index's answers at once).

Tail units are scored like the index's documents, with its statistics: indexed ones from their terms,
units still queued for the indexer from their content, tokenized by the first search that meets them. What
a unit holds (content, terms) never changes for its CID, so each process fetches and tokenizes it once
(``UnitTexts``); its mutable fields (type, ttl, metadata, parent) are read with the tail every time.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field

from ...uris import UNITS_PREFIX
from ...ranking.bm25 import Bm25
from ...ranking.scoring import Ranked
from ...ranking.tail import TailBudget, Unseen, score_counts
from ...units import MUTABLE_FIELDS, unit_dict
from ..filters import passes
from .queries import sql

MAX_CHANGES = 5000          # changes a search reads past the index's state; more: the tables answer instead
MAX_KNOWN = 4096            # tenants whose last node_tail answer a process keeps


class UnitTexts:
    """The content and terms of tail units, per process, bounded in bytes (oldest out first)."""

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: dict[tuple[str, str], tuple[str, dict, int]] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str, cid: str):
        return self._items.get((tenant, cid))

    def put(self, tenant: str, cid: str, content: str, tfs: dict, ntok: int) -> tuple[str, dict, int]:
        entry = (content, tfs, ntok)
        size = len(content) + 16 * len(tfs)
        with self._lock:
            self._items[(tenant, cid)] = entry
            self.bytes += size
            while self.bytes > self.max_bytes and self._items:
                old = self._items.pop(next(iter(self._items)))
                self.bytes -= len(old[0]) + 16 * len(old[1])
        return entry


@dataclass
class TailRead:
    """One search's reads: tail rows (mutable fields, seq order), their texts, and what left the index."""
    rows: list
    texts: dict = field(default_factory=dict)      # cid -> content, of queued units this process has not seen
    gone: set = field(default_factory=set)         # CIDs the index's answers must leave out
    seq: int = 0                                   # the tenant's newest seq in this snapshot
    oldest_ms: int | None = None                   # the oldest unit still queued for the indexer
    too_many: bool = False                         # past read_your_writes_max (or MAX_CHANGES)

    def left_out(self, p, now: int):
        """``gone(cids)`` for the index's answers: of ``cids``, those deleted or expired since the index got
        them, and those the tail holds (re-pushed, or sent past the index's low-water mark) that no longer pass
        the request's filters. A tail unit that passes keeps its index copy, as SQLite's index keeps a unit
        it was sent: its match lends its thread evidence beyond the tail's best k (service/ranking/threads.py)
        and it answers with the tail's fields (``refresh``); the tail's best k replace their copies
        (readindex/threaded.py, ``fresh``)."""
        rows = {r["cid"]: r for r in self.rows}
        return lambda cids: {c for c in cids if c in self.gone and (c not in rows or not passes(rows[c], p, now))}

    def refresh(self, ranked: list[Ranked]) -> None:
        """The index's answers that the tail holds, with the mutable fields the tail read (a re-push's)."""
        rows = {r["cid"]: r for r in self.rows}
        for r in ranked:
            row = rows.get(r.cid)
            if row is not None:
                fresh = unit_dict({**row, "content": ""})
                r.fields().update({k: fresh[k] for k in MUTABLE_FIELDS})


class TailReader:
    """A process's default searches' reads from PostgreSQL besides the node's index. node_tail's last answer
    per tenant is kept with the tenant's version it was read at (``known``): while the version (every push,
    delete, forget, index and purge commit of the tenant, ``tenant_version``) and the node's state stay the
    same, so does that answer, and a search asks PostgreSQL for the version alone."""

    def __init__(self, config, tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.texts = UnitTexts()
        self.known: dict[str, tuple[tuple, int, dict]] = {}     # tenant -> ((low, after), version, node_tail's row)

    def _keep(self, tenant: str, state: dict, pos: dict) -> None:
        if len(self.known) >= MAX_KNOWN and tenant not in self.known:
            self.known.pop(next(iter(self.known)), None)
        self.known[tenant] = ((state["low"], state["n"]), int(pos["version"]), pos)

    def args(self, tenant: str, state: dict, now: int) -> dict:
        return {"tenant": tenant, "now": now, "low": state["low"], "after": state["n"],
                "limit": self.config.read_your_writes_max + 1, "changes": MAX_CHANGES + 1}

    def read(self, conn, tenant: str, state: dict, now: int, pos: dict | None = None) -> TailRead:
        """Where the tail is and the changes since the index's state, in one statement (one snapshot,
        outside any transaction; ``pos``: its row when it was read already, ``sent``); only when there is a
        tail, its units' mutable fields (a later snapshot: fresher, and a unit deleted meanwhile is gone), and
        what this process has not seen of them yet (what a unit holds never changes for its CID, so any
        snapshot has it). An index that lacks nothing costs its searches one light statement."""
        if pos is None:
            pos = conn.execute(sql("node_tail"), self.args(tenant, state, now)).fetchone()
            self._keep(tenant, state, pos)
        at, changes = pos["at"], pos["changes"]
        read = TailRead([], seq=pos["seq"], oldest_ms=pos["queued_ms"])
        if len(at) > self.config.read_your_writes_max or len(changes) > MAX_CHANGES:
            read.too_many = True
            return read
        read.gone = {uri[len(UNITS_PREFIX):] for uri in changes if uri.startswith(UNITS_PREFIX)}
        read.gone.update(cid for _, cid, _ in at)       # the tail's version wins over the index's
        if not at:
            return read
        seqs, cids, days = (list(x) for x in zip(*at))
        rows = read.rows = conn.execute(sql("node_tail_rows"),
                                        {"tenant": tenant, "seqs": seqs, "cids": cids, "days": days}).fetchall()
        missing = [r["cid"] for r in rows if self.texts.get(tenant, r["cid"]) is None]
        if missing:
            # of the queued units, only as many bytes as read_your_writes_ms could tokenize (newest first)
            allowance = int(TailBudget.rate * self.config.read_your_writes_ms / 1000)
            for r in conn.execute(sql("node_tail_texts"), {"tenant": tenant, "cids": missing, "bytes": allowance}):
                if r["tfs"] is not None:
                    self.texts.put(tenant, r["cid"], r["content"], r["tfs"], r["ntok"])
                elif r["content"] is not None:
                    read.texts[r["cid"]] = r["content"]      # queued for the indexer: tokenized in ``top``
        return read

    def send(self, db, tenant: str, state: dict, now: int):
        """node_tail sent on the primary, its answer not waited for (``Db.send``): the search works meanwhile,
        then ``finish``es the read; only tenant_version when node_tail's answer at the node's state is ``known``.
        (the statement sent or None when it could not be, the answer known): ``read`` it then."""
        known = self.known.get(tenant)
        if known is not None and known[0] == (state["low"], state["n"]):
            return db.send("tenant_version", {"tenant": tenant}), known
        return db.send("node_tail", self.args(tenant, state, now)), None

    def finish(self, db, sent, known, tenant: str, state: dict, now: int) -> TailRead | None:
        """The read whose statement was ``sent``: node_tail's answer (``known`` while the tenant's version is
        the one it was read at), and when there is a tail the rest of ``read`` on the primary (a later
        snapshot, as ``read`` reads it). None when the answer was not plainly read, or the version moved."""
        got = sent.rows()
        if not got:
            return None
        if known is not None:
            if int(got[0][0]) != known[1]:
                return None             # (a change since: node_tail, the ordinary way)
            pos = known[2]
        else:
            seq, queued_ms, changes, at, version = got[0]
            pos = {"seq": int(seq), "queued_ms": None if queued_ms is None else int(queued_ms),
                   "changes": json.loads(changes), "at": json.loads(at), "version": int(version)}
            self._keep(tenant, state, pos)
        if not pos["at"] and len(pos["changes"]) <= MAX_CHANGES:
            return self.read(None, tenant, state, now, pos)      # (no statement: nothing more to read)
        read, where = db.read_fresh(self.read, tenant, state, now, pos)
        return read if where == "primary" else None

    def top(self, tenant: str, read: TailRead, p, terms: list[str], bm25: Bm25, now: int,
            unseen: Unseen) -> list[Ranked]:
        """The best k tail units, scored like the index's documents with its statistics, within
        read_your_writes_ms and search_cpu_ms (``TailBudget``, unit by unit by their size, newest first: the
        indexer takes the queue oldest first); queued ones not tokenized are ``unseen``."""
        ryw = TailBudget(self.config.read_your_writes_ms, cpu_ms=self.config.search_cpu_ms)
        hits = []
        for r in reversed(read.rows):
            if not passes(r, p, now):
                continue
            entry = self.texts.get(tenant, r["cid"])
            if entry is None:
                content = read.texts.get(r["cid"])
                if content is None or ryw.expired() or not ryw.admits(len(content)):
                    unseen.add(r["pushed_ms"])
                    continue
                toks = ryw.tokens(self.tokenizer, content)
                entry = self.texts.put(tenant, r["cid"], content, Counter(toks), len(toks))
            content, tfs, ntok = entry
            hit = score_counts([tfs.get(term, 0) for term in terms], ntok, r["cid"], r["seq"], p, bm25)
            if hit is not None:
                hits.append((hit, r, content))
        hits.sort(key=lambda x: x[0].order)
        return [Ranked(unit_dict({**r, "content": content}), h.score, h.ntok, h.tfs, r["tpos"] or 0)
                for h, r, content in hits[:p.top_k]]
