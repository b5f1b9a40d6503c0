"""The search's SQL on PostgreSQL (docs/design.md §6; SQLite's is service/store/sqlite/fts.py): the conditions a
tenant's indexed units match (the GIN index over their terms) and those of the units still queued, the statement
that scores them with the SQLite backend's formula and floating-point operations in the same order, and MaxScore
pruning. The user's text is only ever a bound parameter.
"""
from __future__ import annotations

from psycopg.rows import tuple_row

from ...ranking.bm25 import Bm25, ShardHit, scoring_expressions
from ..filters import pg_filters


# MaxScore pruning (essential_terms) when the query's terms match more units than this; its first pass
# scores the units of the rarest terms, about this many
PRUNE_MIN_MATCHES = 2000
PRUNE_SEED_MATCHES = 500


def match_where(p, terms: list[str], args: dict) -> list[str]:
    """Conditions for the tenant's indexed units in [first, last] that hold any ("or") or every ("and")
    of these terms (the GIN index over tfs' keys; the terms are a bound text[], never syntax)."""
    args["terms"] = list(dict.fromkeys(terms))
    holds = "?&" if p.operator == "and" else "?|"
    return ["u.tenant = %(tenant)s", "u.day BETWEEN %(first)s AND %(last)s",
            f"u.tfs {holds} %(terms)s::text[]"] + pg_filters(p, args)


def tfs_scoring_sql(where: list[str], n_terms: int) -> str:
    """The best %(k)s search rows (unit_terms, alias u) matching ``where`` as (score, cid, id, ntok, tf0,
    tf1, ..., day): fts.fts_scoring_sql's arithmetic, with each term's frequency looked up in tfs (parameter
    %(p<i>)s) instead of counted."""
    tf_cols = [f"coalesce((u.tfs ->> %(p{i})s)::int, 0) AS tf{i}" for i in range(n_terms)]
    norm, score = scoring_expressions("%({})s".format, n_terms)
    tfs = [f"tf{i}" for i in range(n_terms)]
    return (
        f"WITH c AS MATERIALIZED (SELECT u.seq AS id, u.cid, u.ntok, u.day, {', '.join(tf_cols)} "
        f"FROM unit_terms u WHERE {' AND '.join(where)}), "
        f"s AS MATERIALIZED (SELECT id, cid, ntok, day, {norm} AS norm, {', '.join(tfs)} FROM c) "
        f"SELECT {score} AS score, cid, id, ntok, {', '.join(tfs)}, day::text "
        'FROM s ORDER BY score DESC, cid COLLATE "C" LIMIT %(k)s')


def score(conn, where: list[str], args: dict, terms: list[str], bm25: Bm25, k: int) -> list[tuple[ShardHit, str]]:
    """The best k units matching ``where`` under the global BM25 weights, each with its day."""
    args.update({"k": k, "k1": bm25.k1, "b": bm25.b, "avgdl": bm25.avgdl})
    for i, (term, w) in enumerate(zip(terms, bm25.weights)):
        args[f"p{i}"] = term
        args[f"w{i}"] = w
    with conn.cursor(row_factory=tuple_row) as cur:
        return [(ShardHit.of(r[:-1]), r[-1]) for r in cur.execute(tfs_scoring_sql(where, len(terms)), args)]


def essential_terms(conn, p, live: list[str], terms: list[str], bm25: Bm25, df: dict, args: dict) -> list[str]:
    """MaxScore (docs/design.md §11's lever), exact: the terms a unit must hold to reach the top k.

    A unit's score is below the summed weights of the query terms it holds (each term adds
    bm25.term_score < w). Score the units holding the rarest terms first (few, cheap): their k-th
    score is a floor the final k-th best reaches. The most common terms whose weights sum below that
    floor cannot lift a unit holding only them into the top k, so only the units holding another term
    are scored. Worth it only when the common terms match many units."""
    if len(live) < 2 or sum(df[t] for t in live) <= PRUNE_MIN_MATCHES:
        return live
    by_df = sorted(live, key=lambda t: (df[t], t))
    seed, seen = [], 0
    for term in by_df[:-1]:                 # the rarest terms, at most PRUNE_SEED_MATCHES units (at least one)
        if seed and seen + df[term] > PRUNE_SEED_MATCHES:
            break
        seed.append(term)
        seen += df[term]
    q = dict(args)
    found = score(conn, match_where(p, seed, q), q, terms, bm25, p.top_k)
    if len(found) < p.top_k:
        return live
    floor = found[-1][0].score
    weight = {t: sum(w for x, w in zip(terms, bm25.weights) if x == t) for t in live}
    dropped, total = set(), 0.0
    for term in reversed(by_df):            # the most common first
        if total + weight[term] >= floor:
            break
        total += weight[term]
        dropped.add(term)
    return [t for t in live if t not in dropped] or live


def queued_where(p, args: dict) -> str:
    """The tenant's units still queued for the indexer (pending, alias u) in [first, last] that pass the
    filters."""
    return " AND ".join(["u.tenant = %(tenant)s", "u.day BETWEEN %(first)s AND %(last)s"] + pg_filters(p, args))
