"""The tokenizer contract (docs/design.md §6): one function for indexing and queries."""
from __future__ import annotations

import gzip
import json
import random
import re
import sqlite3
from pathlib import Path

import pytest
from hypothesis import example, given, HealthCheck, settings
from hypothesis import strategies as st

from service.tokenize import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
STARD_CORPUS = ROOT.parent / "shared" / "eval" / "stard" / "corpus.jsonl.gz"

# What FTS5 unicode61 (tokenchars '-_.') keeps inside one token: letters, numbers, '-', '_', '.'.
TOKEN_CHARS = re.compile(r"^(?:[^\W_]|[-_.])+$")

FALLBACK_LINES = [
    "订单管理系统上线后，ORD-7890 的状态变成了 shipped。",
    "用户反馈：支付接口 api.v2 在高峰期返回 HTTP 502 错误。",
    "The order_id field is missing from the webhook payload; 请检查 schema 版本。",
    "劳动合同期满后，用人单位应当在十五日内为劳动者办理档案和社会保险关系转移手续。",
    "Running the migration twice should be idempotent (see RFC-2119 wording).",
    "中华人民共和国民法典第一千零六十二条规定了夫妻共同财产的范围。",
    "消费者在购买、使用商品和接受服务时享有人身、财产安全不受损害的权利。",
    "Kubernetes pod OOMKilled: 内存上限 512Mi，实际峰值 730Mi。",
    "个体工商户可以个人经营，也可以家庭经营。",
    "机动车驾驶人应当遵守道路交通安全法律、法规的规定，按照操作规范安全驾驶、文明驾驶。",
    "北京市朝阳区人民法院受理了该案，案号为（2023）京0105民初12345号。",
    "研究生命起源的科学家认为，南京市长江大桥附近的化石很有价值。",
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer()


@pytest.fixture(scope="module")
def tok_jieba():
    pytest.importorskip("jieba")
    return Tokenizer(segmenter="jieba")


@pytest.fixture(scope="module")
def tok_rjieba():
    pytest.importorskip("rjieba")
    return Tokenizer(segmenter="rjieba")


def found_by(tok: Tokenizer, doc: str, query: str) -> bool:
    """An AND search for `query` finds `doc`: every query term is one of the document's tokens."""
    doc_tokens = set(tok.tokens(doc))
    terms = tok.query_terms(query)
    return bool(terms) and all(t in doc_tokens for t in terms)


# --- rules ----------------------------------------------------------------------------------------
def test_identifier_whole_and_parts(tok):
    toks = tok.tokens("Order ORD-7890 shipped")
    assert "ord-7890" in toks and "ord" in toks and "7890" in toks
    assert found_by(tok, "Order ORD-7890 shipped", "ORD-7890")
    assert found_by(tok, "Order ORD-7890 shipped", "7890")
    assert found_by(tok, "Order ORD-7890 shipped", "ord")


@pytest.mark.parametrize("ident, parts", [
    ("order_id", ["order", "id"]),
    ("api.v2", ["api", "v2"]),
    ("snake_case_name", ["snake", "case", "name"]),
    ("v1.2.3", ["v1", "2", "3"]),
])
def test_other_identifiers(tok, ident, parts):
    toks = tok.tokens(f"see {ident} here")
    assert ident in toks
    for p in parts:
        assert tok._stem(p) in toks
    assert found_by(tok, f"see {ident} here", ident)


def test_chinese_compound_found_by_its_words(tok):
    doc = "订单管理系统"
    assert found_by(tok, doc, "订单管理")
    assert found_by(tok, doc, "管理系统")
    assert found_by(tok, doc, "订单管理系统")


def test_english_and_chinese_in_one_unit(tok):
    doc = "部署失败：the deployment of 订单服务 failed with ORD-7890"
    assert found_by(tok, doc, "部署")
    assert found_by(tok, doc, "deployment")
    assert found_by(tok, doc, "订单服务")
    assert found_by(tok, doc, "ORD-7890")


def test_lowercase_and_punctuation_dropped(tok):
    toks = tok.tokens("Hello, WORLD!!! (Déjà) — 「你好」？…")
    assert all(t == t.lower() for t in toks)
    assert "hello" in toks and "world" in toks and "déjà" in toks
    assert not any(ch in t for t in toks for ch in ",!()—「」？…")
    assert tok.tokens("!!! ... --- ___ ，。？") == []


def test_query_terms_distinct_in_order(tok):
    assert tok.query_terms("error ERROR error 7890") == ["error", "7890"]


def test_stopwords_dropped(tok):
    toks = tok.tokens("the cat is on the mat")
    assert "the" not in toks and "is" not in toks and "cat" in toks


def test_stemming_conflates_english_forms():
    stem = Tokenizer(stem=True)
    assert stem.tokens("running") == stem.tokens("runs") == ["run"]
    plain = Tokenizer(stem=False)
    assert plain.tokens("running") == ["running"]


def test_unknown_segmenter_rejected():
    with pytest.raises(ValueError):
        Tokenizer(segmenter="nope")


# --- rjieba and jieba agree -----------------------------------------------------------------------
def sample_lines(n: int = 300) -> list[str]:
    """~n lines drawn from the STARD corpus (deterministic), or a built-in mixed sample."""
    if not STARD_CORPUS.exists():
        return FALLBACK_LINES
    with gzip.open(STARD_CORPUS, "rt", encoding="utf-8") as fh:
        lines = fh.readlines()
    rng = random.Random(20240601)
    picked = [json.loads(line) for line in rng.sample(lines, min(n, len(lines)))]
    return [d.get("title", "") + "\n" + d.get("text", "") for d in picked]


def test_rjieba_and_jieba_identical(tok_jieba, tok_rjieba):
    lines = sample_lines() + FALLBACK_LINES
    assert len(lines) >= 12
    for line in lines:
        assert tok_rjieba.tokens(line) == tok_jieba.tokens(line), line


# --- properties -----------------------------------------------------------------------------------
hostile_text = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec=None, blacklist_categories=())),  # includes lone surrogates
    st.lists(st.sampled_from(["订单", "管理", "ORD-7890", "order_id", "\x00", "😀", "\ud800", "\udfff", " ",
                              "api.v2", "-", "_", ".", "İ", "ß", "ﬁ", "Ａ１", "é", "\u0301", "٣", "中文",
                              "\u200b", "\t\n", "¹²", "ǅ", "𠀀", "ⅷ"]), max_size=30).map("".join),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_text)
@example("\ufada")              # an unassigned code point inside the CJK Compatibility block (found by CI)
@example("订单\ufa6e号")
def test_tokens_only_fts_token_chars(text):
    tok = Tokenizer()
    for t in tok.tokens(text):
        assert t, "empty token"
        assert TOKEN_CHARS.match(t), repr(t)
        assert not any(ch.isspace() for ch in t)
        assert t == t.lower()
    tok.query_terms(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_text)
def test_jieba_and_rjieba_agree_on_arbitrary_text(text):
    pytest.importorskip("jieba")
    pytest.importorskip("rjieba")
    assert Tokenizer(segmenter="rjieba").tokens(text) == Tokenizer(segmenter="jieba").tokens(text)


@pytest.fixture(scope="module")
def fts():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(tokens, tokenize = "
                 "\"unicode61 remove_diacritics 0 tokenchars '-_.'\")")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, row)")
    yield conn
    conn.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(hostile_text)
def test_fts5_keeps_every_token_whole(fts, text):
    """The index holds exactly our tokens: FTS5 neither splits nor case-folds any of them."""
    toks = Tokenizer().tokens(text)
    fts.execute("DELETE FROM f")
    if not toks:
        return
    fts.execute("INSERT INTO f(rowid, tokens) VALUES (1, ?)", (" ".join(toks),))
    vocab = {row[0] for row in fts.execute("SELECT term FROM v")}
    assert vocab == set(toks)


def test_every_code_point_agrees_with_fts5(fts):
    """Exhaustive over Unicode: a token containing any letter or digit is kept whole by FTS5, and
    FTS5's case folding leaves it unchanged (SQLite's Unicode tables are older than Python's)."""
    tok = Tokenizer(stem=False, stopwords=frozenset())
    tokens: dict[str, int] = {}
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        if not (ch.isalnum() or ch.lower() != ch):
            continue
        for t in tok.tokens("a" + ch + "b"):
            tokens.setdefault(t, cp)
    items = list(tokens.items())
    fts.execute("DELETE FROM f")
    fts.executemany("INSERT INTO f(rowid, tokens) VALUES (?, ?)", [(i + 1, t) for i, (t, _) in enumerate(items)])
    fts.execute("CREATE VIRTUAL TABLE IF NOT EXISTS vi USING fts5vocab(f, instance)")
    got: dict[int, list[str]] = {}
    for term, doc in fts.execute("SELECT term, doc FROM vi"):
        got.setdefault(doc, []).append(term)
    bad = [(hex(cp), t, got.get(i + 1)) for i, (t, cp) in enumerate(items) if got.get(i + 1) != [t]]
    fts.execute("DELETE FROM f")
    assert not bad, bad[:20]
