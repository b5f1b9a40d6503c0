"""Impact lists: exact top-k BM25 without scoring every match (DESIGN.md section 11, MaxScore).

FTS5 computes bm25() for every unit matching any OR'ed term, so a query's cost grows with its
matches: about 60k per query over 1M units. Replicas of past days never change once copied, so
the replica copy also gets, per term, its units ordered by impact: tf / (tf + norm) with the
file's own average length (sql/replica_impacts.sql), with tf and the unit's length.

Search then works in three passes over the files (service/search.py drives them):
1. read each query term's best few units per file; their partial scores under the global
   weights are lower bounds; the k best of them are scored exactly (by-unit index), and the
   k-th best score is a threshold;
2. per file, the terms whose unread units can add least are left as they are while their summed
   maxima fit under the threshold (MaxScore); the others are read down to one impact level, so
   that a unit read from no list scores below the threshold;
3. a unit read in some lists but not others has an upper bound (the unread lists' frontier);
   units are scored exactly best upper bound first, raising the threshold, until the next upper
   bound is below it.
The result is the exact top k of the same global BM25 the FTS5 path computes.
"""
from __future__ import annotations

import itertools
import json
import math
import operator
import sqlite3
import time

from .shards import schema, sql

FORMAT = 1             # impact_meta.format of the lists this code reads (sql/replica_impacts.sql)
SCALE = 65536          # impacts are stored as floor(SCALE * tf / (tf + norm))


def _statements(script: str):
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf
            buf = ""


# --- building (the replica leader) ---------------------------------------------------------------
def wanted(conn: sqlite3.Connection, config, day: str, meta: dict, changed_at: float = 0.0) -> bool:
    """Impact lists go into replicas of past days that have been quiet for impact_quiet_s: no push
    into the day and no other change seen (``changed_at``: a delete, the janitor's purge). Today's
    shard changes every second, and rebuilding lists (seconds per 30k units) on each refresh of a
    day still changing (a backfill, a day whose units are expiring) would hold the leader up and
    the index lag with it; such a day is copied without lists, and searched by FTS5, meanwhile."""
    today = time.strftime("%Y-%m-%d", time.gmtime())
    if config.impact_min_docs <= 0 or day >= today or meta.get("ndocs", 0) < config.impact_min_docs:
        return False
    row = conn.execute(sql("shard_last_push")).fetchone()
    last = max(changed_at, row[0] / 1000 if row else 0.0)
    return time.time() - last >= config.impact_quiet_s


def build(conn: sqlite3.Connection, config) -> None:
    """Add impact lists (sql/replica_impacts.sql) to a replica copy, in one transaction."""
    args = {"format": FORMAT, "k1": config.bm25_k1, "b": config.bm25_b}
    conn.execute(f"PRAGMA cache_size=-{64 * 1024}")
    conn.execute("BEGIN")
    try:
        for stmt in _statements(schema("replica_impacts.sql")):
            conn.execute(stmt, args)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def info(conn: sqlite3.Connection) -> dict | None:
    """The file's impact-list parameters, or None when it has none."""
    try:
        row = conn.execute(sql("impact_meta")).fetchone()
    except sqlite3.OperationalError:
        return None
    if row is None:
        return None
    return {"format": row[0], "k1": row[1], "b": row[2], "avgdl": row[3], "version": row[4], "min_expires": row[5]}


def current(meta: dict | None, config) -> bool:
    """Lists of another format or built under other k1 / b are not used (and the leader rebuilds
    them). Search asks only when impact_min_docs > 0 (search.py, lists_ok)."""
    return (meta is not None and meta["format"] == FORMAT
            and meta["k1"] == config.bm25_k1 and meta["b"] == config.bm25_b)


# --- searching -------------------------------------------------------------------------------------
class Lists:
    """What the passes have read of one file's impact lists for one query. Per unit read: its exact
    partial score over the lists it was read from and which lists those were, and once its other
    terms have been looked up, its exact score."""

    def __init__(self, meta: dict, weight_of: dict, avgdl: float, k1: float, b: float):
        self.version = meta["version"]
        self.weight_of = weight_of
        self.bit = {term: 1 << i for i, term in enumerate(weight_of)}
        self.k1, self.b, self.avgdl = k1, b, avgdl
        # Impacts use the file's average length, scores the global one: x_global <= x / (x + c (1 - x)).
        self.c = min(1.0, meta["avgdl"] / avgdl)
        self.tid: dict[str, int] = {}            # terms in this file
        self.bound: dict[str, int] = {}          # term -> units not read from its list have q < bound
        self.lo: dict[int, float] = {}           # doc -> exact score over the lists it was read from
        self.mask: dict[int, int] = {}           # doc -> bits of those lists
        self.exact: dict[int, float] = {}        # doc -> its score (all terms looked up)
        self.expired: set[int] = set()

    def add(self, term: str, rows) -> None:
        """Rows (i, tid, doc, q, part, ntok) of one term's list, part its exact contribution."""
        bit = self.bit[term]
        lo, mask = self.lo, self.mask
        for _i, _tid, doc, _q, part, _ntok in rows:
            seen = mask.get(doc, 0)
            if not seen & bit:
                mask[doc] = seen | bit
                lo[doc] = lo.get(doc, 0.0) + part

    def complete(self, conn, docs: list[int]) -> None:
        """Exact scores of these units: every query term looked up by unit (the by-unit index) and
        summed in SQLite, with the same arithmetic as search._score."""
        args = {"docs": json.dumps(docs), "k1": self.k1, "b": self.b, "avgdl": self.avgdl}
        weight = []
        for i, (term, tid) in enumerate(self.tid.items()):
            args[f"tid{i}"], args[f"w{i}"] = tid, self.weight_of[term]
            weight.append(f"WHEN :tid{i} THEN :w{i}")
        if not weight:
            return
        tids = ", ".join(f":tid{i}" for i in range(len(weight)))
        query = (f"SELECT doc, sum(CASE tid {' '.join(weight)} END * tf / (tf + :k1 * (1 - :b + :b * ntok / :avgdl))) "
                 f"FROM impacts INDEXED BY impacts_by_unit "
                 f"WHERE doc IN (SELECT value FROM json_each(:docs)) AND tid IN ({tids}) GROUP BY doc")
        self.exact.update(conn.execute(query, args).fetchall())

    def unread_max(self, term: str) -> float:
        """The largest global impact a unit not read from this term's list can have."""
        x = self.bound.get(term, 0) / SCALE
        return 0.0 if x <= 0 else min(1.0, x / (x + self.c * (1 - x)))

    def levels(self, threshold: float) -> dict[str, int]:
        """How far to read each list so that a unit read from none scores below ``threshold``.

        MaxScore: the terms whose unread units can add least (common terms, low weight) are not read
        further as long as their summed maxima stay within the threshold; the other terms share what
        is left of it as one impact level. A unit holding none of the listed terms above their level
        has each contribution below its share, so its score is below the threshold. Returns
        term -> the q to read down to, for the lists that need reading.
        """
        unread = sorted((self.weight_of[t] * self.unread_max(t), t) for t in self.bound if self.bound[t] > 0)
        spent = 0.0
        essential = []
        for i, (u, term) in enumerate(unread):
            if spent + u > threshold:
                essential = [t for _, t in unread[i:]]
                break
            spent += u
        wsum = sum(self.weight_of[t] for t in essential)
        if not essential or wsum <= 0:
            return {}
        x = (threshold - spent) / wsum              # in global-impact units
        if x >= 1:
            return {}
        x_file = x * self.c / (1 - x + x * self.c)  # the same bound in this file's units
        q = max(0, math.floor(x_file * SCALE) - 1)  # one step lower: float rounding never excludes
        return {t: q for t in essential if self.bound[t] > q}

    def live(self, doc: int) -> bool:
        return doc not in self.expired

    def lows(self):
        """Each live unit's exact score when known, else its partial score (a lower bound)."""
        exact, expired = self.exact, self.expired
        return (exact.get(doc, lo) for doc, lo in self.lo.items() if doc not in expired)

    def candidates(self, threshold: float) -> list[tuple[float, int]]:
        """(upper bound, doc) of the live units read but not yet exact whose upper bound (exact part +
        the unread lists' maxima) reaches threshold."""
        unread = {self.bit[t]: self.weight_of[t] * self.unread_max(t) for t in self.bound}
        extra: dict[int, float] = {}
        out = []
        exact, expired = self.exact, self.expired
        for doc, lo in self.lo.items():
            if doc in exact or doc in expired:
                continue
            m = self.mask[doc]
            up = extra.get(m)
            if up is None:
                up = extra[m] = sum(u for bit, u in unread.items() if not m & bit)
            if lo + up >= threshold:
                out.append((lo + up, doc))
        return out


def _read_lists(lists: Lists, conn, *, top: dict[str, int] | None = None, levels: dict[str, int] | None = None,
                limit: int | None = None) -> list[list[tuple]]:
    """Rows (i, tid, doc, q, part, ntok) of some terms' lists in one statement, part the term's exact
    contribution to the unit's score: each term's best ``top[term]`` units, or its units down to
    ``levels[term]``; at most ``limit`` rows in all. One list of rows per term, in that order."""
    cuts = top if top is not None else levels
    args: dict = {"k1": lists.k1, "b": lists.b, "avgdl": lists.avgdl}
    parts = []
    for i, (term, cut) in enumerate(cuts.items()):
        args[f"t{i}"], args[f"w{i}"], args[f"c{i}"] = term, lists.weight_of[term], cut
        where = f"ORDER BY q DESC LIMIT :c{i}" if top is not None else f"AND q >= :c{i}"
        parts.append(f"SELECT {i}, tid, doc, q, :w{i} * tf / (tf + :k1 * (1 - :b + :b * ntok / :avgdl)), ntok "
                     f"FROM (SELECT tid, doc, q, tf, ntok FROM impacts "
                     f"WHERE tid = (SELECT tid FROM impact_terms WHERE term = :t{i}) {where})")
    query = " UNION ALL ".join(parts)
    if limit is not None:
        args["limit"] = limit
        query += " LIMIT :limit"
    out: list[list[tuple]] = [[] for _ in cuts]
    for i, group in itertools.groupby(conn.execute(query, args).fetchall(), key=operator.itemgetter(0)):
        out[i] = list(group)
    return out


def first_pass(conn, meta: dict, weight_of: dict, avgdl: float, k1: float, b: float,
               top: dict[str, int], now: int) -> Lists:
    """Pass 1: each query term's best top[term] units in this file."""
    lists = Lists(meta, weight_of, avgdl, k1, b)
    for (term, limit), rows in zip(top.items(), _read_lists(lists, conn, top=top)):
        if rows:                                   # no rows: the term is not in this file
            lists.tid[term] = rows[0][1]
            lists.add(term, rows)
            lists.bound[term] = rows[-1][3] + 1 if len(rows) == limit else 0
    if meta["min_expires"] is not None and meta["min_expires"] <= now:
        lists.expired = {r[0] for r in conn.execute(sql("expired_ids"), {"now": now})}
    return lists


def same_file(conn, lists: Lists) -> bool:
    """False when a refresh replaced the file since pass 1 read it."""
    meta = info(conn)
    return meta is not None and meta["version"] == lists.version


def read_down_to(conn, lists: Lists, levels: dict[str, int], limit: int) -> bool:
    """Pass 2: read lists down to their levels. False when that is more than ``limit`` units, or the
    file is not the one pass 1 read: the caller falls back to FTS5."""
    if not same_file(conn, lists):
        return False
    found = _read_lists(lists, conn, levels=levels, limit=limit + 1)
    if sum(map(len, found)) > limit:
        return False
    for term, rows in zip(levels, found):
        lists.add(term, rows)
        lists.bound[term] = levels[term]
    return True


def complete(conn, lists: Lists, docs: list[int]) -> bool:
    if not same_file(conn, lists):
        return False
    lists.complete(conn, docs)
    return True
