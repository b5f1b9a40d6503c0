"""The context unit contract (docs/design.md §3): validation, the CID rule, and the unit's JSON shapes
(push bodies, stored units, search results), declared once for the MCP tools and the OpenAPI document."""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache

# The one secret detector is the Python client's (the hooks run it without the service); the server runs it too
# (CONTEXT_MASK_PUSHES here, the tool registry's refusals in toolcheck.py): tests/test_code_shape.py's
# SERVICE_USES_OF_THE_CLIENT states every such use.
from context_mode_client import secretscan

from .config import Config
from .errors import ApiError, BadRequest, Unprocessable
from .formats import CONTROL_CHARS_RE, is_cid
from .unitkeys import COLUMNS as KEY_COLUMNS, derive

CID_SCHEMA = {"type": "string", "pattern": "^[0-9a-f]{12}$", "description": "12 lowercase hex digits.",
              "examples": ["1f0c2a9be7d4"]}
# "Kept for good" (CONTEXT_MAX_TTL=0): a ttl so long that expires_at (timestamp + ttl) stays a finite
# integer every reader already handles (< 2**53, exact in JSON doubles): about 31.7 million years.
NEVER_TTL = 10**15


def ttl_limit(config: Config) -> int:
    """The largest ttl a push may name: CONTEXT_MAX_TTL, or NEVER_TTL when that is 0 (no maximum)."""
    return config.max_ttl or NEVER_TTL


def default_ttl(config: Config) -> int:
    """The ttl of a unit pushed without one: CONTEXT_DEFAULT_TTL, or NEVER_TTL when that is 0."""
    return config.default_ttl or NEVER_TTL


def compute_cid(content: str, timestamp: int, source: str) -> str:
    """First 12 hex digits of sha256(content + str(timestamp) + source), UTF-8."""
    data = (content + str(timestamp) + source).encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:12]


def content_digest(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def encode_metadata(metadata: dict) -> str:
    """Metadata as stored: compact JSON, UTF-8 kept, no NaN or Infinity (ValueError)."""
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def day_of(timestamp: int) -> str:
    """The unit's own UTC day names its shard file (docs/design.md §5)."""
    return _day_name(timestamp // 86_400)


@lru_cache(maxsize=4096)
def _day_name(days: int) -> str:
    return datetime.fromtimestamp(days * 86_400, tz=timezone.utc).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class Unit:
    cid: str
    type: str
    source: str
    timestamp: int
    ttl: int
    content: str
    metadata: dict | None          # the decoded object when built by hand; validate_unit keeps only the text
    parent_cid: str | None
    metadata_text: str | None = field(default=None, compare=False, repr=False)   # the metadata as stored
    # what search filters on, from the metadata (service/unitkeys.py); validate_unit derives them
    keys: dict | None = field(default=None, compare=False, repr=False)
    # derived once here (a push reads them several times)
    day: str = field(init=False, compare=False, repr=False)
    digest: str = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "day", day_of(self.timestamp))
        object.__setattr__(self, "digest", content_digest(self.content))
        if self.metadata is not None and self.metadata_text is None:
            object.__setattr__(self, "metadata_text", encode_metadata(self.metadata))
        if self.keys is None:
            object.__setattr__(self, "keys", derive(self.metadata))

    @property
    def expires_at(self) -> int:
        return self.timestamp + self.ttl

    def metadata_json(self) -> str | None:
        return self.metadata_text

    def columns(self, **assigned) -> dict:
        """The unit's UNIT_COLUMNS as a store writes them, with what the store assigned (``seq``, ``thread``,
        ``tpos``); AttributeError names a column neither gives."""
        values = {"expires_at": self.expires_at, "metadata": self.metadata_text, **self.keys, **assigned}
        return {name: values[name] if name in values else getattr(self, name) for name in UNIT_COLUMNS}


def _is_int(v) -> bool:
    # JSON true is not 1: bool is a subclass of int in Python.
    return isinstance(v, int) and not isinstance(v, bool)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_metadata_values(metadata: dict, max_depth: int) -> None:
    """Finite numbers only (1e400 parses as inf, which no JSON reader accepts back) and nesting at
    most ``max_depth`` levels (deeper ones break recursive readers)."""
    stack = [(metadata, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRequest("Field 'metadata' holds a number too large for JSON (or NaN); "
                             "send finite numbers only.", code="invalid_number", field="metadata")
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise BadRequest(f"Field 'metadata' is nested more than {max_depth} levels deep.",
                                 code="metadata_too_deep", field="metadata")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def _check_type(utype, config: Config) -> str:
    if utype is None:
        raise BadRequest("Field 'type' is required.", code="missing_field", field="type")
    if not isinstance(utype, str) or utype not in config.types:
        raise BadRequest(f"Field 'type' must be one of: {', '.join(config.types)}.",
                         code="invalid_type", field="type")
    return utype


def _check_source(source, config: Config) -> str:
    if source is None:
        raise BadRequest("Field 'source' is required.", code="missing_field", field="source")
    if not isinstance(source, str) or not source.strip():
        raise BadRequest("Field 'source' must be a non-empty string.", field="source")
    if len(source) > config.max_source_chars:
        raise BadRequest(f"Field 'source' must be at most {config.max_source_chars} characters.", field="source")
    if CONTROL_CHARS_RE.search(source):
        raise BadRequest("Field 'source' must not contain control characters.", field="source")
    if not _encodable(source):
        raise BadRequest("Field 'source' is not valid Unicode (lone surrogate).", field="source")
    return source


YEAR_2000 = 946_684_800        # a timestamp that divides down to a time after this was meant in a finer unit


def _check_timestamp(timestamp, config: Config, now: float) -> int:
    if timestamp is None:
        return int(now)      # optional (issue 26): an agent cannot know the time; send it for idempotent retries
    if not _is_int(timestamp):
        raise BadRequest("Field 'timestamp' must be an integer number of seconds (not a float, string or boolean).",
                         field="timestamp")
    if timestamp < 0:
        raise BadRequest("Field 'timestamp' must not be negative.", field="timestamp")
    if timestamp > now + config.future_skew_s:
        hint = ""
        for unit, factor in (("milliseconds", 1000), ("microseconds", 1_000_000), ("nanoseconds", 10**9)):
            if YEAR_2000 <= timestamp // factor <= now + config.future_skew_s:   # e.g. JavaScript's Date.now()
                hint = f"; {timestamp} looks like {unit}: send Unix seconds ({timestamp // factor})"
                break
        raise BadRequest(f"Field 'timestamp' is more than {config.future_skew_s} seconds in the future{hint}.",
                         code="timestamp_in_future", field="timestamp")
    return timestamp


def _check_ttl(ttl, config: Config) -> int:
    if ttl is None:
        ttl = default_ttl(config)          # optional: the operator's default
    if not _is_int(ttl):
        raise BadRequest("Field 'ttl' must be an integer number of seconds (not a float, string or boolean).",
                         field="ttl")
    if not 1 <= ttl <= ttl_limit(config):
        raise BadRequest(f"Field 'ttl' must be between 1 and {ttl_limit(config)} seconds.", field="ttl")
    return ttl


def _check_content(content, config: Config) -> str:
    if content is None:
        raise BadRequest("Field 'content' is required.", code="missing_field", field="content")
    if isinstance(content, (dict, list)):
        raise BadRequest("Field 'content' must be a string: serialize JSON objects and arrays "
                         "(e.g. json.dumps) before pushing.", code="invalid_content", field="content")
    if not isinstance(content, str):
        raise BadRequest("Field 'content' must be a string.", code="invalid_content", field="content")
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("Field 'content' is not valid Unicode (lone surrogate).",
                         code="invalid_content", field="content") from None
    if size > config.max_content_bytes:
        raise BadRequest(f"Field 'content' exceeds {config.max_content_bytes} bytes of UTF-8.",
                         code="content_too_large", field="content")
    return content


def _check_metadata(metadata, config: Config) -> str | None:
    """The metadata as stored (compact JSON), once checked."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise BadRequest("Field 'metadata' must be a JSON object.", field="metadata")
    _check_metadata_values(metadata, config.max_metadata_depth)
    try:
        encoded = encode_metadata(metadata).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        raise BadRequest("Field 'metadata' is not serializable JSON.", field="metadata") from None
    if len(encoded) > config.max_metadata_bytes:
        raise BadRequest(f"Field 'metadata' exceeds {config.max_metadata_bytes} bytes serialized.",
                         code="metadata_too_large", field="metadata")
    return encoded.decode("utf-8")


def _check_parent(parent) -> str | None:
    if parent is not None and not is_cid(parent):
        raise BadRequest("Field 'parent_cid' must be 12 lowercase hex digits.", code="invalid_cid",
                         field="parent_cid")
    return parent


def _check_cid(cid, expected: str) -> None:
    if cid is None:
        return
    if not is_cid(cid):
        raise BadRequest("Field 'cid' must be 12 lowercase hex digits.", code="invalid_cid", field="cid")
    if cid != expected:
        raise BadRequest("Field 'cid' does not match sha256(content + str(timestamp) + source)[:12] "
                         f"= {expected}.", code="invalid_cid", field="cid")


def _masked(content: str, source: str, metadata_text: str | None, config: Config) -> tuple:
    """CONTEXT_MASK_PUSHES: the unit's strings with credentials masked by the hooks' own detector (the client
    package's secretscan: linear in its input), metadata keys and values included. A text that its tags make
    longer than its cap is refused, as a longer one sent would be."""
    content, source = secretscan.mask(content), secretscan.mask(source)
    if metadata_text is not None:
        metadata_text = encode_metadata(secretscan.mask_value(json.loads(metadata_text)))
    for name, text, cap, code in (("content", content, config.max_content_bytes, "content_too_large"),
                                  ("metadata", metadata_text or "", config.max_metadata_bytes, "metadata_too_large")):
        if len(text.encode("utf-8")) > cap:
            raise BadRequest(f"Field {name!r} exceeds {cap} bytes once its credentials are masked.", code=code,
                             field=name)
    if len(source) > config.max_source_chars:
        raise BadRequest(f"Field 'source' exceeds {config.max_source_chars} characters once its credentials are "
                         "masked.", field="source")
    return content, source, metadata_text


def validate_unit(raw, config: Config, now: float | None = None) -> Unit:
    """Check one pushed unit against every rule of the unit table; raise ApiError on the first failure
    (fields checked in the order below)."""
    if isinstance(raw, Unit):
        return raw                   # checked as it was decoded (decode_push)
    if isinstance(raw, ApiError):
        raise raw                    # refused as it was decoded (decode_push)
    now = time.time() if now is None else now
    if not isinstance(raw, dict):
        raise BadRequest("A unit must be a JSON object.", code="invalid_unit")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise BadRequest(f"Unknown field {unknown[0]!r}; allowed fields are {', '.join(FIELDS)}.",
                         code="unknown_field", field=unknown[0])
    utype = _check_type(raw.get("type"), config)
    source = _check_source(raw.get("source"), config)
    timestamp = _check_timestamp(raw.get("timestamp"), config, now)
    ttl = _check_ttl(raw.get("ttl"), config)
    content = _check_content(raw.get("content"), config)
    metadata_text = _check_metadata(raw.get("metadata"), config)
    keys = derive(raw.get("metadata"))      # (checked: an object or None)
    parent = _check_parent(raw.get("parent_cid"))
    expected = compute_cid(content, timestamp, source)
    _check_cid(raw.get("cid"), expected)
    if config.mask_pushes:
        content, source, metadata_text = _masked(content, source, metadata_text, config)
        expected = compute_cid(content, timestamp, source)
    if parent == expected:
        raise Unprocessable("A unit cannot be its own parent.", code="parent_not_found", field="parent_cid")
    if timestamp + ttl <= now:
        raise Unprocessable("The unit expired before it arrived (timestamp + ttl is in the past).",
                            code="already_expired", field="ttl")
    return Unit(cid=expected, type=utype, source=source, timestamp=timestamp, ttl=ttl,
                content=content, metadata=None, parent_cid=parent, metadata_text=metadata_text, keys=keys)


# --- decoding a push body, one unit at a time ---------------------------------------------------------
# A JSON value costs far more as Python objects than as text (`[],` is 3 bytes of text and 64 bytes of
# list), so a push body is never decoded whole. It is read unit by unit and, inside a unit, field by
# field; each field's value is decoded from a window of the body no larger than that field's cap on
# its raw text (so a value past its cap is refused having cost at most the cap):
#   content   6 x CONTEXT_MAX_CONTENT_BYTES (every UTF-8 byte written as a \uXXXX escape is 6 bytes)
#   metadata 16 x CONTEXT_MAX_METADATA_BYTES (escapes and pretty-printing)
#   any other 64 KiB (type, source, cid, numbers; and a content that is no string)
# and a unit at most their sum. Over a cap the request is refused: 400 ``unit_too_large``. A checked
# unit keeps its metadata as text only, so a batch never holds its decoded metadata objects.
RAW_FIELD_BYTES = 64 * 1024
_FIRST_WINDOW = 4096
_WS = re.compile(rb"[ \t\n\r]*")
# Possessive (Python 3.11): the scan keeps no state per escape. The former backtracking form kept a mark per
# escape, so a 31 MB string of `\\n` cost a worker 1.9 GB before its cap was checked (issue 39, finding 4).
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
_SCALAR = re.compile(rb'[^,\]}\[{" \t\n\r:]++')
_UNITS_KEY = re.compile(rb'\{[ \t\n\r]*"units"[ \t\n\r]*:[ \t\n\r]*')


class RawCaps:
    """The raw-text caps of one configuration (see above)."""

    def __init__(self, config: Config):
        self.content = 6 * config.max_content_bytes + 2         # and its quotes
        self.metadata = 16 * config.max_metadata_bytes
        self.other = RAW_FIELD_BYTES
        self.unit = self.content + self.metadata + len(FIELDS) * RAW_FIELD_BYTES

    def field(self, name: str, string: bool) -> int:
        if name == "content" and string:
            return self.content
        return self.metadata if name == "metadata" else self.other


def _too_large(what: str, cap: int, field_name: str | None) -> BadRequest:
    return BadRequest(f"{what} takes more than {cap} bytes of JSON text; no unit may (see the README's "
                      "Security section).", code="unit_too_large", field=field_name)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads_strict(text: str):
    """``json.loads(text)`` refusing NaN and Infinity, on one decoder made once (``json.loads`` with a keyword
    makes a new decoder at every call, twice the cost of decoding a search's body)."""
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)   # (as json.loads)
    return _DECODER.decode(text)


def _syntax(msg: str, pos: int) -> json.JSONDecodeError:
    return json.JSONDecodeError(msg, "", pos)


def _ws(raw: bytes, i: int) -> int:
    return _WS.match(raw, i).end()


def _loads(raw: bytes, i: int, end: int):
    try:
        return loads_strict(raw[i:end].decode("utf-8"))
    except json.JSONDecodeError as e:
        raise _syntax(e.msg, i + e.pos) from None


def _scan(raw: bytes, i: int, cap: int, pattern: re.Pattern, what: str, field_name: str | None) -> int:
    """The end of the string or scalar at byte ``i``, scanning at most ``cap`` bytes of the body (the cap
    is checked while scanning, not after: the scan never reads past it); 400 ``unit_too_large`` when the
    value goes on past the cap."""
    m = pattern.match(raw, i, i + cap + 1)
    if m is not None and m.end() - i <= cap:
        return m.end()
    if m is None and (pattern is _SCALAR or len(raw) <= i + cap + 1):
        raise _syntax("Unterminated string" if pattern is _STRING else "Expecting value", i)
    raise _too_large(what, cap, field_name)


def _value(raw: bytes, i: int, cap: int, what: str, field_name: str | None):
    """(end, value) of the JSON value at byte ``i``, decoded from at most ``cap`` bytes of the body;
    400 ``unit_too_large`` when it is longer."""
    first = raw[i:i + 1]
    if first == b'"' or first not in (b"[", b"{"):
        end = _scan(raw, i, cap, _STRING if first == b'"' else _SCALAR, what, field_name)
        return end, _loads(raw, i, end)
    # A container: decode a growing window (x4 each time, up to the cap) until the value fits in it.
    size = min(_FIRST_WINDOW, cap)
    while True:
        hi = min(len(raw), i + size)
        while hi < len(raw) and raw[hi] & 0xC0 == 0x80:      # not inside a UTF-8 sequence
            hi -= 1
        text = raw[i:hi].decode("utf-8")
        try:
            value, k = _DECODER.raw_decode(text)
        except json.JSONDecodeError as e:
            cut = hi < len(raw) and (e.pos >= len(text) - 12 or e.msg.startswith("Unterminated string"))
            if not cut:
                raise _syntax(e.msg, i + len(text[:e.pos].encode("utf-8"))) from None
            if size >= cap:
                raise _too_large(what, cap, field_name) from None
            size = min(cap, size * 4)
            continue
        return i + (k if text.isascii() else len(text[:k].encode("utf-8"))), value


def _decode_unit(raw: bytes, i: int, caps: RawCaps, what: str, config: Config, now: float):
    """(end, the Unit or the ApiError that refused it) of the unit at byte ``i``."""
    if not raw.startswith(b"{", i):
        end, _ = _value(raw, i, caps.other, what, None)      # a small value, for its syntax error if any
        return end, BadRequest("A unit must be a JSON object.", code="invalid_unit")
    unit: dict = {}
    j = _ws(raw, i + 1)
    if raw.startswith(b"}", j):
        j += 1
    else:
        while True:
            if not raw.startswith(b'"', j):
                raise _syntax("Expecting property name enclosed in double quotes", j)
            end = _scan(raw, j, caps.other, _STRING, f"{what}'s field name", None)
            name = _loads(raw, j, end)
            j = _ws(raw, end)
            if not raw.startswith(b":", j):
                raise _syntax("Expecting ':' delimiter", j)
            j = _ws(raw, j + 1)
            cap = caps.field(name, raw.startswith(b'"', j))
            j, unit[name] = _value(raw, j, cap, f"{what}'s field {name[:32]!r}", name[:64])
            if j - i > caps.unit:
                raise _too_large(what, caps.unit, None)
            j = _ws(raw, j)
            if raw.startswith(b",", j):
                j = _ws(raw, j + 1)
                continue
            if raw.startswith(b"}", j):
                j += 1
                break
            raise _syntax("Expecting ',' delimiter", j)
    try:
        return j, validate_unit(unit, config, now)
    except ApiError as e:
        return j, e


def decode_push(raw: bytes, config: Config, now: float | None = None):
    """A push body: (the items, whether it was a batch). Each item is a checked Unit or the ApiError that
    refused it (validate_unit passes both on). A batch is ``[...]`` or ``{"units": [...]}``; it stops at
    ``config.max_batch`` + 1 items (400 ``batch_too_large``). Raises BadRequest, or ValueError for text
    that is no JSON (the caller's 400 ``invalid_json``)."""
    now = time.time() if now is None else now
    caps = RawCaps(config)
    i = _ws(raw, 0)
    bare = raw.startswith(b"[", i)
    if not bare:
        m = _UNITS_KEY.match(raw, i)
        if m is None:
            end, item = _decode_unit(raw, i, caps, "The unit", config, now)
            _expect_end(raw, end)
            return item, False
        if not raw.startswith(b"[", m.end()):
            raise BadRequest("Field 'units' must be a JSON array of units.", field="units")
        i = m.end()
    items: list = []
    j = _ws(raw, i + 1)
    if raw.startswith(b"]", j):
        j += 1
    else:
        while True:
            if len(items) >= config.max_batch:
                raise BadRequest(f"A batch holds at most {config.max_batch} units.", code="batch_too_large",
                                 field="units")
            j, item = _decode_unit(raw, j, caps, f"Unit {len(items)}", config, now)
            items.append(item)
            j = _ws(raw, j)
            if raw.startswith(b",", j):
                j = _ws(raw, j + 1)
                continue
            if raw.startswith(b"]", j):
                j += 1
                break
            raise _syntax("Expecting ',' delimiter", j)
    if not bare:
        j = _ws(raw, j)
        if not raw.startswith(b"}", j):
            raise BadRequest('A batch body is {"units": [...]} with no other field.', code="unknown_field",
                             field="units")
        j += 1
    _expect_end(raw, j)
    return items, True


def _expect_end(raw: bytes, i: int) -> None:
    i = _ws(raw, i)
    if i != len(raw):
        raise _syntax("Extra data", i)


# --- the unit's JSON shapes ------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """One field of a JSON object: its schema for a configuration, and whether it is always there
    (a push: must be sent; an answer: is always sent); of a stored unit, whether a re-push replaces it and
    whether a search reads it beside the unit's terms (PostgreSQL's unit_terms rows, ``SEARCHED_COLUMNS``)."""
    name: str
    schema: Callable[[Config], dict]
    required: bool = False
    mutable: bool = False
    searched: bool = False


def _described(schema: dict, description: str) -> Callable[[Config], dict]:
    return lambda config: {**schema, "description": description}


def nullable(schema: dict, description: str | None = None) -> dict:
    """``schema`` or null, without a list-valued ``type``: Dify's importer tests ``typ in {...}`` and
    fails on a list (langgenius/dify#12768); ``anyOf`` is valid JSON Schema and it reads no type from it."""
    out = {"anyOf": [schema, {"type": "null"}]}
    if description:
        out["description"] = description
    return out


def _ttl(config: Config) -> dict:
    default = " (kept for good)." if not config.default_ttl else f" ({config.default_ttl} s)."
    return {"type": "integer", "minimum": 1, "maximum": ttl_limit(config),
            "description": "Seconds to keep the unit; omitted: the server's default" + default}


# What a push may hold (validate_unit checks each), in this order; required: REST's push body.
PUSH_FIELDS: tuple[Shape, ...] = (
    Shape("cid", _described(CID_SCHEMA, "Optional: sha256(content + str(timestamp) + source), first 12 hex.")),
    Shape("type", lambda c: {"type": "string", "enum": list(c.types), "description": "What kind of context this is."},
          True),
    Shape("source", lambda c: {"type": "string", "minLength": 1, "maxLength": c.max_source_chars,
                               "description": "Who produced it, by convention {tool}_{version}_{env}."}, True),
    Shape("timestamp", _described({"type": "integer", "minimum": 0},
                                  "Unix seconds (UTC), at most 5 minutes ahead; omitted: when the server receives "
                                  "it (send it to make a retried push a duplicate, not a second unit).")),
    Shape("ttl", _ttl),
    Shape("content", _described({"type": "string"}, "The text to remember (serialize JSON yourself)."), True),
    Shape("metadata", _described({"type": "object"}, "Optional JSON object (at most 64 KiB).")),
    Shape("parent_cid", _described(CID_SCHEMA, "Optional: the unit this one derives from.")),
)
FIELDS = tuple(f.name for f in PUSH_FIELDS)

# A stored unit as every read answers it (GET, lineage, search results, MCP resources and tools).
# Each is a column of both stores' units tables (below); ``mutable``: a re-push's newer value replaces it (§3).
STORED_FIELDS: tuple[Shape, ...] = (
    Shape("cid", lambda c: dict(CID_SCHEMA), True, searched=True),
    Shape("type", lambda c: {"type": "string", "enum": list(c.types)}, True, mutable=True, searched=True),
    Shape("source", lambda c: {"type": "string"}, True, searched=True),
    Shape("timestamp", lambda c: {"type": "integer"}, True, searched=True),
    Shape("ttl", lambda c: {"type": "integer"}, True, mutable=True),
    Shape("content", lambda c: {"type": "string"}, True),
    Shape("metadata", lambda c: nullable({"type": "object"}), True, mutable=True),
    Shape("parent_cid", lambda c: nullable(dict(CID_SCHEMA)), mutable=True, searched=True),
    Shape("expires_at", lambda c: {"type": "integer"}, True, mutable=True, searched=True),     # (timestamp + ttl)
    Shape("seq", lambda c: {"type": "integer"}, searched=True),
    Shape("thread", lambda c: {"type": "string", "description": "The thread it belongs to (docs/design.md §3): "
                                "a 12-hex id, fixed when it was first stored."}),
)
# What a search result adds to a stored unit (which answers without its seq).
RESULT_FIELDS: tuple[Shape, ...] = (
    Shape("score", _described({"type": "number", "minimum": 0, "maximum": 1},
                              "BM25 divided by the query's maximum attainable BM25."), True),
    Shape("bm25_score", _described({"type": "number"}, "Raw BM25, higher is better."), True),
    Shape("snippet", lambda c: {"type": "string"}),
    Shape("neighbors", lambda c: {
        "type": "object", "description": "With 'neighbors': n, the units up to n places before and after it in "
                                        "its thread (docs/design.md §3), nearest last and first.",
        "properties": {"before": {"type": "array", "items": {"type": "object"}},
                       "after": {"type": "array", "items": {"type": "object"}},
                       "omitted": {"type": "integer"}}}),
)


# --- a stored unit's columns (docs/design.md §3, §5): every list of them derives from STORED_FIELDS --------
# Both stores' units tables hold every stored field, and beside them what a push derives for search: the unit's
# place in its thread and its project keys (service/unitkeys.py). Each backend's column lists, its named statements'
# @unit_... lists (service/store/statements.py), the read index's fields (service/readindex/schema.py), the MCP
# resources' and Dify's fields come from here; tests/test_unit_fields.py holds sql/'s schemas to them. So a new
# field is its Shape here, the schema and its migration.
STORED_COLUMNS = tuple(f.name for f in STORED_FIELDS)
KEPT_COLUMNS = ("tpos", *KEY_COLUMNS)
UNIT_COLUMNS = (*STORED_COLUMNS, *KEPT_COLUMNS)
MUTABLE_FIELDS = tuple(f.name for f in STORED_FIELDS if f.mutable)
# What a search filters and orders by beside a unit's terms, with the keys a push derives (PostgreSQL's unit_terms).
SEARCHED_COLUMNS = (*(f.name for f in STORED_FIELDS if f.searched), *KEY_COLUMNS)
REPUSHED_COLUMNS = (*MUTABLE_FIELDS, *KEY_COLUMNS)        # what a re-push writes: the keys follow its metadata
# A field an older version stored empty answers another's value: a unit stored before threads is its own.
STORED_FALLBACK = {"thread": "cid"}
# What a search result holds of the stored unit (all but its seq), and what describes a unit beside its content
# and metadata (the MCP resources' _meta, Dify's record metadata and conditions).
RESULT_COLUMNS = tuple(n for n in STORED_COLUMNS if n != "seq")
DESCRIBING_FIELDS = tuple(n for n in RESULT_COLUMNS if n not in ("content", "metadata"))


def object_schema(shapes, config: Config, *, exclude: tuple[str, ...] = ()) -> dict:
    """An object schema of these fields (``required``: those always there)."""
    chosen = [f for f in shapes if f.name not in exclude]
    return {"type": "object", "properties": {f.name: f.schema(config) for f in chosen},
            "required": [f.name for f in chosen if f.required]}


# --- a stored unit --------------------------------------------------------------------------------
def now_ms() -> int:
    return int(time.time() * 1000)


def unit_dict(row) -> dict:
    """The public shape of a stored unit: a row's STORED_COLUMNS, its metadata decoded."""
    out = {name: row[name] for name in STORED_COLUMNS}
    meta = out["metadata"]
    out["metadata"] = json.loads(meta) if meta else None
    for name, other in STORED_FALLBACK.items():
        out[name] = out[name] or out[other]
    return out


def export_fields(unit: dict) -> dict:
    """What export writes per unit: exactly the fields a push takes back (same CID)."""
    return {k: unit[k] for k in FIELDS}
