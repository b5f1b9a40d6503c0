"""Request parameters, declared once (docs/design.md §4).

Each field of the search request is one row of ``SEARCH`` (name, kind, bounds, default,
description, and the doors that accept it). The rows drive everything a door does with them:
validation (``parse_search``, ``parse_context``), the GET query string (``from_query_string``), the
MCP tool's input schema and the OpenAPI schemas (``schema``, ``properties``), and the Continue
provider's options (``names("continue")``). Adding a filter is one new row.

The doors:
  search    POST/GET /mcp/search (every field)
  context   POST /mcp/context (the search fields that shape a prompt, plus the two packing fields)
  tool      the MCP tool context_search
  continue  the ``options`` of Continue's http provider (its query comes from query/fullInput)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .errors import BadRequest
from .formats import CONTROL_CHARS_RE, is_cid
from .unitkeys import MAX_PROJECT_CHARS
from .units import CID_SCHEMA

MAX_QUERY_CHARS = 16_384
MAX_TIMESTAMP = 253_402_300_799   # 9999-12-31T23:59:59Z
MAX_NEIGHBORS = 5                 # units on each side of a result in its context window

DOORS = ("search", "context", "tool", "continue")
_ALL = frozenset(DOORS)
_NOT_CONTINUE = frozenset({"search", "context", "tool"})

@dataclass(frozen=True)
class Field:
    """One request field. ``kind`` picks the validation and the JSON Schema:
    text, integer, count (an integer with one combined message), number, boolean, choice, types, source, cid,
    key (a derived key's exact value, service/unitkeys.py)."""
    name: str
    kind: str
    description: str
    default: Any = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] = ()
    clamp: int | None = None          # larger values select what this one does (accepted, then capped)
    doors: frozenset[str] = _ALL


SEARCH: tuple[Field, ...] = (
    Field("query", "text", "Plain search text (Chinese and English); never query syntax.",
          maximum=MAX_QUERY_CHARS, doors=_NOT_CONTINUE),
    Field("top_k", "integer", "How many results to return.", default=10, minimum=1, maximum=100),
    Field("types", "types", "Only units of these types."),
    Field("source", "source", "Only this source; a trailing '*' matches a prefix.", maximum=201),
    Field("since", "integer", "Only units with timestamp >= since (Unix s).", minimum=0, clamp=MAX_TIMESTAMP),
    Field("until", "integer", "Only units with timestamp <= until (Unix s).", minimum=0, clamp=MAX_TIMESTAMP),
    Field("parent_cid", "cid", "Only direct children of this unit.", doors=_NOT_CONTINUE),
    Field("project", "key", "Only units whose metadata.project is this, plus units marked global "
          "(metadata.global true).", maximum=MAX_PROJECT_CHARS),
    Field("min_score", "number", "Drop results whose normalized score is below this.", default=0.0,
          minimum=0, maximum=1),
    Field("operator", "choice", "Match any query term (or) or all of them (and).", default="or",
          choices=("or", "and")),
    Field("consistency", "choice", "'strong' sees every acknowledged push (read-your-writes).",
          default="replica", choices=("replica", "strong")),
    Field("after_seq", "integer", "See at least every push acknowledged with this seq or lower.", minimum=0,
          doors=_NOT_CONTINUE),
    Field("highlight", "boolean", "Add a snippet with matches marked.", default=False,
          doors=frozenset({"search", "tool"})),
    Field("explain", "boolean", "Add per-term idf and tf contributions.", default=False,
          doors=frozenset({"search"})),
    Field("neighbors", "integer", "Answer each result with up to this many units before and after it in its "
          "thread (a context window: 'neighbors': {'before': [...], 'after': [...]}).", default=0, minimum=0,
          maximum=MAX_NEIGHBORS),
)
# POST /mcp/context only: how the results are packed.
PACKING: tuple[Field, ...] = (
    Field("budget_tokens", "count", "Token budget of the packed text.", default=2000, minimum=1, maximum=200_000,
          doors=frozenset({"context"})),
    Field("max_chars_per_item", "count", "Longer unit contents are cut to this many characters.", default=2000,
          minimum=1, maximum=1_000_000, doors=frozenset({"context"})),
)
# Where a door's default differs from the field's.
# Packed context, Continue's items and Dify's records carry each hit's nearest neighbors in its thread (a turn
# with the one that asked for it); packing drops them first when a budget is short (service/packing.py).
ADAPTER_NEIGHBORS = 1
DOOR_DEFAULTS = {"context": {"top_k": 20, "neighbors": ADAPTER_NEIGHBORS},
                 "continue": {"top_k": 5, "neighbors": ADAPTER_NEIGHBORS}}

_BY_NAME = {f.name: f for f in PACKING + SEARCH}
# Names other APIs (and our own query string) use, and the field a body calls them: said in the 400.
HINTS = {"q": "query", "text": "query", "k": "top_k", "limit": "top_k", "n": "top_k", "type": "types",
         "threshold": "min_score", "score_threshold": "min_score", "parent": "parent_cid"}


@functools.cache
def fields(door: str) -> tuple[Field, ...]:
    """The fields one door accepts, in the order they are validated (packing first, then SEARCH's order)."""
    return tuple(f for f in PACKING + SEARCH if door in f.doors)


@functools.cache
def _accepted(door: str) -> frozenset[str]:
    return frozenset(f.name for f in fields(door))


def names(door: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(door))


@dataclass(frozen=True)
class SearchParams:
    query: str
    top_k: int = 10
    types: tuple[str, ...] | None = None
    source: str | None = None
    since: int | None = None
    until: int | None = None
    parent_cid: str | None = None
    project: str | None = None
    min_score: float = 0.0
    operator: str = "or"
    consistency: str = "replica"
    after_seq: int | None = None
    highlight: bool = False
    explain: bool = False
    neighbors: int = 0

    @property
    def strong(self) -> bool:
        return self.consistency == "strong" or self.after_seq is not None


# --- validation, one function per kind ------------------------------------------------------------
def plain_text(v: str, name: str) -> str:
    """A text parameter that can reach storage: no NUL (PostgreSQL's text cannot hold one) and no lone
    surrogate (it has no UTF-8 form, so SQLite, PostgreSQL and every hash refuse it): 400, not 500."""
    if "\0" in v:
        raise BadRequest(f"Field {name!r} must not contain NUL characters.", field=name)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"Field {name!r} is not valid Unicode (lone surrogate).", field=name) from None
    return v


def _text(f: Field, v, config):
    if v is None:
        raise BadRequest(f"Field {f.name!r} is required.", code="missing_field", field=f.name)
    if not isinstance(v, str):
        raise BadRequest(f"Field {f.name!r} must be a string.", field=f.name)
    if len(v) > f.maximum:
        raise BadRequest(f"Field {f.name!r} must be at most {f.maximum} characters.",
                         code="query_too_long", field=f.name)
    return plain_text(v, f.name)


def _integer(f: Field, v, config):
    if v is None:
        return f.default
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequest(f"Field {f.name!r} must be an integer.", field=f.name)
    if (f.minimum is not None and v < f.minimum) or (f.maximum is not None and v > f.maximum):
        raise BadRequest(f"Field {f.name!r} must be between {f.minimum} and {f.maximum}.", field=f.name)
    return min(v, f.clamp) if f.clamp is not None else v


def _count(f: Field, v, config):
    if v is None:
        return f.default
    if not isinstance(v, int) or isinstance(v, bool) or not f.minimum <= v <= f.maximum:
        raise BadRequest(f"Field {f.name!r} must be an integer between {f.minimum} and {f.maximum}.", field=f.name)
    return v


def _number(f: Field, v, config):
    if v is None:
        return f.default
    if isinstance(v, bool) or not isinstance(v, int | float) or not f.minimum <= v <= f.maximum:
        raise BadRequest(f"Field {f.name!r} must be a number between {f.minimum} and {f.maximum}.", field=f.name)
    return float(v)


def _boolean(f: Field, v, config):
    if v is None:
        return f.default
    if not isinstance(v, bool):
        raise BadRequest(f"Field {f.name!r} must be true or false.", field=f.name)
    return v


def _choice(f: Field, v, config):
    v = v or f.default
    if v not in f.choices:
        raise BadRequest(f"Field {f.name!r} must be {' or '.join(map(repr, f.choices))}.", field=f.name)
    return v


def _types(f: Field, v, config):
    if v is None:
        return None
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise BadRequest(f"Field {f.name!r} must be a list of type names.", field=f.name)
    bad = [x for x in v if x not in config.types]
    if bad:
        raise BadRequest(f"Unknown type {bad[0]!r}; known: {', '.join(config.types)}.",
                         code="invalid_type", field=f.name)
    return tuple(dict.fromkeys(v)) or None


def _source(f: Field, v, config):
    if v is not None and (not isinstance(v, str) or not v or len(v) > f.maximum):
        raise BadRequest(f"Field {f.name!r} must be a non-empty string (exact, or a prefix ending in '*').",
                         field=f.name)
    if v is not None and CONTROL_CHARS_RE.search(v):   # (no source holds one: docs/design.md §3)
        raise BadRequest(f"Field {f.name!r} must not contain control characters.", field=f.name)
    return v if v is None else plain_text(v, f.name)


def _key(f: Field, v, config):
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > f.maximum or CONTROL_CHARS_RE.search(v):
        raise BadRequest(f"Field {f.name!r} must be a string of 1 to {f.maximum} characters without control "
                         "characters.", field=f.name)
    return plain_text(v, f.name)


def _cid(f: Field, v, config):
    if v is not None and not is_cid(v):
        raise BadRequest(f"Field {f.name!r} must be 12 lowercase hex digits.", code="invalid_cid", field=f.name)
    return v


_CHECK = {"text": _text, "integer": _integer, "count": _count, "number": _number, "boolean": _boolean,
          "choice": _choice, "types": _types, "source": _source, "key": _key, "cid": _cid}


def parse(body, config, door: str, *, what: str) -> dict:
    """Every field ``door`` accepts, validated in declaration order: 400 on the first problem."""
    if not isinstance(body, dict):
        raise BadRequest(f"The {what} body must be a JSON object.", code="invalid_body")
    declared, accepted = fields(door), _accepted(door)      # (made once per door)
    unknown = sorted(set(body) - accepted)
    if unknown:
        hint = HINTS.get(unknown[0])
        hint = f"; did you mean {hint!r}?" if hint and hint in accepted else "."
        raise BadRequest(f"Unknown field {unknown[0]!r}{hint}", code="unknown_field", field=unknown[0])
    defaults = DOOR_DEFAULTS.get(door, {})
    return {f.name: _CHECK[f.kind](f, body[f.name] if f.name in body else defaults.get(f.name), config)
            for f in declared}


def parse_search(body, config, door: str = "search") -> SearchParams:
    """Validate a search request (REST, MCP tool, resources, prompts, adapters) for ``door``."""
    return SearchParams(**parse(body, config, door, what="search"))


def parse_context(body, config) -> tuple[SearchParams, int, int]:
    """POST /mcp/context: the search, the token budget and the characters kept per item."""
    values = parse(body, config, "context", what="context")
    budget, max_chars = (values.pop(f.name) for f in PACKING)
    return SearchParams(**values), budget, max_chars


# --- the GET query string -------------------------------------------------------------------------
_TRUE = ("1", "true", "yes", "on")


def query_value(args, key: str) -> str | None:
    """One query-string parameter's value; given more than once it is 400 (which one was meant is a guess)."""
    values = args.getlist(key)
    if len(values) > 1:
        raise BadRequest(f"Parameter {key!r} is given {len(values)} times; give it once.",
                         code="duplicate_parameter", field=key)
    return values[0] if values else None


def query_list(args, key: str) -> list[str]:
    """A list parameter: ``types=a,b`` and ``types=a&types=b`` alike (issue 26: only the first counted)."""
    return [x for value in args.getlist(key) for x in value.split(",") if x]


def from_query_string(args) -> dict:
    """GET /mcp/search?q=...: the search door's fields from a query string (``q`` names ``query``),
    converted by kind; validation is then the JSON body's."""
    body: dict = {}
    if "q" in args and "query" in args:
        raise BadRequest("Give the search text once, as 'q' or as 'query'.", code="duplicate_parameter",
                         field="query")
    for key in args:
        name = "query" if key == "q" else key
        f = _BY_NAME.get(name)
        if f is None or "search" not in f.doors:
            raise BadRequest(f"Unknown parameter {key!r}.", code="unknown_field", field=key)
        if f.kind == "types":
            body[name] = query_list(args, key)
            continue
        value = query_value(args, key)
        if f.kind in ("integer", "count"):
            try:
                body[name] = int(value)
            except ValueError:
                raise BadRequest(f"Parameter {key!r} must be an integer.", field=name) from None
        elif f.kind == "number":
            try:
                body[name] = float(value)
            except ValueError:
                raise BadRequest(f"Parameter {key!r} must be a number.", field=name) from None
        elif f.kind == "boolean":
            body[name] = value.lower() in _TRUE
        else:
            body[name] = value
    return body


# --- JSON Schema (MCP tool input, OpenAPI) ----------------------------------------------------------
def schema(f: Field, config, door: str | None = None) -> dict:
    """The JSON Schema of one field (with its description and default for ``door``)."""
    out: dict
    if f.kind == "text":
        out = {"type": "string", "maxLength": f.maximum}
    elif f.kind in ("integer", "count", "number"):
        out = {"type": "number" if f.kind == "number" else "integer"}
        out.update({k: v for k, v in (("minimum", f.minimum), ("maximum", f.maximum)) if v is not None})
    elif f.kind == "boolean":
        out = {"type": "boolean"}
    elif f.kind == "choice":
        out = {"type": "string", "enum": list(f.choices)}
    elif f.kind == "types":
        out = {"type": "array", "items": {"type": "string", "enum": list(config.types)}}
    elif f.kind in ("source", "key"):
        out = {"type": "string", "minLength": 1, "maxLength": f.maximum}
    else:
        out = dict(CID_SCHEMA)
    default = DOOR_DEFAULTS.get(door, {}).get(f.name, f.default)
    if default is not None:
        out["default"] = default
    out["description"] = f.description
    return out


def properties(door: str, config) -> dict:
    """``properties`` of an object schema: every field ``door`` accepts."""
    return {f.name: schema(f, config, door) for f in fields(door)}


def query_parameters(config) -> list[dict]:
    """OpenAPI parameters of GET /mcp/search: ``q`` for the query, ``types`` comma-separated."""
    out = []
    for f in fields("search"):
        if f.kind == "text":
            out.append({"name": "q", "in": "query", "required": True, "description": f.description,
                        "schema": {"type": "string", "maxLength": f.maximum}})
        elif f.kind == "types":
            out.append({"name": f.name, "in": "query", "required": False,
                        "description": f.description + " Comma-separated type names, or the parameter repeated "
                                       "(types=a&types=b).", "schema": {"type": "string"}})
        else:
            s = schema(f, config, "search")
            out.append({"name": f.name, "in": "query", "required": False, "description": s.pop("description"),
                        "schema": s})
    return out
