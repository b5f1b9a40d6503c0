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
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import readindex
from .errors import BadRequest
from .indexer import index_pending
from .shards import sql
from .tokenize import tokenizer_for
from .units import day_of, is_cid

MAX_QUERY_CHARS = 16_384
MAX_TIMESTAMP = 253_402_300_799   # 9999-12-31T23:59:59Z
MAX_QUERY_TERMS = 64
RESCORE_FACTOR = 2            # the read index's candidates per result, scored again with exact lengths
# ... at most this many when near ties need more: past it the answer is the exact order of
# tantivy's best 200 (at 1M units a cap of 1000 put p99 at 82 ms, 200 at 21 ms; score lists
# still equal exhaustive scoring on every bench query, bench/README.md)
RESCORE_MAX = 200
SNIPPET_CHARS = 200

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


def _rows_by_id(conn, ids: list[int]) -> dict:
    return {r["id"]: r for r in conn.execute(sql("units_by_ids"), {"ids": json.dumps(ids)})}


@dataclass
class Ranked:
    """One winning unit: its public fields, raw BM25 score, and what explain reports."""
    unit: dict
    score: float
    doc_len: int          # in tokens, exact on both paths
    tfs: list[int]


class Searcher:
    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.tokenizer = tokenizer_for(store.config)
        self.readers = readindex.Readers()
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
            return self.store.live_days(t, first, last)
        now = time.monotonic()
        cached = self._live_days.get(t.name)
        if cached is None or now - cached[0] > 1.0:
            cached = self._live_days[t.name] = (now, self.store.live_days(t))
        return [d for d in cached[1] if first <= d <= last]

    def _catch_up(self, t, days: list[str]) -> None:
        """Read-your-writes: index what is pending in these shards now, bounded in time."""
        deadline = time.monotonic() + self.config.strong_wait_ms / 1000
        for day in days:
            db = t.shard(day, create=False)
            while db is not None and time.monotonic() < deadline:
                if index_pending(db, self.tokenizer, self.config.index_batch) < self.config.index_batch:
                    break

    # --- search -------------------------------------------------------------------------------
    def search(self, t, p: SearchParams) -> dict:
        start = time.perf_counter()
        now = int(time.time())
        first = day_of(p.since) if p.since is not None else "0000-00-00"
        last = day_of(p.until) if p.until is not None else "9999-99-99"
        view = None if p.strong else self.view(t)
        days = self._days(t, first, last, fresh=view is None)
        terms = self.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS]
        if p.strong:
            self._catch_up(t, days)
        results: list[dict] = []
        if terms and days:
            ranked, stats = (self._search_index(t, p, terms, view, now) if view is not None
                             else self._search_shards(t, p, terms, days, now))
            results = self._results(p, terms, ranked, stats)
        pending, replica_lag = self.freshness(t, days, view)
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": len(days),
                "freshness": {"replica_lag_ms": replica_lag, "index_pending": pending}}

    def freshness(self, t, days: list[str], view=None, exact: bool = False) -> tuple[int, int]:
        """(units a search of this kind cannot see yet, ms the oldest of them has waited).

        With the read index: what the leader's last pass left for the next one (every worker reads
        it from one small file), or counted now in every shard when ``exact`` (readiness, metrics).
        On the primaries: rows still pending in these shards.
        """
        if view is not None:
            if exact:
                backlog, oldest = readindex.backlog(t)
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

    def _search_index(self, t, p: SearchParams, terms: list[str], view, now: int):
        """The read index's candidates (tantivy), scored again with exact lengths; the top k with the
        units' stored fields."""
        k1, b = readindex.K1, readindex.B
        idf_by_term = {term: view.idf(term) for term in dict.fromkeys(terms)}
        if p.operator == "and" and not all(idf_by_term.values()):
            return [], None
        idf = [idf_by_term[term] for term in terms]
        want = RESCORE_FACTOR * p.top_k
        while True:
            hits = readindex.search(view, p, terms, now, want=want)
            scored, complete = readindex.rescore(view, hits, terms, [w * (k1 + 1) for w in idf], p.top_k)
            if complete or len(hits) < want or want >= RESCORE_MAX:
                break
            want *= 4     # a document past these candidates could still win with its exact length
        units = readindex.units(view, [x.hit for x in scored])
        ranked = [Ranked(unit, x.score, x.length, x.tfs) for unit, x in zip(units, scored)]
        stats = {"idf": idf, "k1": k1, "b": b, "documents": view.ndocs,
                 "avgdl": view.cache.get("avgdl")}
        return ranked, stats

    def _search_shards(self, t, p: SearchParams, terms: list[str], days: list[str], now: int):
        """FTS5 over the primaries: global statistics summed over the shards, then each shard's best
        units under them (every match scored exactly when a shard has few), merged."""
        from .store import unit_dict
        per_day = {}
        for day in days:
            db = t.shard(day, create=False)
            if db is not None:
                per_day[day] = (db, db.read(_shard_stats, terms))
        n = sum(st["ndocs"] for _, st in per_day.values())
        if n <= 0:
            return [], None
        avgdl = sum(st["ntokens"] for _, st in per_day.values()) / n
        k1, b = self.config.bm25_k1, self.config.bm25_b
        idf = [readindex.idf_of(n, sum(st["df"][term] for _, st in per_day.values())) for term in terms]
        weights = [w * (k1 + 1) for w in idf]
        live = [term for term, w in zip(terms, idf) if w]
        if not live or (p.operator == "and" and len(live) < len(terms)):
            return [], None
        local_n = max(self.config.local_top_n, 3 * p.top_k)   # generous: 3x what the shard may contribute

        def top(day):
            db, st = per_day[day]
            match = [term for term in dict.fromkeys(live) if st["df"][term]]
            if not match or (p.operator == "and" and len(match) < len(set(live))):
                return []
            # Score every match exactly unless the shard holds too many (the sum of df bounds them).
            exact = sum(st["df"][term] for term in match) <= self.config.exact_match_limit
            rows = db.read(_shard_top, p, fts_query(match, p.operator), terms, weights, avgdl, k1, b,
                           None if exact else local_n, p.top_k, now)
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
        """Shape the winners: order, min_score, score in 0-1, snippet and explain on request."""
        if not ranked:
            return []
        k1, b, idf = stats["k1"], stats["b"], stats["idf"]
        max_attainable = sum(w * (k1 + 1) for w in idf) or 1.0
        ranked.sort(key=lambda r: (-r.score, r.unit["cid"]))
        out = []
        for r in ranked:
            if r.score / max_attainable < p.min_score or len(out) == p.top_k:
                break
            item = dict(r.unit)
            item.pop("seq", None)
            item["score"] = round(min(1.0, r.score / max_attainable), 6)
            item["bm25_score"] = round(r.score, 6)
            if p.highlight:
                item["snippet"] = snippet(item["content"], terms, self.tokenizer)
            if p.explain:
                item["explain"] = _explain(r, terms, stats, max_attainable)
            out.append(item)
        return out


def _by_db(found):
    groups: dict[int, tuple] = {}
    for row, db in found:
        groups.setdefault(id(db), (db, []))[1].append(row)
    return groups.values()


def _explain(r: Ranked, terms: list[str], stats: dict, max_attainable: float) -> dict:
    k1, b, avgdl = stats["k1"], stats["b"], stats["avgdl"]
    norm = k1 * (1 - b + b * r.doc_len / avgdl) if avgdl else None
    return {
        "doc_len": r.doc_len, "doc_len_scored": r.doc_len,
        "avg_doc_len": round(avgdl, 3) if avgdl else None, "documents": stats["documents"],
        "k1": k1, "b": b, "max_attainable": round(max_attainable, 6),
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
