"""One tokenizer for indexing and for queries (docs/design.md §6).

Lower-cased; Han runs segmented by jieba in search mode (HMM off, so rjieba and jieba
agree); Latin words and numbers kept whole; identifiers such as ``ORD-7890``,
``order_id`` and ``api.v2`` emitted whole *and* by their parts; punctuation dropped; a
small stopword list; English words stemmed (Snowball) when enabled.

Every token is made only of characters that FTS5's ``unicode61`` tokenizer (with
``tokenchars '-_.'``) keeps inside one token, so the FTS index holds exactly our tokens.
"""
from __future__ import annotations

import logging
import re
import threading
import unicodedata
from functools import lru_cache

log = logging.getLogger(__name__)

# Han ideographs (CJK Unified, Extension A, Compatibility) go to jieba; everything else to the word regex.
_HAN = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# (a Han run holds word characters only: the blocks have unassigned code points, e.g. U+FADA, which
# FTS5 and \w treat as separators)
_RUN_RE = re.compile(rf"(?P<han>(?:(?=[^\W_])[{_HAN}])+)|(?P<word>[^\W_{_HAN}]+(?:[-_.][^\W_{_HAN}]+)*)")
_PART_RE = re.compile(r"[-_.]")
_ASCII_WORD = re.compile(r"^[a-z]+$")

ENGLISH_STOPWORDS = frozenset("""
a an and are as at be but by for if in into is it no not of on or such that the their then
there these they this to was will with from were been has have had do does did so than too
very can could should would may might must i me my we our you your he him his she her its
them what which who whom whose when where why how all any both each few more most other some
""".split())

CHINESE_STOPWORDS = frozenset("""
的 了 是 在 和 与 及 或 也 都 就 而 着 之 其 对 把 被 给 让 于 从 以 为 这 那 这个 那个 一个 我们 你们 他们
吗 呢 吧 啊 呀 哦 嗯 么 什么 怎么 如何 哪些 哪个 是否 可以 能否 应该 需要 有 没有 个 中
谁 哪 哪里 哪儿 多少 几 怎样 怎么样 怎么办 为什么 为何 请问 是不是 能不能 会不会 有没有 要不要 该 什么样
""".split())
# The second line: question words (frequent in users' questions, rare in the documents they look for).
# On STARD (bench/quality.py, bm25s over these tokens, k1 1.2 b 0.75): no stopwords 0.3602 / R@100 0.6546,
# first line only 0.3585 / 0.6593, both lines 0.3588 / 0.6607, STARD's 746-word list 0.3554 / 0.6580:
# differences within noise; the short list keeps recall and keeps words like 不 and 人 searchable.

STOPWORDS = ENGLISH_STOPWORDS | CHINESE_STOPWORDS

# A token longer than this (a base64 blob, a minified line) is no word anyone searches for, and PostgreSQL's
# GIN index refuses a key past about 2.7 kB: one such token stopped a tenant's indexing for good. Dropped; an
# identifier's parts are still kept.
MAX_TOKEN_CHARS = 256


# Where SQLite's unicode61 tables (an older Unicode) disagree with Python's: FTS5 folds final sigma to
# sigma, and treats these New Tai Lue / Vedic signs (letters in Python's Unicode) as separators. Found by
# comparing every code point with FTS5 (tests/test_tokenize.py keeps checking it).
_FTS5_AGREE = str.maketrans({"\u03c2": "\u03c3", **{chr(c): " " for c in
                                                  [*range(0x19B0, 0x19C1), 0x19C8, 0x19C9, 0x1CF2, 0x1CF3]}})


def fold(text: str) -> str:
    """NFKC, then lower case: full-width ``ＯＲＤ－７８９０`` becomes ``ord-7890``, ``ﬁ`` becomes ``fi`` and
    the micro sign ``µ`` becomes Greek ``μ`` (as FTS5's own case folding does, so the index holds exactly
    our tokens)."""
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", text).lower().translate(_FTS5_AGREE)


class Tokenizer:
    """Segments text into index/query tokens. Thread-safe; construct once per process."""

    def __init__(self, segmenter: str = "auto", user_dict: str | None = None, stem: bool = True,
                 stopwords: frozenset[str] | None = STOPWORDS):
        self.stopwords = stopwords or frozenset()
        self._stemmer_lock = threading.Lock()
        self._stemmer = None
        if stem:
            import Stemmer  # PyStemmer: Snowball English
            self._stemmer = Stemmer.Stemmer("english")
        self.segmenter, self._cut = _load_segmenter(segmenter, user_dict)
        self._stem_cache: dict[str, str] = {}

    # --- public API ---------------------------------------------------------------------------
    def tokens(self, text: str) -> list[str]:
        """All tokens of ``text`` in order, with repetition (what the index stores)."""
        out: list[str] = []
        stop = self.stopwords
        for m in _RUN_RE.finditer(fold(text)):
            han = m.group("han")
            if han is not None:
                for w in self._cut(han):
                    if w and w not in stop and len(w) <= MAX_TOKEN_CHARS:
                        out.append(w)
                continue
            word = m.group("word")
            if _PART_RE.search(word):
                # Identifier: whole, then each part (ORD-7890 -> ord-7890, ord, 7890).
                if len(word) <= MAX_TOKEN_CHARS:
                    out.append(word)
                for part in _PART_RE.split(word):
                    if part and part not in stop and len(part) <= MAX_TOKEN_CHARS:
                        out.append(self._stem(part))
            elif word not in stop and len(word) <= MAX_TOKEN_CHARS:
                out.append(self._stem(word))
        return out

    def query_terms(self, text: str) -> list[str]:
        """Distinct tokens of a query, in first-seen order."""
        return list(dict.fromkeys(self.tokens(text)))

    # --- internals ----------------------------------------------------------------------------
    def _stem(self, word: str) -> str:
        if self._stemmer is None or not _ASCII_WORD.match(word):
            return word
        cached = self._stem_cache.get(word)
        if cached is None:
            with self._stemmer_lock:  # PyStemmer objects are not thread-safe
                cached = self._stemmer.stemWord(word)
            if len(self._stem_cache) < 200_000:
                self._stem_cache[word] = cached
        return cached


def _load_segmenter(name: str, user_dict: str | None):
    name = (name or "auto").lower()
    if name not in ("auto", "rjieba", "jieba"):
        raise ValueError(f"unknown segmenter {name!r}: use auto, rjieba or jieba")
    if name in ("auto", "rjieba"):
        try:
            import rjieba
        except ImportError:
            if name == "rjieba":
                raise
            log.warning("rjieba is not installed; using pure-Python jieba (about 25x slower)")
        else:
            if user_dict:
                _load_user_dict(user_dict, rjieba.add_word)
            return "rjieba", lambda s: rjieba.cut_for_search(s, False)
    import jieba
    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    if user_dict:
        _load_user_dict(user_dict, jieba.add_word)
    return "jieba", lambda s: jieba.cut_for_search(s, HMM=False)


def _load_user_dict(path: str, add_word) -> None:
    """jieba's user dictionary format: ``word [freq] [tag]`` per line."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                continue
            freq = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            tag = parts[2] if len(parts) > 2 else None
            add_word(parts[0], freq, tag)


@lru_cache(maxsize=8)
def get_tokenizer(segmenter: str = "auto", user_dict: str | None = None, stem: bool = True) -> Tokenizer:
    return Tokenizer(segmenter=segmenter, user_dict=user_dict, stem=stem)


def tokenizer_for(config) -> Tokenizer:
    return get_tokenizer(config.segmenter, config.user_dict, config.stem)
