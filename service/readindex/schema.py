"""The read index's schema, its documents and where its files are."""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path

import tantivy

from ..ranking.threads import asks
from ..units import RESULT_COLUMNS
from ..unitkeys import joined_by

FORMAT = 11                    # 10: projects (project, global) and threads (thread, place, tkey); 11: asks, srch
TOKENIZER = "cm_ws"            # whitespace only: the tokens are already ours (service/tokenize.py)
NO_TOKENS = "cm_none"
DAY_SHIFT = 2 ** 40            # SQLite's keys: day ordinal * DAY_SHIFT + rowid


def index_dir(root: Path, tenant: str) -> Path:
    """A tenant's read index under a data folder: ``tenants/<t>/replica/index/``."""
    return Path(root) / "tenants" / tenant / "replica" / "index"


def day_key(day: str, rowid: int) -> int:
    return datetime.date.fromisoformat(day).toordinal() * DAY_SHIFT + rowid


def build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    # stored too: rescoring counts a candidate's query terms in its tokens (searcher.rescore)
    sb.add_text_field("t", stored=True, tokenizer_name=TOKENIZER, index_option="freq")
    sb.add_integer_field("key", indexed=True, fast=True)
    sb.add_integer_field("exp", fast=True)
    sb.add_integer_field("ts", fast=True)
    sb.add_integer_field("len", fast=True)     # the exact length in tokens (tantivy keeps one byte of it)
    sb.add_integer_field("cidn", fast=True)    # the CID (12 hex digits) as a number: ties are ordered by it
    # its thread (12 hex digits as a number), and its place in it × 8 + whether it asks × 4 + how it joined it
    # (unitkeys.joined_by): one fast field read for all three (docs/design.md §3, §6)
    sb.add_integer_field("thread", fast=True)
    sb.add_integer_field("place", fast=True)
    sb.add_integer_field("srch", fast=True)    # its source's hash (``source_hash``): whether a query names it
    for name in ("day", "type", "src", "parent", "project", "tkey"):
        sb.add_text_field(name, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("global", indexed=True)     # 1: seen from every project (service/unitkeys.py)
    # the unit's public fields: a hit is answered from here, not from ten day files
    sb.add_text_field("content", stored=True, tokenizer_name=NO_TOKENS, index_option="basic")
    sb.add_text_field("unit", stored=True, tokenizer_name=NO_TOKENS, index_option="basic")
    return sb.build()


def register(index: tantivy.Index) -> None:
    index.register_tokenizer(TOKENIZER, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())
    # stored, never searched: one raw token, dropped by the length filter
    index.register_tokenizer(NO_TOKENS, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.raw())
                             .filter(tantivy.Filter.remove_long(1)).build())


def signature(path: Path):
    """A file's identity and version (inode, mtime, size), or None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


# A document's ``unit``: a JSON array of what a search result holds of the unit (service/units.py RESULT_COLUMNS)
# but its content, a field of its own; metadata stays the JSON text it is stored as. format.json names the list,
# so an index made with another (a field added to the unit) is built again.
UNIT_FIELDS = tuple(n for n in RESULT_COLUMNS if n != "content")
# (the list format 10's indexes hold, before format.json named it: history, never changed)
FORMAT_10_UNIT = ("cid", "type", "source", "timestamp", "ttl", "metadata", "parent_cid", "expires_at", "thread")


def format_info() -> dict:
    """What format.json says of an index this version makes (with its generation and whether it is ready)."""
    return {"format": FORMAT, "unit": list(UNIT_FIELDS)}


def same_format(info: dict) -> bool:
    """Whether format.json's ``info`` is of an index this version reads."""
    return info.get("format") == FORMAT and tuple(info.get("unit", FORMAT_10_UNIT)) == UNIT_FIELDS


def thread_of(r) -> tuple[str, int]:
    """A stored row's thread and place (a row written before threads: its own, first)."""
    return (r["thread"], r["tpos"]) if r["thread"] else (r["cid"], 0)


def place_value(tpos: int, asking: bool, joined: int) -> int:
    """The ``place`` fast field: a unit's place in its thread, whether it asks and how it joined."""
    return tpos * 8 + (4 if asking else 0) + joined


def place_fields(value: int) -> tuple[int, bool, int]:
    """(place, asks, joined) from a ``place`` fast field."""
    return value >> 3, bool(value & 4), value & 3


def source_hash(source: str) -> int:
    """A source as a 60-bit number (the ``srch`` fast field): the ranking asks whether a query names it."""
    return int(hashlib.sha256(source.encode("utf-8")).hexdigest()[:15], 16)


def thread_key(thread: str, tpos: int) -> str:
    """The term that finds the unit at this place of this thread (neighbors, context windows)."""
    return f"{thread}.{tpos}"


def document(day: str, key: int, r, tokens: str | None = None, unit: str | None = None) -> tantivy.Document:
    """A unit's document: ``r``'s fields; ``tokens`` (else ``r["tokens"]``) and the JSON array of its
    UNIT_FIELDS (``unit``, else made here) when the caller already has them."""
    doc = tantivy.Document()
    thread, tpos = thread_of(r)
    doc.add_text("t", r["tokens"] if tokens is None else tokens)
    doc.add_text("content", r["content"])
    doc.add_text("unit", unit or json.dumps([thread if name == "thread" else r[name] for name in UNIT_FIELDS],
                                            ensure_ascii=False))
    doc.add_integer("key", key)
    doc.add_integer("exp", r["expires_at"])
    doc.add_integer("ts", r["timestamp"])
    doc.add_integer("len", r["ntok"])
    doc.add_integer("cidn", int(r["cid"], 16))
    doc.add_integer("thread", int(thread, 16))
    doc.add_integer("place", place_value(tpos, asks(r["content"]), joined_by(r["parent_cid"], r["metadata"])))
    doc.add_integer("srch", source_hash(r["source"]))
    doc.add_text("tkey", thread_key(thread, tpos))
    doc.add_text("day", day)
    doc.add_text("type", r["type"])
    doc.add_text("src", r["source"])
    if r["parent_cid"]:
        doc.add_text("parent", r["parent_cid"])
    if r["project"] is not None:
        doc.add_text("project", r["project"])
    if r["is_global"]:
        doc.add_integer("global", 1)
    return doc


_CONTENT_AT = RESULT_COLUMNS.index("content")


def unit_of(doc: tantivy.Document) -> dict:
    """A hit as a search answers it: RESULT_COLUMNS, in their order."""
    values = json.loads(doc.get_first("unit"))
    values.insert(_CONTENT_AT, doc.get_first("content") or "")
    unit = dict(zip(RESULT_COLUMNS, values))
    meta = unit["metadata"]
    unit["metadata"] = json.loads(meta) if meta else None
    return unit
