"""The scoring statement alone (service/store/sqlite/fts.py, issue 13): printed, run on a plain table with the units
columns, it ranks exactly as BM25 computed by hand over the same tokens."""
import math
import sqlite3

import pytest

from service.ranking.bm25 import Bm25, ShardHit
from service.store.sqlite.fts import fts_query, fts_scoring_sql, score

DOCS = {"a1": "order ship order", "b2": "order refund", "c3": "ship ship ship parcel label", "d4": "invoice"}


@pytest.fixture
def conn():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE units (id INTEGER PRIMARY KEY, cid TEXT, ntok INTEGER, tokens TEXT, expires_at INTEGER)")
    for i, (cid, tokens) in enumerate(DOCS.items(), 1):
        conn.execute("INSERT INTO units VALUES (?, ?, ?, ?, ?)", (i, cid, len(tokens.split()), tokens, 10**12))
    yield conn
    conn.close()


def by_hand(terms, k1=1.2, b=0.75):
    n = len(DOCS)
    avgdl = sum(len(t.split()) for t in DOCS.values()) / n
    idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5))
           for t in terms for df in [sum(t in d.split() for d in DOCS.values())]}
    out = {}
    for cid, text in DOCS.items():
        toks = text.split()
        norm = k1 * (1 - b + b * len(toks) / avgdl)
        s = sum(idf[t] * (k1 + 1) * toks.count(t) / (toks.count(t) + norm) for t in terms)
        if s:
            out[cid] = s
    return out, [idf[t] * (k1 + 1) for t in terms], avgdl


def test_the_statement_is_text_with_only_bound_values():
    text = fts_scoring_sql("FROM units u WHERE u.expires_at > :now", 2, "or")
    assert text.startswith("WITH c AS MATERIALIZED (SELECT u.id AS id") and text.endswith("LIMIT :k")
    for name in (":p0", ":p1", ":w0", ":w1", ":k1", ":b", ":avgdl"):
        assert name in text
    assert "order" not in text          # terms are parameters, never SQL


@pytest.mark.parametrize("terms", [["order"], ["order", "ship"], ["ship", "parcel", "nothing"]])
def test_scores_equal_bm25_by_hand(conn, terms):
    want, weights, avgdl = by_hand(terms)
    hits = score(conn, "FROM units u WHERE u.expires_at > :now", {}, terms, Bm25(weights, avgdl, 1.2, 0.75),
                 k=10, now=0, require="or")
    assert all(isinstance(h, ShardHit) for h in hits)
    assert {h.cid: h.score for h in hits} == pytest.approx(want)
    assert [h.cid for h in hits] == sorted(want, key=lambda c: (-want[c], c))
    assert [h.order for h in hits] == sorted(h.order for h in hits)


def test_and_keeps_only_units_with_every_term(conn):
    _, weights, avgdl = by_hand(["order", "ship"])
    hits = score(conn, "FROM units u WHERE u.expires_at > :now", {}, ["order", "ship"],
                 Bm25(weights, avgdl, 1.2, 0.75), k=10, now=0, require="and")
    assert [(h.cid, h.tfs) for h in hits] == [("a1", [2, 1])]


def test_fts_query_quotes_every_token():
    assert fts_query(['or"der', "NEAR"], "and") == '"or""der" AND "NEAR"'
