"""Tool search's ranking, on either store: BM25 per token column (name and title; description and tags; the
schemas' property names, titles and descriptions), each tokenized by service/tokenize.py as units are, summed
with WEIGHTS, with the unit search's idf, k1 and b; and the 0-1 score of the answers."""
from __future__ import annotations

import re

from ..toolcheck import Tool, tool_dict
from .bm25 import idf_of, length_norm, term_score, term_weight

# BM25 per token column, summed with these weights, with the unit search's always-positive idf and k1, b
# (service/ranking/bm25.py). The description weighs most: it is where a tool's meaning is written, while
# names repeat the same service and object words over many tools (bench/tools.py: recall@5 on the
# judged set's dev half 0.50 with names at 2.0, 0.62 at 0.5; README there).
WEIGHTS = {"name": 0.5, "text": 1.0, "schema": 0.5}
# Bounded work per query (a tool's schema alone may hold ~256 KB of tokens): candidates are taken best
# first (SQLite: FTS5's rank; PostgreSQL: by name) until MAX_CANDIDATES rows or ``tool_search_bytes`` of
# token text are read; of each column only its first COLUMN_BYTES count (its length in tokens stays exact).
MAX_CANDIDATES = 5000
COLUMN_BYTES = 64 * 1024
CANDIDATE_PAGE = 200          # candidate rows read per round
# Bounded answers: tools are added best first until their JSON passes this (the first always is).
ANSWER_BYTES = 4 << 20
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


# --- tokens -----------------------------------------------------------------------------------------
def _words(name: str) -> str:
    """A name as words too: ``getWeatherForecast`` and ``get_weather.v2`` as their parts."""
    return name + " " + re.sub(r"[-_.]", " ", _CAMEL.sub(" ", name))


def _schema_text(schema: dict | None, out: list[str], depth: int = 0) -> None:
    """Property names, titles and descriptions of a schema, nested ones included (bounded)."""
    if not isinstance(schema, dict) or depth > 16 or len(out) > 2000:
        return
    for key in ("title", "description"):
        if isinstance(schema.get(key), str):
            out.append(schema[key])
    props = schema.get("properties")
    if isinstance(props, dict):
        for prop, sub in props.items():
            out.append(_words(str(prop)))
            _schema_text(sub, out, depth + 1)
    for key in ("items", "additionalProperties"):
        _schema_text(schema.get(key), out, depth + 1)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            for sub in schema[key]:
                _schema_text(sub, out, depth + 1)
    defs = schema.get("$defs")
    if isinstance(defs, dict):
        for sub in defs.values():
            _schema_text(sub, out, depth + 1)


def token_columns(tool: Tool, tokenizer) -> dict:
    schema_parts: list[str] = []
    _schema_text(tool.input_schema, schema_parts)
    _schema_text(tool.output_schema, schema_parts)
    columns = {"name": tokenizer.tokens(_words(tool.name) + " " + (tool.title or "")),
               "text": tokenizer.tokens(tool.description + " " + " ".join(tool.tags)),
               "schema": tokenizer.tokens(" ".join(schema_parts))}
    out = {}
    for col, tokens in columns.items():
        out[f"t_{col}"] = " ".join(tokens)
        out[f"n_{col}"] = len(tokens)
    return out


def bm25(rows, terms: list[str], stats, df: dict[str, int]) -> dict[int, float]:
    """Score candidate rows: per column BM25 (global N, df and average lengths), summed with WEIGHTS."""
    n, lengths = stats[0], dict(zip(WEIGHTS, stats[1:]))
    avg = {col: (lengths[col] / n if n else 0.0) or 1.0 for col in WEIGHTS}
    idf = {term: idf_of(n, df.get(term, 0)) for term in terms}
    scores = {}
    for r in rows:
        total = 0.0
        for col, weight in WEIGHTS.items():
            text = r[f"t_{col}"]
            if not text:
                continue
            # each token between two spaces, spaces doubled: counted in C, occurrences never overlap
            padded = " " + text.replace(" ", "  ") + " "
            counts = {t: c for t in idf if (c := padded.count(f" {t} "))}
            norm = length_norm(r[f"n_{col}"], avg[col])
            total += weight * sum(term_score(term_weight(idf[t]), tf, norm) for t, tf in counts.items())
        scores[r["id"]] = total
    return scores


def clipped(text: str) -> str:
    """A token column as read for scoring: its first COLUMN_BYTES, without a token cut at the end."""
    if len(text) < COLUMN_BYTES:
        return text
    return text[:COLUMN_BYTES].rsplit(" ", 1)[0]


def bounded_candidates(ids: list, read_columns, max_bytes: int) -> list:
    """Candidate rows in the order of ``ids`` (best first), read CANDIDATE_PAGE at a time by
    ``read_columns(ids) -> {id: row}`` (columns already cut to COLUMN_BYTES in SQL), until ``max_bytes``
    of token text were read (at least one row)."""
    rows, used = [], 0
    for start in range(0, min(len(ids), MAX_CANDIDATES), CANDIDATE_PAGE):
        page = ids[start:start + CANDIDATE_PAGE]
        found = read_columns(page)
        for i in page:
            r = found.get(i)
            if r is None:
                continue
            row = {"id": r["id"], "name": r["name"], **{f"n_{c}": r[f"n_{c}"] for c in WEIGHTS},
                   **{f"t_{c}": clipped(r[f"t_{c}"]) for c in WEIGHTS}}
            size = sum(len(row[f"t_{c}"]) for c in WEIGHTS)
            if rows and used + size > max_bytes:
                return rows
            rows.append(row)
            used += size
    return rows


def answers(found: dict, best: list, scores: dict, terms: list[str], stats, df: dict[str, int]) -> list[dict]:
    """The ``best`` tools (keys of ``found`` and ``scores``) in order, each with its ``bm25_score`` and
    ``score`` (0-1: divided by what the query could score at most, as unit search does)."""
    attainable = term_weight(sum(idf_of(stats[0], df.get(t, 0)) for t in terms)) * sum(WEIGHTS.values()) or 1.0
    out, size = [], 0
    for k in best:
        if k not in found:
            continue
        row = found[k]
        # the stored JSON texts' lengths: what the answer grows by
        grows = sum(len(row[c] or "") for c in ("input_schema", "output_schema", "metadata", "description"))
        if out and size + grows > ANSWER_BYTES:
            break
        size += grows
        out.append(dict(tool_dict(row), bm25_score=round(scores[k], 6), score=round(min(1.0, scores[k] / attainable), 6)))
    return out
