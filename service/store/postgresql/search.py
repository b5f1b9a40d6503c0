"""Search on PostgreSQL: the SQLite backend's global BM25, over the service's own tokens.

Each indexed unit keeps its term frequencies (``tfs``, jsonb: token -> count, the tokens exactly as
service/tokenize.py made them). Candidates come from a GIN index over those keys (``?|`` any term,
``?&`` every term), and every candidate is scored in SQL with the SQLite backend's formula and
floating-point operations in the same order (service/store/sqlite/fts.py ``fts_scoring_sql``; here service/store/postgresql/scoring.py): per-tenant document
count, token total and document frequencies kept by the indexer, k1 1.2, b 0.75, Lucene's idf, exact
lengths, ties by CID in byte order. Units acknowledged but not indexed yet are scored from their
content (read-your-writes), as on SQLite (``tail.score_tokens``). Result shaping is the SQLite
backend's (``search.shape_results``).

Where: ``strong`` and ``after_seq`` read the primary after indexing what is queued (bounded);
default searches read the standby (service/store/postgresql/standby.py) when it may, else the primary.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg_pool import PoolTimeout

from ...errors import StorageUnavailable, TooCostly
from ...ranking.bm25 import B, K1, Bm25, ShardHit, idf_of, unknown_idf
from ...readindex import searcher as index, threaded
from ...ranking.results import MAX_QUERY_TERMS, shape_results
from ...ranking.scoring import Ranked, Stats
from ...ranking.rank import rank
from ...ranking.tail import TailBudget, TokenCache, Unseen, score_tokens
from ...ranking.threads import Naming
from ...units import day_of, now_ms
from .engine import Engine
from .indexer import catch_up
from .queries import lock_wait, sql
from .rows import units_at
from .scoring import essential_terms, match_where, queued_where, score
from .tail import TailRead, TailReader

QUEUED_PAGE = 8              # queued units whose content read-your-writes reads per round (tables path)


@dataclass
class IndexStats:
    bm25: Bm25          # the weights the index's and the tail's units are scored with
    stats: Stats        # what the answer reports (explain)


class SearchTail:
    """One search's tail read (tail.py): its statement sent at once when ``early`` (``TailReader.send``), read
    when the ranking first needs it (``get``), the ordinary way when it could not be sent or its answer was not
    plainly read; ``close`` gives back a connection a search that failed first still held."""

    def __init__(self, searcher: "Searcher", tenant: str, state: dict, now: int, early: bool):
        self.searcher, self.tenant, self.state, self.now = searcher, tenant, state, now
        db = searcher.store.db
        self.sent, self.known = searcher.tail.send(db, tenant, state, now) if early else (None, None)
        self.read: TailRead | None = None
        self.where = "primary"

    def get(self) -> TailRead:
        if self.read is None:
            db, reader, sent = self.searcher.store.db, self.searcher.tail, self.sent
            self.sent = None
            read = reader.finish(db, sent, self.known, self.tenant, self.state, self.now) if sent else None
            if read is None:
                read, self.where = db.read_fresh(reader.read, self.tenant, self.state, self.now)
            self.read = read
        return self.read

    def left_out(self, p, now: int):
        """``TailRead.left_out`` of the read, once read (the ranking asks only after its pool)."""
        got = []

        def gone(cids):
            if not got:
                got.append(self.get().left_out(p, now))
            return got[0](cids)
        return gone

    def close(self) -> None:
        if self.sent is not None:
            sent, self.sent = self.sent, None
            sent.rows()


class Searcher:
    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.tokenizer = store.tokenizer
        self.tokens = TokenCache()
        self.standby = store.db.standby
        self.reads = {"primary": 0, "standby": 0, "index": 0}    # what answered (tests, bench)
        self.tail = TailReader(self.config, self.tokenizer)
        self.naming = Naming(self.tokenizer)
        self._days: dict[str, tuple[float, int]] = {}               # tenant -> (when, live days), 1 s

    def sweep(self) -> None:
        """Forget the tenants' live-day counts older than their second (the store's sweep)."""
        old = time.monotonic() - 1.0
        for tenant, (when, _n) in list(self._days.items()):
            if when < old:
                self._days.pop(tenant, None)

    def _target(self, tenant: str, p) -> str:
        """Where this search reads: "standby" when it may, else "primary". With read-your-writes the
        standby must have replayed every change the tenant had when the search began: its answer is
        then as fresh as the primary's for this tenant ("standby-fresh")."""
        if self.standby is not None and self.store.db.primary_down():
            return "standby"                # the primary does not answer: the standby, as fresh as it is
        if p.strong or self.standby is None or not self.standby.usable():
            return "primary"
        if self.config.read_your_writes_ms <= 0:
            return "standby"
        version = self.store.db.one("tenant_version", {"tenant": tenant})["version"]
        if not self.standby.caught_up(tenant, version, self.config.read_your_writes_ms):
            return "primary"
        return "standby-fresh"

    def search(self, tenant: str, p) -> dict:
        start = time.perf_counter()
        terms = self.tokenizer.query_terms(p.query)[:MAX_QUERY_TERMS]
        if not p.strong and self.config.replicas:
            found = self._search_index(tenant, p, terms, start)
            if found is not None:
                return found
        if p.strong:
            catch_up(self.store, tenant, self.config.strong_wait_ms)
        where = self._target(tenant, p)
        try:
            out = self._run(where, tenant, p, terms)
        except (psycopg.OperationalError, PoolTimeout) as e:
            if where == "primary":
                raise StorageUnavailable(f"Storage is unavailable: {type(e).__name__}") from e
            self.standby.mark_down()        # (also a query the standby's replay cancelled)
            where = "primary"
            try:
                out = self._run(where, tenant, p, terms)
            except (psycopg.OperationalError, PoolTimeout) as e2:
                raise StorageUnavailable(f"Storage is unavailable: {type(e2).__name__}") from e2
        results, days, pending, oldest_ms = out
        lag = max(0, now_ms() - oldest_ms) if oldest_ms else 0
        if where == "standby":          # (read-your-writes off: as stale as the standby is)
            lag = max(lag, self.standby.lag_ms() or 0)
        self.reads["primary" if where == "primary" else "standby"] += 1
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": days, "freshness": {"replica_lag_ms": lag, "index_pending": pending}}

    # --- the node's read index (default searches) ----------------------------------------------
    def _search_index(self, tenant: str, p, terms: list[str], start: float) -> dict | None:
        """The node's read index (service/store/postgresql/readsync.py) with the units it lacks, read from
        PostgreSQL (tail.py): the ranking of the SQLite store's default searches. None when this node has no
        usable index for the tenant yet (or it is too far behind): the tables answer.

        The tail's statement is sent before tantivy's query for the pool and its answer read after it, in the
        request's own handler (``SearchTail``): the statement runs on PostgreSQL's server while the engine
        searches, and its answer is usually there when the ranking needs it, read without waiting. (A read that waited
        let the worker's other request handlers take the interpreter, and taking it back cost every search
        more CPU than the statement did; handing the read to a pool to overlap it cost two context switches and
        a future, which under load is what bounds a node's searches/s: bench/README.md.)"""
        readers = self.store.readers
        state, view = readers.state(tenant), readers.view(tenant)
        if view is None or not state or "n" not in state:
            return None
        now = int(time.time())
        tail = SearchTail(self, tenant, state, now, early=True)
        try:
            ranked, stats, unseen = self._rank_index(tenant, view, p, terms, now, tail)
            for _ in range(3):
                # a commit since the view was loaded that this process could not load yet: read again
                if not readers.moved(tenant, view):
                    break
                state, newer = readers.state(tenant), readers.view(tenant)
                if newer is None or newer is view or not state:
                    return None
                view = newer
                tail.close()
                tail = SearchTail(self, tenant, state, now, early=False)
                ranked, stats, unseen = self._rank_index(tenant, view, p, terms, now, tail)
        finally:
            tail.close()
        read, where = tail.get(), tail.where
        if read.too_many:
            return None
        ryw = self.config.read_your_writes_ms > 0
        results = shape_results(p, terms, ranked, stats.stats, self.tokenizer)
        if ryw:
            pending_n, oldest = unseen.count, unseen.oldest_ms
        else:                           # (read-your-writes off: what the index lacks, unread)
            pending_n, oldest = max(0, read.seq - state["low"] + 1), read.oldest_ms
        lag = max(0, now_ms() - oldest) if oldest else 0
        if where == "standby":
            lag = max(lag, self.standby.lag_ms() or 0)
        self.reads["index"] += 1
        return {"results": results, "took_ms": round((time.perf_counter() - start) * 1000, 2),
                "shards_searched": self._live_days(tenant),
                "freshness": {"replica_lag_ms": lag, "index_pending": pending_n}}

    def _rank_index(self, tenant: str, view, p, terms: list[str], now: int,
                    tail: SearchTail) -> tuple[list[Ranked], IndexStats, Unseen]:
        """The best k of the index and the tail's units (read-your-writes: ``fresh``, scored first with the
        index's statistics), ranked with threads as the SQLite store's default searches are
        (readindex/threaded.py), leaving out of the index's what the tail's read says is gone
        (``TailRead.left_out``); and the tail's units left unscored. The tail is read once the pool is
        (``fresh``: its statement ran meanwhile)."""
        ryw = self.config.read_your_writes_ms > 0
        unknown = unknown_idf(view.ndocs) if ryw else 0.0     # a term only the tail holds weighs as in one unit
        idf = [view.idf(term) or unknown for term in terms]
        avgdl = index.mean_length(view, terms) if terms else 0.0
        bm25 = Bm25.of(idf, avgdl)
        unseen = Unseen()

        def fresh() -> list[Ranked]:
            read = tail.get()
            return self.tail.top(tenant, read, p, terms, bm25, now, unseen) if ryw and terms and not read.too_many else []
        if terms and (all(idf) or p.operator == "or"):
            ranked = threaded.best(view, p, terms, bm25.weights, now, tail.left_out(p, now), self.naming, fresh)
            tail.get().refresh(ranked)
        else:
            ranked = fresh()
        return ranked, IndexStats(bm25, Stats(idf, K1, B, avgdl, view.ndocs)), unseen

    def _live_days(self, tenant: str) -> int:
        """How many days the tenant has live units in (the answer reports it), read at most once a second."""
        cached = self._days.get(tenant)
        if cached is None or time.monotonic() - cached[0] > 1.0:
            try:
                n = len(self.store.live_days(tenant))
            except StorageUnavailable:
                n = cached[1] if cached else 0
            cached = self._days[tenant] = (time.monotonic(), n)
        return cached[1]

    def _run(self, where: str, tenant: str, p, terms: list[str]):
        pool = self.store.db.primary if where == "primary" else self.standby.pool
        args = {"tenant": tenant, "now": int(time.time()), "terms": terms,
                "first": day_of(p.since) if p.since is not None else "0001-01-01",
                "last": day_of(p.until) if p.until is not None else "9999-12-31"}
        ryw = not p.strong and self.config.read_your_writes_ms > 0
        with pool.connection(timeout=5.0) as conn, conn.transaction():
            try:
                first = self._first_reads(conn, p, args, ryw)
                ranked, stats, unseen = self._rank(conn, p, terms, args, first, Unseen() if ryw else None)
            except psycopg.errors.QueryCanceled:
                raise TooCostly(f"This search needed more than {self.config.search_cpu_ms} ms in PostgreSQL; use "
                                "fewer or rarer terms, or a filter.", field="query") from None
        if unseen is None:
            pending, oldest = first["pending"]["n"], first["pending"]["oldest"]
        else:
            pending, oldest = unseen.count, unseen.oldest_ms
        return shape_results(p, terms, ranked, stats, self.tokenizer), len(first["days"]), pending, oldest

    def _first_reads(self, conn, p, args: dict, ryw: bool) -> dict:
        """In one round trip (a pipeline): the snapshot, the statement timeout, the live days, the BM25
        statistics and each term's document frequency, and the queue (read-your-writes: its units)."""
        reads = {"days": sql("days_live"), "stats": sql("stats_get"), "df": sql("df_get"),
                 "pending": sql("pending_count")}
        if ryw:
            q = {**args, "limit": self.config.read_your_writes_max + 1}
            reads["queued"] = ("SELECT u.seq AS id, u.cid, u.pushed_ms, u.day::text AS day FROM pending u "
                               f"WHERE {queued_where(p, q)} ORDER BY u.seq LIMIT %(limit)s")
        cursors = {}
        with conn.pipeline():
            conn.execute(sql("search_snapshot"))
            conn.execute(sql("search_plan"))
            if self.config.search_cpu_ms > 0:
                conn.execute(sql("statement_timeout"), {"ms": str(int(self.config.search_cpu_ms))})
                # a lock held on a table (DDL) is not this search's cost: past half its time, a 503, not a 422
                lock_wait(conn, self.config.search_cpu_ms // 2)
            for name, statement in reads.items():
                cursors[name] = conn.cursor()
                cursors[name].execute(statement, q if name == "queued" else args)
        out = {name: cur.fetchall() for name, cur in cursors.items()}
        out["stats"], out["pending"] = out["stats"][0], out["pending"][0]
        return out

    def _rank(self, conn, p, terms: list[str], args: dict, first: dict,
              unseen: Unseen | None) -> tuple[list[Ranked], Stats | None, Unseen | None]:
        """The best k, ranked as every path ranks (service/ranking/rank.py) from the tenant's best indexed units
        and, with read-your-writes, its queued ones scored from their content; and the statistics."""
        if not terms:
            return [], None, unseen
        n, ntokens = int(first["stats"]["ndocs"]), int(first["stats"]["ntokens"])
        df = {r["term"]: int(r["df"]) for r in first["df"]}
        # a term no indexed unit holds weighs what it would in one (a queued unit may hold it)
        unknown = unknown_idf(n) if unseen is not None else 0.0
        idf = [idf_of(n, df.get(term, 0)) or unknown for term in terms]
        avgdl = ntokens / n if n else 0.0
        bm25 = Bm25.of(idf, avgdl)
        live = [term for term in dict.fromkeys(terms) if df.get(term)]

        def hits(pp, want: int) -> list[tuple[ShardHit, str]]:
            """The best ``want`` indexed units (and every matching queued one)."""
            out: list[tuple[ShardHit, str]] = []
            if live and n and not (pp.operator == "and" and len(live) < len(set(terms))):
                chosen = essential_terms(conn, pp, live, terms, bm25, df, args) if pp.operator == "or" else live
                q = dict(args)
                out = score(conn, match_where(pp, chosen, q), q, terms, bm25, want)
            if unseen is not None:
                out += self._queued_top(conn, pp, terms, bm25, args, first, unseen)
            return out

        engine = Engine(conn, args["tenant"], p, terms, bm25, args["now"], hits, self.tokenizer)
        return rank(engine, p.top_k, self.naming, terms, p.operator), Stats(idf, K1, B, avgdl, n), unseen

    @staticmethod
    def _units(conn, args: dict, located: list[tuple[str, str]]) -> dict:
        """The units of these (cid, day) pairs, by CID (only their days' partitions are read)."""
        return units_at(conn, args["tenant"], located)

    def _queued_top(self, conn, p, terms: list[str], bm25: Bm25, args: dict, first: dict,
                    unseen: Unseen) -> list[tuple[ShardHit, str]]:
        """Queued units matching the query, scored from their tokens (made once per process, while
        read_your_writes_ms allows); the rest are ``unseen``."""
        ryw = TailBudget(self.config.read_your_writes_ms, cpu_ms=self.config.search_cpu_ms)
        rows = first["queued"]
        if len(rows) > self.config.read_your_writes_max:   # a bulk import's backlog: reported, not read
            unseen.count, unseen.oldest_ms = first["pending"]["n"], first["pending"]["oldest"]
            return []
        tenant = args["tenant"]
        known = {r["cid"]: self.tokens.get(tenant, "", 0, r["cid"]) for r in rows}
        missing = [r["cid"] for r in rows if known[r["cid"]] is None]
        day_of_cid = {r["cid"]: r["day"] for r in rows}
        for i in range(0, len(missing), QUEUED_PAGE):      # a few at a time: read only what time allows
            if ryw.expired():
                break
            page = missing[i:i + QUEUED_PAGE]
            contents = {cid: u["content"] for cid, u in
                        self._units(conn, args, [(cid, day_of_cid[cid]) for cid in page]).items()}
            for cid in page:
                if cid in contents and not ryw.expired() and ryw.admits(len(contents[cid])):
                    known[cid] = self.tokens.put(tenant, "", 0, cid, ryw.tokens(self.tokenizer, contents[cid]))
        hits = []
        for r in rows:
            entry = known[r["cid"]]
            if entry is None:
                unseen.add(r["pushed_ms"])
                continue
            hit = score_tokens(entry, r, p, terms, bm25)
            if hit is not None:
                hits.append((hit, r["day"]))
        return hits
