"""Snippets (``highlight: true``): a window of a result's content around its first match, matches
marked."""
from __future__ import annotations

import re

SNIPPET_CHARS = 200
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
