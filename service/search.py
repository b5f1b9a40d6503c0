"""Search (DESIGN.md sections 4 and 6): query tokens, fan-out over live day shards, global BM25.

Across shards we sum document counts, token totals and term document frequencies, and score
with those global statistics, so a unit's score does not depend on how the corpus is split into
days. Scores use FTS5's own BM25 formula with Lucene's always-positive idf; one unsharded index
ranks identically.

Per shard, two paths. Replicas of quiet past days carry impact lists (service/impacts.py): OR
queries without filters get the exact top k from them without scoring every match. Everywhere
else (today's shard, strong reads, filters, AND) FTS5 finds the matches, scores all of them
exactly when there are few, else keeps a generous local top-N by its own rank, re-scored with
the global statistics; common terms are tried last (a MaxScore-style split).
"""
from __future__ import annotations

import heapq
import itertools
import json
import math
import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import impacts
from .errors import BadRequest
from .indexer import index_pending
from .replica import ReplicaReaders, meta_of
from .shards import sql
from .tokenize import tokenizer_for
from .units import day_of, is_cid

MAX_QUERY_CHARS = 16_384
MAX_TIMESTAMP = 253_402_300_799   # 9999-12-31T23:59:59Z
MAX_QUERY_TERMS = 64
SNIPPET_CHARS = 200
IMPACT_FIRST_M = 16           # pass 1 reads each term's best units per file, at least this many,
IMPACT_WHOLE_LIST = 120       # or the whole list when the term is in at most this many of the file's units
IMPACT_MAX_READ = 20_000      # pass 2 reads at most this many list entries per file, else FTS5 ranks
IMPACT_SCORE_BATCH = 1024     # pass 3 scores units best upper bound first, in doubling batches (fewer round trips won)

SEARCH_FIELDS = ("query", "top_k", "types", "source", "since", "until", "parent_cid", "min_score",
                 "operator", "consistency", "after_seq", "highlight", "explain")


@dataclass(frozen=True)
class SearchParams:
    query: str
    top_k: int = 10
    types: tuple[str, ...] | None = None
    source: str | None = None
    since: int | None = None
    until: int | None = None
    parent_cid: str | None = None
    min_score: float = 0.0
    operator: str = "or"
    consistency: str = "replica"
    after_seq: int | None = None
    highlight: bool = False
    explain: bool = False

    @property
    def strong(self) -> bool:
        return self.consistency == "strong" or self.after_seq is not None


def _int(body, name, lo=None, hi=None):
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequest(f"Field {name!r} must be an integer.", field=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadRequest(f"Field {name!r} must be between {lo} and {hi}.", field=name)
    return v


def _bool(body, name) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"Field {name!r} must be true or false.", field=name)
    return v


def parse_search(body, config, *, allow_unknown: bool = False) -> SearchParams:
    """Validate a search request body (REST, MCP tool, adapters); raise 400 on the first problem."""
    if not isinstance(body, dict):
        raise BadRequest("The search body must be a JSON object.", code="invalid_body")
    if not allow_unknown:
        unknown = sorted(set(body) - set(SEARCH_FIELDS))
        if unknown:
            raise BadRequest(f"Unknown field {unknown[0]!r}.", code="unknown_field", field=unknown[0])
    query = body.get("query")
    if query is None:
        raise BadRequest("Field 'query' is required.", code="missing_field", field="query")
    if not isinstance(query, str):
        raise BadRequest("Field 'query' must be a string.", field="query")
    if len(query) > MAX_QUERY_CHARS:
        raise BadRequest(f"Field 'query' must be at most {MAX_QUERY_CHARS} characters.",
                         code="query_too_long", field="query")
    top_k = _int(body, "top_k", 1, 100)
    types = body.get("types")
    if types is not None:
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not all(isinstance(x, str) for x in types):
            raise BadRequest("Field 'types' must be a list of type names.", field="types")
        bad = [x for x in types if x not in config.types]
        if bad:
            raise BadRequest(f"Unknown type {bad[0]!r}; known: {', '.join(config.types)}.",
                             code="invalid_type", field="types")
        types = tuple(dict.fromkeys(types)) or None
    source = body.get("source")
    if source is not None and (not isinstance(source, str) or not source or len(source) > 201):
        raise BadRequest("Field 'source' must be a non-empty string (exact, or a prefix ending in '*').",
                         field="source")
    # Times past year 9999 select the same units as 9999-12-31 (and stay valid SQLite integers).
    since = _int(body, "since", 0)
    since = min(since, MAX_TIMESTAMP) if since is not None else None
    until = _int(body, "until", 0)
    until = min(until, MAX_TIMESTAMP) if until is not None else None
    parent = body.get("parent_cid")
    if parent is not None and not is_cid(parent):
        raise BadRequest("Field 'parent_cid' must be 12 lowercase hex digits.", code="invalid_cid",
                         field="parent_cid")
    min_score = body.get("min_score", 0.0)
    if min_score is None:
        min_score = 0.0
    if isinstance(min_score, bool) or not isinstance(min_score, int | float) or not 0 <= min_score <= 1:
        raise BadRequest("Field 'min_score' must be a number between 0 and 1.", field="min_score")
    operator = body.get("operator") or "or"
    if operator not in ("or", "and"):
        raise BadRequest("Field 'operator' must be 'or' or 'and'.", field="operator")
    consistency = body.get("consistency") or "replica"
    if consistency not in ("replica", "strong"):
        raise BadRequest("Field 'consistency' must be 'replica' or 'strong'.", field="consistency")
    return SearchParams(query=query, top_k=top_k or 10, types=types, source=source, since=since,
                        until=until, parent_cid=parent, min_score=float(min_score), operator=operator,
                        consistency=consistency, after_seq=_int(body, "after_seq", 0),
                        highlight=_bool(body, "highlight"), explain=_bool(body, "explain"))


def fts_query(terms: list[str], operator: str) -> str:
    """Quote every token: the user's text never becomes FTS5 syntax."""
    joiner = " AND " if operator == "and" else " OR "
    return joiner.join('"' + t.replace('"', '""') + '"' for t in terms)


def _shard_stats(conn, terms: list[str]) -> dict:
    """A shard's BM25 statistics: indexed documents, token total, document frequency per term."""
    meta = meta_of(conn)
    df = dict.fromkeys(terms, 0)
    try:
        # A file with impact lists has every term's df in one small table.
        df.update(conn.execute(sql("impact_df"), {"terms": json.dumps(terms)}).fetchall())
    except sqlite3.OperationalError:
        for term in terms:
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


def _score(conn, source: str, args: dict, terms: list[str], weights: list[float], avgdl: float,
           k1: float, b: float, k: int, now: int) -> list[tuple]:
    """The best k units of ``source`` (SQL: FROM ... WHERE ..., alias u for units) under the global
    BM25 weights; rows are (score, cid, id, ntok, tf...).

    Term frequencies come from units.tokens: with spaces doubled, occurrences of ' term ' are
    counted by length arithmetic, in C, without sending documents to Python.
    """
    args.update({"k": k, "now": now, "k1": k1, "b": b, "avgdl": avgdl})
    tf_cols, score_terms = [], []
    for i, (term, w) in enumerate(zip(terms, weights)):
        args[f"p{i}"] = f" {term} "
        tf_cols.append(f"(length(t) - length(replace(t, :p{i}, ''))) / length(:p{i}) AS tf{i}")
        args[f"w{i}"] = w
        score_terms.append(f":w{i} * tf{i} / (tf{i} + norm)")
    query = (
        "WITH c AS MATERIALIZED (SELECT u.id AS id, u.cid AS cid, u.ntok AS ntok, "
        f"' ' || replace(u.tokens, ' ', '  ') || ' ' AS t {source}), "
        f"s AS MATERIALIZED (SELECT id, cid, ntok, :k1 * (1 - :b + :b * ntok / :avgdl) AS norm, {', '.join(tf_cols)} FROM c) "
        f"SELECT {' + '.join(score_terms)} AS score, cid, id, ntok, {', '.join(f'tf{i}' for i in range(len(terms)))} "
        "FROM s ORDER BY score DESC, cid LIMIT :k")
    return [tuple(r) for r in conn.execute(query, args)]


def _fetch_units(conn, ids: list[int]) -> dict:
    marks = ", ".join("?" * len(ids))
    rows = conn.execute(
        "SELECT id, cid, seq, type, source, timestamp, ttl, expires_at, content, metadata, parent_cid "
        f"FROM units WHERE id IN ({marks})", ids).fetchall()
    return {r["id"]: r for r in rows}


def _first_pass(conn, config, p: SearchParams, lists_ok: bool, fts_terms: list[str], n_local: int | None,
                top: dict[str, int], scoring):
    """One shard's first pass: ("lists", impacts.Lists) when the file has current impact lists and
    the query may use them, else ("rows", exact rows) from FTS5 over ``fts_terms``."""
    terms, weights, avgdl, k1, b, k, now = scoring
    if lists_ok:
        meta = impacts.info(conn)
        if impacts.current(meta, config):
            return "lists", impacts.first_pass(conn, meta, dict(zip(terms, weights)), avgdl, k1, b, top, now)
    if not fts_terms:
        return "rows", []
    return "rows", _shard_top(conn, p, fts_query(fts_terms, p.operator), terms, weights, avgdl, k1, b, n_local, k, now)


def _score_ids(conn, ids: list[int], p: SearchParams, scoring) -> list[tuple]:
    args: dict = {"ids": json.dumps(ids)}
    where = ["u.id IN (SELECT value FROM json_each(:ids))"] + _filters(p, args)
    return _score(conn, f"FROM units u WHERE {' AND '.join(where)}", args, *scoring)


class StatsCache:
    """Per-term document frequencies of replica files, which never change once renamed into place."""

    def __init__(self, max_terms: int = 200_000):
        self.max_terms = max_terms
        self._by_file: dict[tuple[str, int], dict] = {}
        self._terms = 0

    def get(self, key, terms: list[str]):
        entry = self._by_file.get(key)
        if entry is None or any(t not in entry["df"] for t in terms):
            return None
        return entry

    def put(self, key, stats: dict) -> None:
        if self._terms > self.max_terms:
            self._by_file.clear()
            self._terms = 0
        entry = self._by_file.setdefault(key, {"ndocs": stats["ndocs"], "ntokens": stats["ntokens"], "df": {}})
        self._terms += len(stats["df"])
        entry["df"].update(stats["df"])


class Searcher:
    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.tokenizer = tokenizer_for(store.config)
        self.replicas = ReplicaReaders(store.config)
        self.pool = ThreadPoolExecutor(max(1, self.config.search_threads), thread_name_prefix="search")
        self.stats_cache = StatsCache()

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.replicas.close()

    # --- shard access -------------------------------------------------------------------------
    def _source(self, t, day: str, strong: bool):
        """(Db, is_replica) to read a day from: its replica by default, the primary for strong reads
        or while the replica is missing."""
        if not strong and self.config.replicas:
            db = self.replicas.get(t.replica_path(day))
            if db is not None:
                return db, True
        return t.shard(day, create=False), False

    def _read(self, t, day: str, strong: bool, fn, *args):
        """Run fn on the day's replica or primary; a damaged replica is dropped (to be rebuilt) and the
        primary answers instead. Returns (result, db) or (None, None) when the day has no file."""
        db, replica = self._source(t, day, strong)
        if db is not None and replica:
            try:
                return db.read(fn, *args), db
            except sqlite3.DatabaseError:
                self.replicas.broken(t.replica_path(day))
                db = t.shard(day, create=False)
        if db is None:
            return None, None
        return db.read(fn, *args), db

    def _stats(self, t, day: str, strong: bool, terms: list[str]):
        db, replica = self._source(t, day, strong)
        key = (str(db.path), self.replicas.inode(db.path)) if replica and db is not None else None
        if key is not None:
            cached = self.stats_cache.get(key, terms)
            if cached is not None:
                return cached
        stats, used = self._read(t, day, strong, _shard_stats, terms)
        if key is not None and used is db and stats is not None:
            self.stats_cache.put(key, stats)
        return stats

    def _catch_up(self, t, days: list[str]) -> None:
        """Read-your-writes: index what is pending in these shards now, bounded in time."""
        deadline = time.monotonic() + self.config.strong_wait_ms / 1000
        for day in days:
            db = t.shard(day, create=False)
            while db is not None and time.monotonic() < deadline:
                if index_pending(db, self.tokenizer, self.config.index_batch) < self.config.index_batch:
                    break

    def _map(self, fn, items, parallel: bool = True):
        """fn over shards: on the thread pool when the work is mostly SQLite's (FTS5 ranking, which
        runs without the GIL), in this thread when it is short or mostly Python (impact lists,
        cached statistics), where handing it to threads measured slower."""
        if not parallel or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.pool.map(fn, items))

    # --- search -------------------------------------------------------------------------------
    def search(self, t, p: SearchParams) -> dict:
        start = time.perf_counter()
        now = int(time.time())
        first = day_of(p.since) if p.since is not None else "0000-00-00"
        last = day_of(p.until) if p.until is not None else "9999-99-99"
        days = self.store.live_days(t, first, last)
        terms = self.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS]
        if p.strong:
            self._catch_up(t, days)
        results: list[dict] = []
        if terms and days:
            results = self._search(t, p, terms, days, now)
        pending, replica_lag = self.freshness(t, days, p.strong or not self.config.replicas)
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": len(days),
                "freshness": {"replica_lag_ms": replica_lag, "index_pending": pending}}

    def freshness(self, t, days: list[str], primary_only: bool) -> tuple[int, int]:
        """(rows still pending in these shards, ms the oldest replica has been behind its primary)."""
        pending = lag = 0
        now_ms = time.time() * 1000
        for day in days:
            db = t.shard(day, create=False)
            if db is None:
                continue
            n, dirty = db.read(lambda c: c.execute(sql("shard_freshness")).fetchone())
            pending += n
            if dirty and not primary_only:
                lag = max(lag, int(now_ms - dirty))
        return pending, lag

    def _search(self, t, p: SearchParams, terms: list[str], days: list[str], now: int) -> list[dict]:
        # 1. Global statistics: documents, average length and document frequency over the searched shards.
        per_day = {day: self._stats(t, day, p.strong, terms) for day in days}
        stats = [s for s in per_day.values() if s is not None]
        n = sum(s["ndocs"] for s in stats)
        if n <= 0:
            return []
        avgdl = sum(s["ntokens"] for s in stats) / n
        k1, b = self.config.bm25_k1, self.config.bm25_b
        dfs = [sum(s["df"][term] for s in stats) for term in terms]
        # Lucene's idf: always positive, so small tenants (a term in most of few units) still rank sanely.
        idf = [math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0 for df in dfs]
        weights = [w * (k1 + 1) for w in idf]
        max_attainable = sum(weights) or 1.0
        live = [term for term, df in zip(terms, dfs) if df]
        if not live or (p.operator == "and" and len(live) < len(terms)):
            return []
        local_n = max(self.config.local_top_n, 3 * p.top_k)   # generous: 3x what the shard may contribute
        k, exact_limit = p.top_k, self.config.exact_match_limit
        df_of, weight_of = dict(zip(terms, dfs)), dict(zip(terms, weights))
        # 2. MaxScore-style plans. Shards with impact lists: service/impacts.py. Other shards (today's,
        # primaries): candidates from the rarer terms first; a unit holding only common terms cannot
        # beat the k-th score once that exceeds the common terms' summed maximum.
        first_terms, common = live, []
        if p.operator == "or" and len(live) > 1:
            by_df = sorted(live, key=df_of.get)
            common = [term for term in by_df[1:] if df_of[term] > 0.05 * n]
            first_terms = [term for term in by_df if term not in common]
        scoring = (terms, weights, avgdl, k1, b, k, now)
        # Impact lists (in replicas only) hold every unit of a term: usable for OR queries that no
        # filter but expiry narrows.
        lists_ok = (p.operator == "or" and not p.strong and self.config.replicas and self.config.impact_min_docs > 0
                    and not (p.types or p.source or p.parent_cid or p.since is not None or p.until is not None))

        def fts_args(st, match_terms):
            match_terms = [term for term in match_terms if st["df"][term]]
            # Score every match exactly unless the shard holds too many (sum of df bounds the OR matches).
            n_local = None if sum(st["df"][term] for term in match_terms) <= exact_limit else local_n
            return match_terms, n_local

        def fts_rows(day):
            rows, db = self._read(t, day, p.strong, _shard_top, p, fts_query(live, p.operator), terms, weights,
                                  avgdl, k1, b, fts_args(per_day[day], live)[1], k, now)
            return rows or []

        def kth(found) -> float:
            """Any k units scored (or bounded from below) so far: the final k-th best is at least this."""
            known = heapq.nlargest(k, itertools.chain.from_iterable(
                (r[0] for r in x) if kind == "rows" else x.lows() for _, _, kind, x in found))
            return max(known[k - 1] if len(known) >= k else 0.0, p.min_score * max_attainable)

        def complete(found, picks) -> None:
            """Exact scores for (entry index, doc) picks; a file replaced meanwhile is searched by FTS5."""
            by_entry: dict[int, list[int]] = {}
            for i, doc in picks:
                by_entry.setdefault(i, []).append(doc)
            for i, docs in by_entry.items():
                day, db, kind, x = found[i]
                if kind == "lists" and not db.read(impacts.complete, x, sorted(docs)):
                    found[i] = (day, db, "rows", fts_rows(day))

        # Pass 1: each shard's lists' best units, or FTS5 rows (over the rare terms first).
        def first(day):
            st = per_day.get(day)
            if st is None or not any(st["df"][term] for term in live):
                return None
            # Pass 1 reads the best few units of each list, and the whole list of a term rare in
            # this file: units holding a rare term (high weight) tend to set the threshold.
            top = {term: st["df"][term] + 1 if st["df"][term] <= IMPACT_WHOLE_LIST else max(2 * k, IMPACT_FIRST_M)
                   for term in dict.fromkeys(terms)}
            res, db = self._read(t, day, p.strong, _first_pass, self.config, p, lists_ok,
                                 *fts_args(st, first_terms), top, scoring)
            return None if res is None else (day, db, *res)

        found = [x for x in self._map(first, days, not lists_ok) if x is not None]
        # The k best units read so far, scored exactly: a threshold as high as pass 1 can give.
        complete(found, [(i, doc) for _, i, doc in heapq.nlargest(k, (
            (lo, i, doc) for i, (_, _, kind, x) in enumerate(found) if kind == "lists"
            for doc, lo in x.lo.items() if x.live(doc)))])
        threshold = kth(found)
        common_bound = sum(weight_of[term] for term in common)

        # Pass 2: read each file's lists down to the impact the threshold needs; FTS5 shards holding
        # units with only common terms are searched again with every term when those could still win.
        def second(entry):
            day, db, kind, x = entry
            if kind == "lists":
                levels = x.levels(threshold)
                if not levels:
                    return entry
                try:
                    if db.read(impacts.read_down_to, x, levels, IMPACT_MAX_READ):
                        return entry
                except sqlite3.DatabaseError:
                    pass
                return day, db, "rows", fts_rows(day)
            if common and threshold <= common_bound:
                return day, db, "rows", fts_rows(day)
            return entry

        found = self._map(second, found, not lists_ok)
        threshold = kth(found)

        # Pass 3: exact scores for units read from some lists but not all, best upper bound first,
        # until the next upper bound is below the k-th best score.
        pending = sorted(((hi, i, doc) for i, (_, _, kind, x) in enumerate(found) if kind == "lists"
                          for hi, doc in x.candidates(threshold - 1e-9)), reverse=True)
        exact = [r[0] for _, _, kind, x in found if kind == "rows" for r in x]
        exact += [v for _, _, kind, x in found if kind == "lists" for doc, v in x.exact.items() if x.live(doc)]
        batch, at = IMPACT_SCORE_BATCH, 0
        while at < len(pending) and pending[at][0] >= threshold - 1e-9:
            take = [(i, doc) for hi, i, doc in pending[at:at + batch] if hi >= threshold - 1e-9]
            at += batch
            batch *= 2
            complete(found, take)
            for i, doc in take:
                x = found[i][3]
                if found[i][2] == "lists" and doc in x.exact:
                    exact.append(x.exact[doc])
            best = heapq.nlargest(k, exact)
            if len(best) == k:
                threshold = max(threshold, best[-1])

        # The winners' rows (cid, tf per term) from SQL, scored by the same arithmetic as FTS5 rows.
        def rows(entry):
            day, db, kind, x = entry
            if kind == "rows":
                return [(r, day, db) for r in x]
            ids = sorted(doc for doc, score in x.exact.items() if score >= threshold - 1e-9 and x.live(doc))
            return [(r, day, db) for r in db.read(_score_ids, ids, p, scoring)] if ids else []

        merged = [r for part in map(rows, found) for r in part]
        # Ties break by CID, so the order is the same however the corpus is sharded.
        merged.sort(key=lambda x: (-x[0][0], x[0][1]))
        winners = [m for m in merged if m[0][0] / max_attainable >= p.min_score][:p.top_k]
        return self._materialize(p, terms, winners, idf, avgdl, n, max_attainable)

    def _materialize(self, p, terms, winners, idf, avgdl, n, max_attainable) -> list[dict]:
        """Fetch the winning units' fields and shape the results."""
        from .store import unit_dict
        k1, b = self.config.bm25_k1, self.config.bm25_b
        by_db: dict = {}
        for (score, cid, rowid, *_), day, db in winners:
            by_db.setdefault(id(db), (db, []))[1].append(rowid)
        fetched = {}
        for key, (db, ids) in by_db.items():
            try:
                fetched[key] = db.read(_fetch_units, ids)
            except sqlite3.DatabaseError:
                fetched[key] = {}
        out = []
        for (score, cid, rowid, ntok, *tfs), day, db in winners:
            row = fetched[id(db)].get(rowid)
            if row is None:
                continue
            item = unit_dict(row)
            item.pop("seq", None)
            item["score"] = round(score / max_attainable, 6)
            item["bm25_score"] = round(score, 6)
            if p.highlight:
                item["snippet"] = snippet(item["content"], terms, self.tokenizer)
            if p.explain:
                norm = k1 * (1 - b + b * ntok / avgdl)
                item["explain"] = {
                    "doc_len": ntok, "avg_doc_len": round(avgdl, 3), "documents": n,
                    "k1": k1, "b": b, "max_attainable": round(max_attainable, 6),
                    "terms": [{"term": term, "idf": round(w, 6), "tf": tf,
                               "score": round(w * (k1 + 1) * tf / (tf + norm), 6)}
                              for term, w, tf in zip(terms, idf, tfs)]}
            out.append(item)
        return out


_SNIPPET_WORD_RE = re.compile(r"[^\W_]+(?:[-_.][^\W_]+)*")
_SNIPPET_SCAN_CHARS = 100_000


def snippet(content: str, terms: list[str], tokenizer, width: int = SNIPPET_CHARS) -> str:
    """A window of the content around the first matching word, matches wrapped in ** **.

    A word matches when the tokenizer turns it into a query term (so ``shipped`` matches the
    stem ``ship`` but ``order`` does not match ``ord``); Chinese terms match as substrings.
    """
    termset = set(terms)
    han_terms = [t for t in terms if t and not t.isascii()]
    scan = content[:_SNIPPET_SCAN_CHARS]
    spans = []
    for m in _SNIPPET_WORD_RE.finditer(scan):
        word = m.group()
        if word.isascii():
            if termset.intersection(tokenizer.tokens(word)):
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
