"""The read index on every node (docs/design.md §5.2, §6.1): each service node keeps, per tenant, the tantivy
read index the SQLite store uses (service/readindex/), built and kept in step from PostgreSQL by the node's
maintenance leader of that tenant. PostgreSQL stays the store of record; a node's index is a cache it can
always build again.

A pass reads, in one snapshot (from the standby when it answers, else the primary):

- **new units** in seq order after the watermark ``W``, once the indexer has made their terms (``unit_terms``;
  a document's text is its terms repeated tf times: the read index keeps frequencies, not positions, so
  BM25 sees exactly the tokens it would on SQLite). The lowest seq still queued bounds the watermark: every
  unit below it is indexed or gone, so no unit is ever skipped; indexed units past it are sent and
  remembered (``above``) until the watermark passes them.
- **changes** after ``N`` from the change log (``live_events``, written in the transaction of the change
  itself): a deleted or forgotten unit leaves the index, a re-pushed one (new ttl, metadata, ...) is read
  again. The log numbers changes densely; a gap (the janitor pruned rows this node never read: it was away
  longer than ``INDEX_CHANGES_KEEP_MS``) starts the index again from nothing.
- expired units leave the index when the janitor runs (by a range query on their expiry); dropped day
  partitions only ever hold expired units.

Each document's key is its CID as a 48-bit integer (a tenant's CIDs are unique). After a commit the pass
writes ``state.json``: ``low`` (= W + 1; default searches read the units from there on from PostgreSQL, and
the changes after ``n``: read-your-writes), the generation of the index it describes, and the backlog.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from tantivy import FieldType, Order, Query

from ...uris import UNITS_PREFIX
from ...readindex.schema import document
from ...readindex.writer import IndexWriter
from .queries import sql

log = logging.getLogger(__name__)

PAGE = 5000                         # units (and changes) read per round
COMMIT_EVERY = 50_000               # at most this many changes between commits (builds)
INDEX_CHANGES_KEEP_MS = 60 * 60 * 1000   # change-log rows the janitor keeps (a node away longer rebuilds)


def key_of(cid: str) -> int:
    """A unit's document key: its CID (12 hex digits) as an integer."""
    return int(cid, 16)


def as_document(r) -> object:
    """A unit's read-index document; its ``tokens`` (each term as often as it occurs, the order not kept)
    and its ``unit`` fields' JSON array come made by the query (node_units)."""
    return document(r["day"], key_of(r["cid"]), r, r["tokens"] or "", r["unit"])


class ReadSync:
    """This node's writer of one tenant's read index (only the tenant's maintenance leader holds one)."""

    def __init__(self, store, tenant: str):
        self.store = store
        self.tenant = tenant
        self.config = store.config
        self.index = IndexWriter.of(store, tenant)
        self.watermark = 0                  # every live unit up to this seq is in the index
        self.n: int | None = None           # the change log is applied up to here (None: not read yet)
        self.above: dict[str, int] = {}     # units past the watermark already sent: cid -> seq
        self.tli: int | None = None         # the WAL timeline the index was read from
        self._written: tuple | None = None  # (watermark, n) of the last state written
        self.caught_up = False              # the last pass left nothing: every unit sent, none queued
        # no document of the index expires before this (0: not known; a purge pass finds out)
        self.first_exp = 0

    # --- opening ------------------------------------------------------------------------------
    def _open(self) -> None:
        if self.index.writer is not None:
            return
        self.above, self._written = {}, None
        if not self.index.open():
            state = self._saved_state()
            if state is not None:
                # units past the mark are read (and replaced) again: a crash may have left some sent
                self.watermark, self.n, self.tli = state["low"] - 1, state["n"], state.get("tli")
                return
            self.index.start_empty()        # an index without a state of its own generation: built again
            self.index.open()
        self.watermark, self.n, self.tli = 0, None, None

    def _saved_state(self) -> dict | None:
        try:
            state = json.loads((self.index.path / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return state if state.get("gen") == self.index.gen and "n" in state else None

    def rebuild(self) -> None:
        """Start the index again from nothing: the next passes stream every unit into it."""
        self.index.close()
        self.index.start_empty()
        self.index.open()
        self.watermark, self.n, self.above, self._written, self.tli = 0, None, {}, None, None

    @property
    def building(self) -> bool:
        return self.index.building

    def close(self) -> None:
        self.index.close()

    def due(self) -> bool:
        return time.monotonic() - self.index.last_commit >= self.config.replica_debounce_ms / 1000

    # --- a pass -------------------------------------------------------------------------------
    def sync(self, purge: bool = False) -> int:
        """Apply every change and send every indexed unit past the watermark; commit; write the state.
        Returns the changes sent. On a failure nothing of the pass counts: the next one starts again from
        the last state written (or, while building, from nothing)."""
        self._open()
        self.caught_up = False
        try:
            sent = self._sync(purge)
        except BaseException:
            self.close()
            raise
        if self.building:
            self.index.commit()             # (an empty tenant's build has sent nothing to commit)
            self.index.mark_ready()
        if purge:
            self.first_exp = self._first_expiry()
        return sent

    def _first_expiry(self) -> int:
        """When the index's first document expires, from its last commit (far off when it holds none)."""
        self.index.index.reload()
        hits = self.index.index.searcher().search(Query.all_query(), 1, order_by_field="exp", order=Order.Asc).hits
        return int(hits[0][0]) if hits else 2 ** 62

    def _sync(self, purge: bool) -> int:
        with ThreadPoolExecutor(1, thread_name_prefix="node-index-read") as reads:
            return self._pages(purge, reads)

    def _pages(self, purge: bool, reads: ThreadPoolExecutor) -> int:
        """The pass's pages: while one is applied to the index (CPU in the maintenance worker), the next is read from
        PostgreSQL in ``reads`` (waiting on the server, the GIL released): a build costs about the larger of
        the two, not their sum."""
        sent = unsaved = 0
        after = self.watermark          # this pass's read position: past the units it has read (a unit
        ahead = None                    # still queued keeps the watermark below it, not the reads)
        while True:
            if ahead is None:
                ahead = reads.submit(self.store.db.read_replica, self.tenant, self._read, after, self.n)
            start, pos, changes, units, changed = ahead.result()
            ahead = None
            why = self._diverged(start, pos, changes)
            if why:
                log.warning("read index of tenant %s: %s; building it again", self.tenant, why)
                self.rebuild()
                after = 0
                continue
            if self.n is None:
                self.n = start          # a build starts here: the units it reads already show earlier changes
            if units:
                after = units[-1]["seq"]
            more = len(units) == PAGE or len(changes) == PAGE
            if more:
                ahead = reads.submit(self.store.db.read_replica, self.tenant, self._read, after,
                                     changes[-1]["n"] if changes else start)
            done = self._apply(pos, changes, units, changed)
            sent += done
            unsaved += done
            if purge and not more:
                self._purge_expired()
                unsaved += 1
            if unsaved >= COMMIT_EVERY or (unsaved and not more):
                self.index.commit()
                unsaved = 0
                self._write_state(pos)
            elif not more and self._written != (self.watermark, self.n):
                self._write_state(pos)      # the mark moved past units that are gone: nothing to commit
            if not more:
                self.caught_up = not self.above and pos["queued"] is None and self.watermark >= pos["seq"]
                return sent

    def _read(self, conn, after: int, n: int | None) -> tuple:
        """The change-log position the changes are read after (``n``, or with None the newest: a build),
        positions, changes and the units after ``after``, in one snapshot."""
        args = {"tenant": self.tenant, "now": int(time.time()), "limit": PAGE}
        pos = {**conn.execute(sql("node_positions"), args).fetchone(),
               **conn.execute(sql("node_timeline")).fetchone()}
        start = pos["n"] if n is None else n
        changes = conn.execute(sql("live_events_since"), {**args, "after": start}).fetchall()
        units = conn.execute(sql("node_units"), {**args, "after": after}).fetchall()
        touched = [c["uri"][len(UNITS_PREFIX):] for c in changes
                   if c["uri"].startswith(UNITS_PREFIX) and c["kind"] == "changed"]
        changed = conn.execute(sql("node_units_by_cid"), {**args, "cids": touched}).fetchall() if touched else []
        return start, pos, changes, units, changed

    def _diverged(self, start: int, pos, changes) -> str | None:
        """Why the index no longer follows PostgreSQL's history, if it does not: the change log lost rows this
        node has not applied (pruned while it was away), the server is on another WAL timeline (a standby
        was promoted: what the index read from the old primary may never have reached it), or its seqs went
        back (a restored database)."""
        if pos["tli"] is not None:
            if self.tli is not None and pos["tli"] != self.tli:
                return f"PostgreSQL moved from WAL timeline {self.tli} to {pos['tli']} (a failover)"
            self.tli = pos["tli"]
        if (changes[0]["n"] != start + 1) if changes else pos["n"] > start:
            return "it missed changes the janitor pruned"
        if pos["seq"] < self.watermark:
            return "the tenant's newest seq is below the index's watermark (the database was restored or reset)"
        return None

    def _apply(self, pos, changes, units, changed) -> int:
        w = self.index
        replace = not w.building        # (a build's index holds nothing it could duplicate)
        for c in changes:
            if c["uri"].startswith(UNITS_PREFIX):
                w.delete_key(key_of(c["uri"][len(UNITS_PREFIX):]))
        for r in changed:               # re-pushed and already sent: the unit as it is now (deleted above)
            if r["ntok"] and (r["seq"] <= self.watermark or r["cid"] in self.above):
                w.add(as_document(r))
                if self.first_exp:
                    self.first_exp = min(self.first_exp, r["expires_at"])
        new = 0
        for r in units:
            if r["cid"] in self.above or not r["indexed"]:    # (not indexed yet: sent once it is)
                continue
            new += 1
            if replace:
                w.delete_key(key_of(r["cid"]))
            if r["ntok"]:
                w.add(as_document(r))
                if self.first_exp:
                    self.first_exp = min(self.first_exp, r["expires_at"])
            self.above[r["cid"]] = r["seq"]
        if changes:
            self.n = changes[-1]["n"]
        # the highest seq below which every unit is indexed and sent: the lowest still queued bounds it
        top = units[-1]["seq"] if len(units) == PAGE else pos["seq"]
        if pos["queued"] is not None:
            top = min(top, pos["queued"] - 1)
        self.watermark = max(self.watermark, top)
        self.above = {cid: seq for cid, seq in self.above.items() if seq > self.watermark}
        return len(changes) + new

    def _purge_expired(self) -> None:
        """Expired units out of the index (searches already skip them; this frees space and statistics)."""
        self.index.writer.delete_documents_by_query(
            Query.range_query(self.index.index.schema, "exp", FieldType.Integer, None, int(time.time())))

    def _write_state(self, pos) -> None:
        self.index.write_state({"gen": self.index.gen, "low": self.watermark + 1, "n": self.n, "seq": pos["seq"],
                                "backlog": max(0, pos["seq"] - self.watermark - len(self.above)),
                                "oldest_ms": pos["queued_ms"], "tli": self.tli})
        self._written = (self.watermark, self.n)
