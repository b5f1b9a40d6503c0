"""The read index on SQLite (docs/design.md §6.1): the tenant's maintenance leader sends indexed rows from the
primary day shards to the tenant's index (service/readindex/) with exactly the tokens FTS5 holds; FTS5 stays
the index of record (push -> pending row -> indexer).

Sync protocol, per shard row (``units.indexed``): 1 = in FTS5, not sent; 2 = sent; 3 = sent, but a duplicate
push changed its mutable fields (type, ttl, metadata, parent) since. A pass reads rows 1/3 and the
``read_deletes`` tombstones in one snapshot; deletes by key what must go (tombstones; rows 3; and every row
after a leader change or a failed pass, so a crash between the commit and the flag flip cannot leave a
document twice); adds the rows; commits; then flips the flags. A rebuild streams every indexed row of every
shard, in pages, and marks the new index ready when that first full pass is committed.
"""
from __future__ import annotations

import json
import time

from ...readindex.schema import day_key, document
from ...readindex.writer import IndexWriter
from ...units import MUTABLE_FIELDS
from .queries import fetch_one, sql

SYNC_BATCH = 5000              # rows (and tombstones) read per shard per round
COMMIT_EVERY = 50_000          # at most this many changes before a commit (bulk builds)


def _snapshot(conn, limit: int):
    """Unsent rows and tombstones of one shard, read in one snapshot."""
    conn.execute("BEGIN")
    try:
        rows = conn.execute(sql("sync_rows"), {"limit": limit}).fetchall()
        deletes = conn.execute(sql("sync_deletes"), {"limit": limit}).fetchall()
    finally:
        conn.execute("COMMIT")
    return rows, deletes


def _page(conn, after: int, limit: int):
    """A rebuild's next page of indexed rows (any sync state) of one shard."""
    return conn.execute(sql("sync_page"), {"after": after, "limit": limit}).fetchall()


def _mark_sent(conn, rows, last_delete: int | None) -> None:
    # Rows read as 1 that a push changed meanwhile are 3 now (unit_upsert) and stay so; rows read as
    # 3 (rare) are compared field by field, since a second change leaves them 3.
    conn.execute(sql("sync_mark_new"), {"ids": json.dumps([r["id"] for r in rows if r["indexed"] == 1])})
    conn.executemany(sql("sync_mark"), ({"id": r["id"], **{name: r[name] for name in MUTABLE_FIELDS}}
                                        for r in rows if r["indexed"] == 3))
    if last_delete is not None:
        conn.execute(sql("sync_deletes_done"), {"n": last_delete})


class ReadSync:
    """The leader's side of one tenant's read index: sync passes, day drops, rebuilds. Closed when the leader
    lets go of the tenant (idle, or least recently used past its writers: service/budget.py); a new one then
    starts as a new leader would, replacing what it sends."""

    def __init__(self, store, name: str):
        self.store = store
        self.name = name
        self.config = store.config
        self.index = IndexWriter.of(store, name)
        self.state: dict | None = None       # the state this writer last wrote
        self.replacing = True       # delete before add: a previous leader may have sent rows unflagged
        self.dropped: set[str] = set()
        self.gone_done: set[str] = set()
        self._streamed: dict[str, int] = {}   # while building: the last rowid sent per day

    @property
    def t(self):
        """The tenant's files, as the store holds them now (it may have closed and opened them again)."""
        return self.store.tenant(self.name)

    def _open(self) -> None:
        if self.index.open():
            # Started empty: the next pass streams every indexed row of every shard into it (readers use
            # the primaries until it is ready). Tombstones so far name rows already gone (not streamed);
            # a reused rowid must not lose its new document to one of them.
            for day in self.t.primary_days():
                db = self.t.shard(day, create=False)
                if db is not None:
                    db.write(lambda c: c.execute(sql("sync_reset_deletes")))
            self._streamed = {}
            self.replacing = False      # the index is empty: nothing to replace

    def _unsent(self) -> bool:
        """Whether any day file holds a row the index lacks (or changed since it was sent) or a tombstone."""
        for day in self.t.primary_days():
            db = self.t.shard(day, create=False)
            if db is not None and db.read(fetch_one, "sync_any")[0]:
                return True
        return False

    def rebuild(self) -> None:
        """Start the index again from nothing (what a new format or a damaged index starts): the next pass
        streams every indexed row into it."""
        self.index.start_empty()

    @property
    def building(self) -> bool:
        return self.index.building

    def close(self) -> None:
        self.index.close()

    def drop_day(self, day: str) -> None:
        """The janitor unlinked a day: its documents go at the next pass."""
        self.dropped.add(day)

    # --- a sync pass --------------------------------------------------------------------------
    def due(self) -> bool:
        return self.wait() <= 0

    def wait(self) -> float:
        """Seconds until a pass may commit again (CONTEXT_REPLICA_DEBOUNCE_MS after the last commit)."""
        return self.index.last_commit + self.config.replica_debounce_ms / 1000 - time.monotonic()

    def sync(self) -> int:
        """Send every unsent change of every shard; commit; flip flags. Returns changes sent. With nothing to
        send the writer is not opened (its threads and files: a tenant that settled costs none)."""
        if self.index.writer is None and not self.dropped and self.index.usable() and not self._unsent():
            return 0
        self._open()
        try:
            return self._sync()
        except BaseException:
            self.replacing = True
            if self.building:
                self.close()        # not ready: the next pass builds it again from the start
                raise
            self.index.rollback()
            raise

    def _sync(self) -> int:
        w = self.index
        sent = 0
        pending: list = []        # (day, rows, last tombstone n) to flag once committed
        days = self.t.primary_days()
        dropped = self._drop_gone_days(set(days))
        committed = 0             # changes sent as of the last commit
        full_round = True
        while full_round:
            full_round = False
            for day in days:
                db = self.t.shard(day, create=False)
                if db is None:
                    continue
                if self.building:
                    # every indexed row, in pages: rows sent before (2) need no flag change
                    after = self._streamed.get(day, 0)
                    rows, deletes = db.read(_page, after, SYNC_BATCH), []
                    if rows:
                        self._streamed[day] = rows[-1]["id"]
                else:
                    rows, deletes = db.read(_snapshot, SYNC_BATCH)
                if not rows and not deletes:
                    continue
                base = day_key(day, 0)
                full_round = full_round or len(rows) == SYNC_BATCH or len(deletes) == SYNC_BATCH
                for d in deletes:
                    w.delete_key(base + d["id"])
                for r in rows:
                    key = base + r["id"]
                    if self.replacing or r["indexed"] == 3:
                        w.delete_key(key)
                    if r["tokens"]:
                        w.add(document(day, key, r))
                # by day, not Db: the store may close a least recently used shard before the commit
                pending.append((day, [r for r in rows if r["indexed"] != 2], deletes[-1]["n"] if deletes else None))
                sent += len(rows) + len(deletes)
                if sent - committed >= COMMIT_EVERY:
                    self._commit(pending)
                    committed, pending = sent, []
        if pending or dropped:
            self._commit(pending)
        if not full_round:
            self.replacing = False
            if self.building:
                self.index.mark_ready()
                self._streamed.clear()
        return sent

    def _commit(self, pending) -> None:
        self.index.commit()
        for day, rows, last_delete in pending:
            db = self.t.shard(day, create=False)
            if db is not None:
                db.write(_mark_sent, rows, last_delete)

    def _drop_gone_days(self, days: set[str]) -> int:
        """Delete the documents of days whose files are gone: the janitor's unlinks, and whatever a
        crash between an unlink and its commit left behind (the days in the term dictionary, which
        keeps a deleted day's name until a merge; ``gone_done`` remembers those already dropped)."""
        gone = (self.index.days() | self.dropped) - days - self.gone_done
        for day in gone:
            self.index.delete_day(day)
        self.gone_done = (self.gone_done | gone) - days
        self.dropped.clear()
        return len(gone)

    def write_state(self, seq: int, backlog: int, oldest_ms: int | None, low: int) -> None:
        """What the index lacked at the end of a pass among the units up to ``seq`` (the catalog's
        newest when the pass began), for the freshness reports of every worker; ``low``: every unit
        below this seq is in the index (read-your-writes reads the rest from the primaries)."""
        self.state = {"seq": seq, "backlog": backlog, "oldest_ms": oldest_ms, "low": low}
        self.index.write_state(self.state)


def backlog(t, seq: int = 2 ** 62) -> tuple[int, int | None, int]:
    """(rows the read index lacks, oldest push among them in ms, lowest seq of a unit it lacks or
    ``seq`` + 1) over a tenant's shards, among the units up to ``seq``."""
    total, oldest, low = 0, None, seq + 1
    for day in t.primary_days():
        db = t.shard(day, create=False)
        if db is None:
            continue
        n, first, lowest = db.read(lambda c: c.execute(sql("sync_backlog"), {"seq": seq}).fetchone())
        total += n
        if n and first < 1e18:
            oldest = int(first) if oldest is None else min(oldest, int(first))
        if lowest < 9e18:
            low = min(low, int(lowest))
    return total, oldest, low
