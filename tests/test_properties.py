"""Property tests (issue 7): the unit validator, the search-body parser and the FTS5 query builder
accept or reject every input with a 4xx ApiError, and never produce FTS5 syntax errors."""
import hashlib
import sqlite3
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import Config
from service.errors import ApiError
from service.params import SearchParams, parse_search
from service.store.sqlite.fts import fts_query
from service.tokenize import tokenizer_for
from service.units import validate_unit

CONFIG = Config()
NOW = time.time()

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
unit_keys = st.sampled_from(["cid", "type", "source", "timestamp", "ttl", "content", "metadata", "parent_cid",
                             "extra"])


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(unit_keys, json_values, max_size=9) | json_values)
def test_validator_accepts_or_rejects_with_4xx(raw):
    try:
        unit = validate_unit(raw, CONFIG, NOW)
    except ApiError as e:
        assert 400 <= e.status < 500 and e.code and e.message
    else:
        assert unit.cid == hashlib.sha256((unit.content + str(unit.timestamp) + unit.source)
                                          .encode()).hexdigest()[:12]


valid_units = st.fixed_dictionaries({
    "type": st.sampled_from(CONFIG.types),
    "source": st.text(st.characters(min_codepoint=0x20, blacklist_categories=("Cs", "Cc")), min_size=1,
                      max_size=200).filter(str.strip),
    "timestamp": st.integers(int(NOW) - 10**6, int(NOW)),
    "ttl": st.integers(10**6 + 60, CONFIG.max_ttl),
    "content": st.text(max_size=500).filter(lambda s: all(not 0xD800 <= ord(c) <= 0xDFFF for c in s)),
})


@settings(max_examples=300)
@given(valid_units)
def test_every_valid_unit_is_accepted_with_its_cid(raw):
    unit = validate_unit(raw, CONFIG, NOW)
    assert unit.cid == hashlib.sha256((raw["content"] + str(raw["timestamp"]) + raw["source"])
                                      .encode("utf-8")).hexdigest()[:12]
    assert validate_unit({**raw, "cid": unit.cid}, CONFIG, NOW) == unit


@settings(max_examples=600)
@given(st.dictionaries(st.sampled_from(["query", "top_k", "types", "source", "since", "until", "parent_cid",
                                        "min_score", "operator", "consistency", "after_seq", "highlight",
                                        "explain", "other"]), json_values, max_size=8) | json_values)
def test_search_body_parses_or_is_a_4xx(body):
    try:
        params = parse_search(body, CONFIG)
    except ApiError as e:
        assert 400 <= e.status < 500 and e.code
    else:
        assert isinstance(params, SearchParams) and 1 <= params.top_k <= 100


def _fts():
    conn = sqlite3.connect(":memory:")
    conn.execute("""CREATE VIRTUAL TABLE f USING fts5(tokens, tokenize="unicode61 remove_diacritics 0 tokenchars '-_.'")""")
    conn.execute("INSERT INTO f(tokens) VALUES ('ord-7890 ord 7890 订单 near and or not')")
    return conn


FTS = _fts()
TOKENIZER = tokenizer_for(CONFIG)


@settings(max_examples=800)
@given(st.text(max_size=300), st.sampled_from(["or", "and"]))
def test_query_builder_never_produces_fts5_syntax(text, operator):
    terms = TOKENIZER.query_terms(text)
    if terms:
        FTS.execute("SELECT rowid FROM f WHERE f MATCH ?", (fts_query(terms, operator),)).fetchall()


@settings(max_examples=500)
@given(st.lists(st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s), min_size=1, max_size=5))
def test_quoting_neutralises_any_string(raw_terms):
    # Even strings the tokenizer would never emit (quotes, operators, parentheses) stay literal.
    FTS.execute("SELECT rowid FROM f WHERE f MATCH ?", (fts_query(raw_terms, "or"),)).fetchall()
