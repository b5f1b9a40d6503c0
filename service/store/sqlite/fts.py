"""Global BM25 in SQL over a day shard (docs/design.md §6): the scoring statement as text, and the
row functions that run it.

Every statement the search paths build at run time is assembled here, from fixed fragments and
bound parameters only (the user's text is a parameter or a quoted FTS5 token, never SQL): a shard's
FTS5 matches (``shard_top``), the units the read index lacks (service/store/sqlite/tail.py) and the units still
waiting for the indexer. ``fts_scoring_sql`` is the statement itself: print it, or run it on any table
with the units columns (tests/test_fts.py).
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time

from ...errors import TooCostly
from ...params import SearchParams
from ...ranking.bm25 import Bm25, ShardHit, scoring_expressions
from ..filters import filters
from ..statements import expand
from .queries import sql

UNIT_COLUMNS = expand("u.id, @unit_columns(u)", "sqlite")        # (service/units.py's, with the rowid)


def fts_query(terms: list[str], operator: str) -> str:
    """Quote every token: the user's text never becomes FTS5 syntax."""
    joiner = " AND " if operator == "and" else " OR "
    return joiner.join('"' + t.replace('"', '""') + '"' for t in terms)


def fts_scoring_sql(source: str, n_terms: int, require: str | None = None) -> str:
    """The statement that scores the units of ``source`` (``FROM ... WHERE ...``, alias u for units)
    under global BM25 weights and returns the best :k as (score, cid, id, ntok, tf0, tf1, ...).

    Term frequencies come from units.tokens: with spaces doubled, occurrences of ' term ' (parameter
    :p<i>) are counted by length arithmetic, in C, without sending documents to Python; :w<i> is the
    term's weight. ``require`` ("or", "and") keeps only units holding any or every query term (for a
    ``source`` that is not an FTS5 match)."""
    tf_cols = [f"(length(t) - length(replace(t, :p{i}, ''))) / length(:p{i}) AS tf{i}" for i in range(n_terms)]
    norm, score = scoring_expressions(":{}".format, n_terms)
    tfs = [f"tf{i}" for i in range(n_terms)]
    having = ""
    if require == "and":
        having = "WHERE " + " AND ".join(f"{tf} > 0" for tf in tfs) + " "
    elif require == "or":
        having = "WHERE " + " + ".join(tfs) + " > 0 "
    return (
        "WITH c AS MATERIALIZED (SELECT u.id AS id, u.cid AS cid, u.ntok AS ntok, "
        f"' ' || replace(u.tokens, ' ', '  ') || ' ' AS t {source}), "
        f"s AS MATERIALIZED (SELECT id, cid, ntok, {norm} AS norm, {', '.join(tf_cols)} FROM c) "
        f"SELECT {score} AS score, cid, id, ntok, {', '.join(tfs)} "
        f"FROM s {having}ORDER BY score DESC, cid LIMIT :k")


def score(conn, source: str, args: dict, terms: list[str], bm25: Bm25, k: int, now: int,
          require: str | None = None) -> list[ShardHit]:
    """The best k units of ``source`` under the global BM25 weights (``fts_scoring_sql``)."""
    args.update({"k": k, "now": now, "k1": bm25.k1, "b": bm25.b, "avgdl": bm25.avgdl})
    for i, (term, w) in enumerate(zip(terms, bm25.weights)):
        args[f"p{i}"] = f" {term} "
        args[f"w{i}"] = w
    return [ShardHit.of(r) for r in conn.execute(fts_scoring_sql(source, len(terms), require), args)]


def shard_stats(conn, terms: list[str]) -> dict:
    """A shard's BM25 statistics: indexed documents, token total, document frequency per term."""
    meta = {r[0]: r[1] for r in conn.execute(sql("meta_get"))}
    df = dict.fromkeys(terms, 0)
    for term in df:
        row = conn.execute(sql("vocab_df"), {"term": term}).fetchone()
        df[term] = row["doc"] if row else 0
    return {"ndocs": meta.get("ndocs", 0), "ntokens": meta.get("ntokens", 0), "df": df}


def shard_top(conn, p: SearchParams, match: str, terms: list[str], bm25: Bm25, local_n: int | None, k: int,
              now: int) -> list[ShardHit]:
    """One shard's best k FTS matches under the *global* BM25 weights, scored inside SQLite.

    ``local_n`` None scores every match (exact). Otherwise FTS5's own rank (local statistics)
    first keeps a generous local top-N: only for matches too many to score one by one.
    """
    args: dict = {"match": match}
    where = ["units_fts MATCH :match"] + filters(p, args)
    local = ""
    if local_n is not None:
        args["n"] = local_n
        local = " ORDER BY units_fts.rank LIMIT :n"
    source = f"FROM units_fts JOIN units u ON u.id = units_fts.rowid WHERE {' AND '.join(where)}{local}"
    return score(conn, source, args, terms, bm25, k, now)


def unsent_source(where: list[str], match: str | None) -> str:
    """The units FTS5 holds but the read index lacks: by their partial index, or among an FTS5 match
    (a bulk import's many rows)."""
    if match is None:
        # (INDEXED BY: the planner would rather walk units_expires, i.e. the whole day)
        return f"FROM units u INDEXED BY units_unsynced WHERE {' AND '.join(where)}"
    return f"FROM units_fts JOIN units u ON u.id = units_fts.rowid WHERE units_fts MATCH :match AND {' AND '.join(where)}"


def pending_source(where: list[str]) -> str:
    """The units still waiting for the indexer (by their partial index)."""
    return f"FROM units u INDEXED BY units_pending WHERE {' AND '.join(where)}"


def pending_unseen(conn, where_source: str, args: dict) -> tuple[int, int | None]:
    """How many of these waiting units there are, and the oldest one's push time (``where_source``: a
    ``pending_source``)."""
    return tuple(conn.execute(f"SELECT count(*), min(u.pushed_ms) {where_source}", args).fetchone())


def pending_bare(conn, where: list[str], args: dict) -> list:
    """The waiting units no search has made tokens for yet: id, cid, pushed_ms."""
    return conn.execute(f"SELECT u.id, u.cid, u.pushed_ms {pending_source(where + ['u.tokens IS NULL'])}",
                        args).fetchall()


def units_with_tokens(conn, cids: list[str], p: SearchParams, now: int) -> list:
    """These units (by CID) as search rows (id, ntok, tokens and every unit column) where they are live and pass
    the request's filters: the neighbors a search's ranking reads (service/store/sqlite/engine.py)."""
    args: dict = {"cids": json.dumps(cids), "now": now}
    where = ["u.cid IN (SELECT value FROM json_each(:cids))"] + filters(p, args)
    return conn.execute(f"SELECT u.ntok, u.tokens, {UNIT_COLUMNS} FROM units u WHERE {' AND '.join(where)}",
                        args).fetchall()


def rows_by_id(conn, ids: list[int]) -> dict:
    return {r["id"]: r for r in conn.execute(sql("units_by_ids"), {"ids": json.dumps(ids)})}


class CpuBudget:
    """The CPU one search may spend in SQLite, over every shard it reads (on the search pool too).

    SQLite calls ``check`` every few thousand virtual-machine steps; past the budget it interrupts
    the statement, and the search answers 422 instead of holding a worker for seconds."""
    STEPS = 20_000

    def __init__(self, ms: int):
        self.limit = ms / 1000 if ms > 0 else None
        self.spent = 0.0              # by finished statements
        self._lock = threading.Lock()

    def charge(self, seconds: float) -> None:
        """CPU spent outside SQLite on this search's scoring (read-your-writes' tokenizing)."""
        with self._lock:
            self.spent += seconds

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
