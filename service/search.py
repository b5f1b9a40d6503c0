"""Search (DESIGN.md sections 4 and 6): query tokens, global BM25 over the live days.

Two paths, one ranking. Default searches read the tenant's read index (service/readindex.py): one
tantivy index over every live day, so BM25's statistics are global by construction and the top k
comes from compiled block-max WAND, whatever the number of days or matches. Strong and
``after_seq`` reads, and any tenant whose read index is not built yet, read the primary day shards'
FTS5 tables: per shard the matches scored with the global statistics (all of them when few, else
a generous local top-N by FTS5's own rank), merged. Both use FTS5's BM25 formula with Lucene's
always-positive idf and exact document lengths (the read index's candidates are scored again
with them: tantivy keeps a length in one byte).
"""
from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import readindex
from .errors import TooCostly
from .indexer import index_pending
from .params import SearchParams
from .rows import unit_dict
from .shards import fetch_all, sql
from .units import day_of

log = logging.getLogger(__name__)

MAX_QUERY_TERMS = 64
RESCORE_FACTOR = 2            # the read index's candidates per result, scored again with exact lengths
# ... at most this many when near ties need more: past it the answer is the exact order of
# tantivy's best 200 (at 1M units a cap of 1000 put p99 at 82 ms, 200 at 21 ms; score lists
# still equal exhaustive scoring on every bench query, bench/README.md)
RESCORE_MAX = 200
# Read-your-writes: a day with at most this many units the read index lacks is scanned row by row
# (by their partial index); with more (a bulk import), FTS5 finds the matches among them.
TAIL_SCAN_MAX = 5000
SNIPPET_CHARS = 200
# Context built for a model (packed context, prompts) leaves out results scoring under this share of
# the best one's raw BM25: on the judged sets fewer than 1 % of the relevant top-10 units do
# (bench/score_scale.py, "relative"), while a weak tail would pad the prompt with noise.
NEAR_BEST = 0.4


def fts_query(terms: list[str], operator: str) -> str:
    """Quote every token: the user's text never becomes FTS5 syntax."""
    joiner = " AND " if operator == "and" else " OR "
    return joiner.join('"' + t.replace('"', '""') + '"' for t in terms)


def _shard_stats(conn, terms: list[str]) -> dict:
    """A shard's BM25 statistics: indexed documents, token total, document frequency per term."""
    meta = {r[0]: r[1] for r in conn.execute(sql("meta_get"))}
    df = dict.fromkeys(terms, 0)
    for term in df:
        row = conn.execute(sql("vocab_df"), {"term": term}).fetchone()
        df[term] = row["doc"] if row else 0
    return {"ndocs": meta.get("ndocs", 0), "ntokens": meta.get("ntokens", 0), "df": df}


def _filters(p: SearchParams, args: dict) -> list[str]:
    """SQL conditions for the request's filters; every value is a bound parameter."""
    where = ["u.expires_at > :now"]
    if p.types:
        names = []
        for i, t in enumerate(p.types):
            args[f"type{i}"] = t
            names.append(f":type{i}")
        where.append(f"u.type IN ({', '.join(names)})")
    if p.source:
        if p.source.endswith("*"):
            args["source"] = p.source[:-1]
            where.append("substr(u.source, 1, length(:source)) = :source")
        else:
            args["source"] = p.source
            where.append("u.source = :source")
    if p.since is not None:
        args["since"] = p.since
        where.append("u.timestamp >= :since")
    if p.until is not None:
        args["until"] = p.until
        where.append("u.timestamp <= :until")
    if p.parent_cid:
        args["parent"] = p.parent_cid
        where.append("u.parent_cid = :parent")
    return where


def _shard_top(conn, p: SearchParams, match: str, terms: list[str], weights: list[float], avgdl: float,
               k1: float, b: float, local_n: int | None, k: int, now: int) -> list[tuple]:
    """One shard's best k FTS matches under the *global* BM25 weights, scored inside SQLite; rows
    are (score, cid, id, ntok, tf...).

    ``local_n`` None scores every match (exact). Otherwise FTS5's own rank (local statistics)
    first keeps a generous local top-N: only for matches too many to score one by one.
    """
    args: dict = {"match": match}
    where = ["units_fts MATCH :match"] + _filters(p, args)
    local = ""
    if local_n is not None:
        args["n"] = local_n
        local = " ORDER BY units_fts.rank LIMIT :n"
    source = f"FROM units_fts JOIN units u ON u.id = units_fts.rowid WHERE {' AND '.join(where)}{local}"
    return _score(conn, source, args, terms, weights, avgdl, k1, b, k, now)


class CpuBudget:
    """The CPU one search may spend in SQLite, over every shard it reads (threads included).

    SQLite calls ``check`` every few thousand virtual-machine steps; past the budget it interrupts
    the statement, and the search answers 422 instead of holding a worker for seconds."""
    STEPS = 20_000

    def __init__(self, ms: int):
        self.limit = ms / 1000 if ms > 0 else None
        self.spent = 0.0              # by finished statements
        self._lock = threading.Lock()

    def run(self, conn, fn, *args):
        if self.limit is None:
            return fn(conn, *args)
        start = time.thread_time()
        conn.set_progress_handler(lambda: self.spent + time.thread_time() - start > self.limit, self.STEPS)
        try:
            return fn(conn, *args)
        except sqlite3.OperationalError as e:
            if "interrupted" not in str(e):
                raise
            raise TooCostly(f"This search needed more than {int(self.limit * 1000)} ms of CPU on the primary "
                            "files; use fewer or rarer terms, a filter, or a default (replica) search.",
                            field="query") from None
        finally:
            conn.set_progress_handler(None, 0)
            with self._lock:
                self.spent += time.thread_time() - start


def _score(conn, source: str, args: dict, terms: list[str], weights: list[float], avgdl: float,
           k1: float, b: float, k: int, now: int, require: str | None = None) -> list[tuple]:
    """The best k units of ``source`` (SQL: FROM ... WHERE ..., alias u for units) under the global
    BM25 weights; rows are (score, cid, id, ntok, tf...).

    Term frequencies come from units.tokens: with spaces doubled, occurrences of ' term ' are
    counted by length arithmetic, in C, without sending documents to Python. ``require`` ("or",
    "and") keeps only units holding any or every query term (when ``source`` is not an FTS5 match).
    """
    args.update({"k": k, "now": now, "k1": k1, "b": b, "avgdl": avgdl})
    tf_cols, score_terms = [], []
    for i, (term, w) in enumerate(zip(terms, weights)):
        args[f"p{i}"] = f" {term} "
        tf_cols.append(f"(length(t) - length(replace(t, :p{i}, ''))) / length(:p{i}) AS tf{i}")
        args[f"w{i}"] = w
        score_terms.append(f":w{i} * tf{i} / (tf{i} + norm)")
    tfs = [f"tf{i}" for i in range(len(terms))]
    having = ""
    if require == "and":
        having = "WHERE " + " AND ".join(f"{tf} > 0" for tf in tfs) + " "
    elif require == "or":
        having = "WHERE " + " + ".join(tfs) + " > 0 "
    query = (
        "WITH c AS MATERIALIZED (SELECT u.id AS id, u.cid AS cid, u.ntok AS ntok, "
        f"' ' || replace(u.tokens, ' ', '  ') || ' ' AS t {source}), "
        f"s AS MATERIALIZED (SELECT id, cid, ntok, :k1 * (1 - :b + :b * ntok / :avgdl) AS norm, {', '.join(tf_cols)} FROM c) "
        f"SELECT {' + '.join(score_terms)} AS score, cid, id, ntok, {', '.join(tfs)} "
        f"FROM s {having}ORDER BY score DESC, cid LIMIT :k")
    return [tuple(r) for r in conn.execute(query, args)]


def _rows_by_id(conn, ids: list[int]) -> dict:
    return {r["id"]: r for r in conn.execute(sql("units_by_ids"), {"ids": json.dumps(ids)})}


@dataclass
class Ranked:
    """One winning unit: its public fields, raw BM25 score, and what explain reports."""
    unit: dict
    score: float
    doc_len: int          # in tokens, exact on both paths
    tfs: list[int]


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
        # spaces doubled, as _score does in SQL: " term " occurrences then never overlap
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

    def add(self, pushed_ms: int) -> None:
        self.count += 1
        self.oldest_ms = pushed_ms if self.oldest_ms is None else min(self.oldest_ms, pushed_ms)

    def report(self) -> tuple[int, int]:
        return self.count, max(0, int(time.time() * 1000 - self.oldest_ms)) if self.oldest_ms else 0


@dataclass(frozen=True)
class Tail:
    """Read-your-writes: what a default search reads from the primaries because the read index may
    lack it: the units at or past the low-water mark of the leader's last pass (every unit below it
    is in the index), by day."""
    low: int
    seq: int                  # the tenant's newest unit when the search began
    days: dict[str, int]      # day -> units at or past ``low``


class Searcher:
    def __init__(self, config, tokenizer, readers: readindex.Readers):
        self.config = config
        self.tokenizer = tokenizer
        self.readers = readers
        self.tokens = TokenCache()
        self._live_days: dict[str, tuple[float, list[str]]] = {}
        self.pool = ThreadPoolExecutor(max(1, self.config.search_threads), thread_name_prefix="search")

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def view(self, t):
        """The tenant's read index for default searches, or None (not built yet, or turned off)."""
        if not self.config.replicas or not readindex.bm25_supported(self.config):
            return None
        return self.readers.view(t)

    def _days(self, t, first: str, last: str, fresh: bool) -> list[str]:
        """The live days in [first, last]. Searches of the read index only report how many (its
        filters do the rest), so they share one catalog read per tenant and second."""
        if fresh:
            return t.live_days(first, last)
        now = time.monotonic()
        cached = self._live_days.get(t.name)
        if cached is None or now - cached[0] > 1.0:
            cached = self._live_days[t.name] = (now, t.live_days())
        return [d for d in cached[1] if first <= d <= last]

    def _catch_up(self, t, days, wait_ms: int) -> None:
        """Read-your-writes: index what is pending in these shards now, bounded in time."""
        deadline = time.monotonic() + wait_ms / 1000
        for day in days:
            db = t.shard(day, create=False)
            while db is not None and time.monotonic() < deadline:
                if index_pending(db, self.tokenizer, self.config.index_batch) < self.config.index_batch:
                    break

    def _tail(self, t, state: dict | None, first: str, last: str) -> Tail | None:
        """The days of the units a default search reads from the primaries, or None when
        read-your-writes is off or they are too many (a bulk import: freshness reports them)."""
        if self.config.read_your_writes_ms <= 0:
            return None
        low = (state or {}).get("low", 0)

        def read(c):
            seq = c.execute(sql("catalog_max_seq")).fetchone()[0]
            days = {r["day"]: r["n"] for r in c.execute(
                sql("ryw_tail_days"), {"low": low, "first": first, "last": last})}
            return seq, days
        seq, days = t.catalog.read(read)
        if sum(days.values()) > self.config.read_your_writes_max:
            return None
        return Tail(low, seq, days)

    # --- search -------------------------------------------------------------------------------
    def search(self, t, p: SearchParams) -> dict:
        start = time.perf_counter()
        now = int(time.time())
        first = day_of(p.since) if p.since is not None else "0000-00-00"
        last = day_of(p.until) if p.until is not None else "9999-99-99"
        view = tail = None
        if not p.strong:
            # the leader's state before the view: a view loaded after it holds every unit below its mark
            state = self.readers.state(t)
            view = self.view(t)
            if view is not None:
                tail = self._tail(t, state, first, last)
        days = self._days(t, first, last, fresh=view is None)
        terms = self.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS]
        if p.strong:
            self._catch_up(t, days, self.config.strong_wait_ms)
        results: list[dict] = []
        unseen = None
        if terms and (days or (tail and tail.days)):
            budget = CpuBudget(self.config.search_cpu_ms)
            if view is not None:
                ranked, stats, unseen = self._search_index(t, p, terms, view, now, tail, budget)
            else:
                # read-your-writes on the primaries too (no read index yet): pending units by their tokens
                unseen = Unseen() if not p.strong and self.config.read_your_writes_ms > 0 else None
                ranked, stats = self._search_shards(t, p, terms, days, now, budget, unseen)
            results = self._results(p, terms, ranked, stats)
        if unseen is not None:
            pending, replica_lag = unseen.report()
        elif tail is not None:
            pending, replica_lag = self._tail_freshness(t, tail)
        else:
            pending, replica_lag = self.freshness(t, days, view)
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": len(set(days) | set(tail.days if tail else ())),
                "freshness": {"replica_lag_ms": replica_lag, "index_pending": pending}}

    def _tail_freshness(self, t, tail: Tail) -> tuple[int, int]:
        """With read-your-writes: the units acknowledged before the search that it could not see
        (still pending after the catch-up), and how long the oldest of them has waited."""
        pending, oldest = 0, None
        for day in tail.days:
            db = t.shard(day, create=False)
            if db is None:
                continue
            n, first = db.read(lambda c: c.execute(sql("ryw_pending"), {"seq": tail.seq}).fetchone())
            pending += n
            if n:
                oldest = first if oldest is None else min(oldest, first)
        return pending, max(0, int(time.time() * 1000 - oldest)) if oldest else 0

    def freshness(self, t, days: list[str], view=None, exact: bool = False) -> tuple[int, int]:
        """(units a search of this kind cannot see yet, ms the oldest of them has waited).

        With the read index: what the leader's last pass left for the next one (every worker reads
        it from one small file), or counted now in every shard when ``exact`` (readiness, metrics).
        On the primaries: rows still pending in these shards.
        """
        if view is not None:
            if exact:
                backlog, oldest, _ = readindex.backlog(t)
            else:
                state = self.readers.state(t) or {}
                backlog, oldest = state.get("backlog", 0), state.get("oldest_ms")
                # plus what arrived after that pass began (a range of the catalog's primary key)
                since, first = t.catalog.read(lambda c: c.execute(
                    sql("catalog_since_seq"), {"seq": state.get("seq", 0)}).fetchone())
                backlog += since
                if first is not None:
                    oldest = min(oldest or first, first)
            return backlog, max(0, int(time.time() * 1000 - oldest)) if oldest else 0
        pending = 0
        for day in days:
            db = t.shard(day, create=False)
            if db is not None:
                pending += db.read(lambda c: c.execute(sql("pending_count")).fetchone()[0])
        return pending, 0

    def _search_index(self, t, p: SearchParams, terms: list[str], view, now: int, tail: Tail | None,
                      budget: CpuBudget):
        """The read index's candidates (tantivy), scored again with exact lengths, merged with the
        units it lacks (``tail``, read from the primaries); the top k with the units' fields."""
        k1, b = readindex.K1, readindex.B
        for _ in range(3):
            # a term only the tail holds weighs what it would in one unit
            unknown = readindex.unknown_idf(view.ndocs) if tail is not None else 0.0
            idf = [view.idf(term) or unknown for term in terms]
            weights = [w * (k1 + 1) for w in idf]
            avgdl = readindex.mean_length(view, terms)
            unseen = Unseen()
            fresh = self._tail_top(t, p, terms, weights, avgdl, tail, now, budget, unseen) if tail else []
            # A pass that committed while the tail was read may have flagged rows sent that this view
            # lacks: read both again against the new commit.
            if tail is None or not readindex.moved(t, view):
                break
            view = self.view(t) or view
        ranked = list(fresh)
        if all(idf) or p.operator == "or":
            ranked += self._index_top(t, p, terms, weights, view, now, {r.unit["cid"] for r in fresh})
        stats = {"idf": idf, "k1": k1, "b": b, "documents": view.ndocs,
                 "avgdl": readindex.mean_length(view, terms)}
        return ranked, stats, (unseen if tail is not None else None)

    def _index_top(self, t, p: SearchParams, terms, weights, view, now: int, fresher: set[str]) -> list[Ranked]:
        """The read index's best k, without the units deleted or expired since they were sent
        (the catalog says which) and those ``fresher`` read from the primaries."""
        k = p.top_k
        want = RESCORE_FACTOR * k
        for _ in range(8):
            hits = readindex.search(view, p, terms, now, want=want)
            scored, complete = readindex.rescore(view, hits, terms, weights, k)
            units = readindex.units(view, [x.hit for x in scored])
            cids = [u["cid"] for u in units]
            drop = self._gone(t, cids, now) | fresher.intersection(cids)
            if drop and len(cids) - len(drop) < p.top_k and len(hits) == want and k < p.top_k + len(drop):
                k = p.top_k + len(drop)       # room for the next best in place of the dropped ones
                want = max(want, RESCORE_FACTOR * k)
                continue
            if complete or len(hits) < want or want >= RESCORE_MAX:
                break
            want *= 4     # a document past these candidates could still win with its exact length
        return [Ranked(unit, x.score, x.length, x.tfs) for unit, x in zip(units, scored) if unit["cid"] not in drop]

    def _gone(self, t, cids: list[str], now: int) -> set[str]:
        """Of these CIDs, the ones deleted or expired (by a push that changed their ttl) since the read
        index got them: they leave search at once, not at its next pass."""
        if not cids:
            return set()
        return {r[0] for r in t.catalog.read(lambda c: c.execute(
            sql("ryw_gone"), {"cids": json.dumps(cids), "now": now}).fetchall())}

    def _tail_top(self, t, p: SearchParams, terms, weights, avgdl: float, tail: Tail, now: int,
                  budget: CpuBudget, unseen: "Unseen") -> list[Ranked]:
        """The best k of the units the read index lacks, scored like the index's with its statistics:
        those in FTS5 but not sent (or changed since) by SQL, those still pending by their tokens,
        made here (cached per process) within read_your_writes_ms; the rest are ``unseen``."""
        live = [term for term, w in zip(terms, weights) if w]
        found = []
        deadline = time.monotonic() + self.config.read_your_writes_ms / 1000
        for day, n in tail.days.items():
            db = t.shard(day, create=False)
            if db is None or not live:
                continue
            args: dict = {"low": tail.low}
            where = ["u.indexed IN (1, 3)", "u.seq >= :low", "u.ntok > 0"] + _filters(p, args)
            if n <= TAIL_SCAN_MAX or db.read(lambda c: c.execute(sql("ryw_unsent")).fetchone()[0]) <= TAIL_SCAN_MAX:
                # (INDEXED BY: the planner would rather walk units_expires, i.e. the whole day)
                source, require = f"FROM units u INDEXED BY units_unsynced WHERE {' AND '.join(where)}", p.operator
            else:
                args["match"] = fts_query(list(dict.fromkeys(live)), p.operator)
                source = f"FROM units_fts JOIN units u ON u.id = units_fts.rowid WHERE units_fts MATCH :match AND {' AND '.join(where)}"
                require = None
            rows = db.read(budget.run, _score, source, args, terms, weights, avgdl, readindex.K1, readindex.B,
                           p.top_k, now, require)
            rows += self._pending_top(t, db, day, p, terms, weights, avgdl, now, deadline, unseen, budget=budget)
            rows.sort(key=lambda r: (-r[0], r[1]))
            rows = rows[:p.top_k]
            if rows:
                units = db.read(_rows_by_id, [r[2] for r in rows])
                found += [Ranked(unit_dict(units[r[2]]), r[0], r[3], list(r[4:])) for r in rows if r[2] in units]
        found.sort(key=lambda r: (-r.score, r.unit["cid"]))
        return found[:p.top_k]

    def _pending_top(self, t, db, day: str, p: SearchParams, terms, weights, avgdl: float, now: int,
                     deadline: float, unseen: "Unseen", k1: float = readindex.K1, b: float = readindex.B,
                     budget: "CpuBudget | None" = None) -> list[tuple]:
        """Rows (score, cid, id, ntok, tf...) of the best k units of this shard still waiting for the
        indexer. Their tokens are made by the first search that meets them (while time allows) and
        stored in the row when the file is free at once, so other workers and the indexer reuse
        them; until then this process keeps them (``TokenCache``)."""
        args: dict = {"now": now}
        where = ["u.indexed = 0"] + _filters(p, args)
        rows = []
        if avgdl:
            # the tokens are in the row: scored in SQL like the others
            source = f"FROM units u INDEXED BY units_pending WHERE {' AND '.join(where + ['u.ntok > 0'])}"
            run = budget.run if budget is not None else (lambda conn, fn, *a: fn(conn, *a))
            rows = db.read(run, _score, source, dict(args), terms, weights, avgdl, k1, b, p.top_k, now, p.operator)
        bare = db.read(lambda c: c.execute(
            f"SELECT u.id, u.cid, u.pushed_ms FROM units u INDEXED BY units_pending "
            f"WHERE {' AND '.join(where + ['u.tokens IS NULL'])}", args).fetchall())
        if not bare:
            return rows
        known = {r["id"]: self.tokens.get(t.name, day, r["id"], r["cid"]) for r in bare}
        missing = [r for r in bare if known[r["id"]] is None]
        made = []
        for start in range(0, len(missing), 64):
            if time.monotonic() > deadline:
                for r in missing[start:]:
                    unseen.add(r["pushed_ms"])
                break
            chunk = missing[start:start + 64]
            contents = {r["id"]: r["content"] for r in db.read(
                fetch_all, "units_content_by_ids", {"ids": json.dumps([r["id"] for r in chunk])})}
            for r in chunk:
                if r["id"] in contents:
                    toks = self.tokenizer.tokens(contents[r["id"]])
                    known[r["id"]] = self.tokens.put(t.name, day, r["id"], r["cid"], toks)
                    made.append({"id": r["id"], "tokens": " ".join(toks), "ntok": len(toks)})
        if made:
            try:
                db.try_write(lambda c: c.executemany(sql("ryw_store_tokens"), made))
            except Exception as e:  # noqa: BLE001  (sharing them is optional: the indexer makes them anyway)
                log.debug("tokens of pending units not stored: %s", e)
        for r in bare:
            entry = known.get(r["id"])
            if entry is None:
                continue
            padded, ntok = entry
            tfs = [padded.count(f" {term} ") for term in terms]
            if not ntok or (p.operator == "and" and not all(tfs)) or not any(tfs):
                continue
            norm = k1 * (1 - b + b * ntok / avgdl) if avgdl else k1    # (nothing indexed yet: its own length)
            rows.append((sum(w * tf / (tf + norm) for w, tf in zip(weights, tfs)), r["cid"], r["id"], ntok, *tfs))
        rows.sort(key=lambda x: (-x[0], x[1]))
        return rows[:p.top_k]

    def _search_shards(self, t, p: SearchParams, terms: list[str], days: list[str], now: int, budget: CpuBudget,
                       unseen: "Unseen | None" = None):
        """FTS5 over the primaries: global statistics summed over the shards, then each shard's best
        units under them (every match scored exactly when a shard has few), merged; with ``unseen``
        (read-your-writes) also the units still waiting for the indexer, by their tokens."""
        per_day = {}
        for day in days:
            db = t.shard(day, create=False)
            if db is not None:
                per_day[day] = (db, db.read(_shard_stats, terms))
        n = sum(st["ndocs"] for _, st in per_day.values())
        if n <= 0 and unseen is None:
            return [], None
        avgdl = sum(st["ntokens"] for _, st in per_day.values()) / n if n else 0.0
        k1, b = self.config.bm25_k1, self.config.bm25_b
        # a term no indexed unit holds weighs what it would in one (a pending unit may hold it)
        unknown = readindex.unknown_idf(n) if unseen is not None else 0.0
        idf = [readindex.idf_of(n, sum(st["df"][term] for _, st in per_day.values())) or unknown for term in terms]
        weights = [w * (k1 + 1) for w in idf]
        live = [term for term, w in zip(terms, idf) if w]
        if not live or (p.operator == "and" and len(live) < len(terms)):
            return [], None
        deadline = time.monotonic() + self.config.read_your_writes_ms / 1000
        local_n = max(self.config.local_top_n, 3 * p.top_k)   # generous: 3x what the shard may contribute

        def top(day):
            db, st = per_day[day]
            match = [term for term in dict.fromkeys(live) if st["df"][term]]
            rows = []
            if match and not (p.operator == "and" and len(match) < len(set(live))):
                # Score every match exactly unless the shard holds too many (the sum of df bounds them).
                exact = sum(st["df"][term] for term in match) <= self.config.exact_match_limit
                rows = db.read(budget.run, _shard_top, p, fts_query(match, p.operator), terms, weights, avgdl,
                               k1, b, None if exact else local_n, p.top_k, now)
            if unseen is not None:
                rows += self._pending_top(t, db, day, p, terms, weights, avgdl, now, deadline, unseen, k1, b, budget)
            return [(r, db) for r in rows]

        found = [x for part in self._map(top, list(per_day)) for x in part]
        # Ties break by CID, so the order is the same however the corpus is sharded.
        found.sort(key=lambda x: (-x[0][0], x[0][1]))
        ranked = []
        for db, group in _by_db(found[:p.top_k]):
            rows = db.read(_rows_by_id, [r[2] for r in group])
            ranked += [Ranked(unit_dict(rows[r[2]]), r[0], r[3], list(r[4:])) for r in group if r[2] in rows]
        return ranked, {"idf": idf, "k1": k1, "b": b, "avgdl": avgdl, "documents": n}

    def _map(self, fn, items):
        """fn over shards on the thread pool (SQLite runs FTS5 ranking without the GIL)."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.pool.map(fn, items))

    def _results(self, p: SearchParams, terms: list[str], ranked: list[Ranked], stats) -> list[dict]:
        """Shape the winners: order, score in 0-1 (see ``normalise``), min_score, snippet and explain."""
        if not ranked:
            return []
        ranked.sort(key=lambda r: (-r.score, r.unit["cid"]))
        scale = Scale.of(ranked[0].score, stats["idf"], stats["documents"])
        out = []
        for r in ranked:
            score = scale.score(r.score)
            if score < p.min_score or len(out) == p.top_k:
                break
            item = dict(r.unit)
            item.pop("seq", None)
            item["score"] = round(score, 6)
            item["bm25_score"] = round(r.score, 6)
            if p.highlight:
                item["snippet"] = snippet(item["content"], terms, self.tokenizer)
            if p.explain:
                item["explain"] = _explain(r, terms, stats, scale)
            out.append(item)
        return out


@dataclass(frozen=True)
class Scale:
    """The 0-1 ``score`` of a query's results (docs/consistency-and-scores.md).

    score = bm25 / best × sqrt(coverage), where best is the query's best raw BM25 and coverage =
    min(1, best / Σ idf) over the query's terms: 1 when the best unit holds every query term about
    once at average length (each term then scores its idf), less when it matches only part of the
    query. A term no unit holds counts with the idf it would have in a single unit, so a query the
    store only partly knows scores lower. So the best match of a query it answers well scores 1, the
    others in proportion. Measured on the judged sets (bench/score_scale.py): a threshold of 0.5 keeps
    96 % of the relevant units in the top 10 on both sets, where the former bm25 / max-attainable
    kept 28 % (STARD) and 38 % (SciFact).
    """
    best: float
    coverage: float

    @classmethod
    def of(cls, best: float, idf: list[float], documents: int) -> "Scale":
        unknown = readindex.unknown_idf(documents)
        weight = sum(w if w else unknown for w in idf)
        return cls(best, min(1.0, best / weight) if weight > 0 else 0.0)

    def score(self, bm25: float) -> float:
        if self.best <= 0:
            return 0.0
        return min(1.0, bm25 / self.best) * math.sqrt(self.coverage)


def near_best(results: list[dict], share: float = NEAR_BEST) -> tuple[list[dict], list[dict]]:
    """(results within ``share`` of the best raw BM25, the others): what is worth a model's context."""
    if not results:
        return [], []
    floor = share * max(r["bm25_score"] for r in results)
    return [r for r in results if r["bm25_score"] >= floor], [r for r in results if r["bm25_score"] < floor]


def _by_db(found):
    groups: dict[int, tuple] = {}
    for row, db in found:
        groups.setdefault(id(db), (db, []))[1].append(row)
    return groups.values()


def _explain(r: Ranked, terms: list[str], stats: dict, scale: Scale) -> dict:
    k1, b, avgdl = stats["k1"], stats["b"], stats["avgdl"]
    norm = k1 * (1 - b + b * r.doc_len / avgdl) if avgdl else None
    return {
        "doc_len": r.doc_len, "doc_len_scored": r.doc_len,
        "avg_doc_len": round(avgdl, 3) if avgdl else None, "documents": stats["documents"],
        "k1": k1, "b": b, "max_attainable": round(sum(w * (k1 + 1) for w in stats["idf"]), 6),
        "best_bm25": round(scale.best, 6), "best_coverage": round(scale.coverage, 6),
        "terms": [{"term": term, "idf": round(w, 6), "tf": tf,
                   "score": round(w * (k1 + 1) * tf / (tf + norm), 6) if norm else None}
                  for term, w, tf in zip(terms, stats["idf"], r.tfs)]}


_SNIPPET_WORD_RE = re.compile(r"[^\W_]+(?:[-_.][^\W_]+)*")
_SNIPPET_SCAN_CHARS = 100_000


_WORD_TOKENS: dict[tuple[int, str], tuple[str, ...]] = {}   # (tokenizer, word) -> its tokens


def _word_tokens(tokenizer, word: str) -> tuple[str, ...]:
    key = (id(tokenizer), word)
    toks = _WORD_TOKENS.get(key)
    if toks is None:
        toks = tuple(tokenizer.tokens(word))
        if len(_WORD_TOKENS) >= 100_000:
            _WORD_TOKENS.clear()
        _WORD_TOKENS[key] = toks
    return toks


def snippet(content: str, terms: list[str], tokenizer, width: int = SNIPPET_CHARS) -> str:
    """A window of the content around the first matching word, matches wrapped in ** **.

    A word matches when the tokenizer turns it into a query term (so ``shipped`` matches the
    stem ``ship`` but ``order`` does not match ``ord``); Chinese terms match as substrings.
    """
    termset = set(terms)
    han_terms = [t for t in terms if t and not t.isascii()]
    # A word can only yield a term that begins with one of its characters (stems change endings,
    # even "dying" -> "die"; identifier parts are substrings): only such words are tokenized, once.
    heads = {t[:1] for t in terms if t and t.isascii()}
    scan = content[:_SNIPPET_SCAN_CHARS]
    spans = []
    for m in _SNIPPET_WORD_RE.finditer(scan):
        word = m.group()
        if word.isascii():
            low = word.lower()
            if any(h in low for h in heads) and termset.intersection(_word_tokens(tokenizer, word)):
                spans.append(m.span())
        else:
            for t in han_terms:
                i = word.find(t)
                while i >= 0:
                    spans.append((m.start() + i, m.start() + i + len(t)))
                    i = word.find(t, i + len(t))
    if not spans:
        return content[:width] + ("…" if len(content) > width else "")
    spans.sort()
    start = max(0, spans[0][0] - width // 3)
    end = min(len(content), start + width)
    merged: list[list[int]] = []
    for a, b in spans:
        a, b = max(a, start), min(b, end)
        if a >= b:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    parts, last = [], start
    for a, b in merged:
        parts.append(content[last:a] + "**" + content[a:b] + "**")
        last = b
    parts.append(content[last:end])
    return ("…" if start > 0 else "") + "".join(parts) + ("…" if end < len(content) else "")
