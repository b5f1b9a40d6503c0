"""The hook event on stdin, read up to its cap (``CONTEXT_HOOK_MAX_EVENT_BYTES``, 8 MiB), and the head of one
over it (issue 50 I3).

An event over the cap is never read past it (cap + 1 bytes at most, the last one only to know that more
follows), so a hook's memory stays bounded whatever an agent sends; it keeps its head instead of being dropped
whole. The JSON of the first ``cap`` bytes is taken as far as it goes: every member complete before the cut,
the member the cut falls in kept as far as it goes (a string's head, an object's or array's complete members,
nothing of a number), nothing after it. Agents send the session, the working directory and the tool's name
before what the tool returned, so what is lost is the end of one large text, which the hook cuts to
``CONTEXT_HOOK_MAX_CHARS`` anyway; the units stored from a cut event say ``metadata.truncated``.

Only ``json``'s C scanner reads the bytes: a complete member is decoded whole by ``raw_decode``, and only the
values on the path down to the cut (at most ``MAX_DEPTH`` deep) are taken apart here, so the cost is a few
passes over the text, never a step per character in Python.
"""
from __future__ import annotations

import codecs
import json
from json.decoder import WHITESPACE, scanstring

MAX_DEPTH = 8                      # containers followed down to the cut; deeper, the cut member is left out
_DECODER = json.JSONDecoder()
_NOTHING = object()                # nothing of the value the cut falls in can be kept


def read_event(stdin, cap: int) -> tuple[dict, bool]:
    """(the event, whether it was cut at ``cap`` bytes) from ``stdin``."""
    raw = stdin.read(cap + 1)
    cut = len(raw) > cap
    # (a character the cut splits is left out, where a plain decode would end the text with U+FFFD)
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(raw[:cap], final=not cut)
    del raw
    if not text.strip():
        return {}, False
    if cut:
        try:
            head = head_of(text)
        except (ValueError, RecursionError):
            head = None
        if not isinstance(head, dict):
            raise ValueError(f"the hook event on stdin is larger than {cap} bytes (CONTEXT_HOOK_MAX_EVENT_BYTES) "
                             "and its head is no JSON object: stored nothing")
        return head, True
    try:
        payload = json.loads(text)
    except ValueError as e:
        raise ValueError(f"the hook event on stdin is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise ValueError("the hook event on stdin is not a JSON object")
    return payload, False


def head_of(text: str):
    """The JSON value whose first characters ``text`` is (cut anywhere), as far as it goes; ValueError when
    ``text`` is not the head of a JSON value."""
    value = _head(text, _skip(text, 0), 0)
    if value is _NOTHING:
        raise ValueError("nothing of it is complete before the cut")
    return value


def _skip(text: str, i: int) -> int:
    return WHITESPACE.match(text, i).end()


def _head(text: str, i: int, depth: int):
    """The value at ``i``, which the cut falls in, as far as it goes (or ``_NOTHING``)."""
    if depth > MAX_DEPTH or i >= len(text):
        return _NOTHING
    if text[i] == '"':
        return _string_head(text, i)
    if text[i] in "{[":
        return _container_head(text, i, depth)
    return _NOTHING                 # a number or a literal


def _value(text: str, i: int, depth: int) -> tuple:
    """(value, where it ends) of the member at ``i``; its head and None when the cut falls in it."""
    try:
        value, end = _DECODER.raw_decode(text, i)
    except (ValueError, RecursionError):
        return _head(text, i, depth + 1), None
    if type(value) in (int, float) and len(text) - end <= 2 and not text[end:].strip(".eE+-"):
        return _NOTHING, None       # the cut took digits off it ("12" of 125, "12" and "." of 12.5)
    return value, end


def _container_head(text: str, i: int, depth: int):
    """An object's or array's members before the cut, and the head of the one it falls in."""
    is_object = text[i] == "{"
    out: dict | list = {} if is_object else []
    i = _skip(text, i + 1)
    if text[i:i + 1] == ("}" if is_object else "]"):
        return out
    while i < len(text):
        if is_object:
            if text[i] != '"':
                raise ValueError(f"a member name expected at character {i}")
            try:
                key, i = scanstring(text, i + 1)
            except ValueError:
                return out          # the cut falls in the member's name
            i = _skip(text, i)
            if i >= len(text):
                return out
            if text[i] != ":":
                raise ValueError(f"':' expected at character {i}")
            i = _skip(text, i + 1)
            if i >= len(text):
                return out
        value, end = _value(text, i, depth)
        if value is not _NOTHING:
            if is_object:
                out[key] = value
            else:
                out.append(value)
        if end is None:
            return out
        i = _skip(text, end)
        if i < len(text):
            if text[i] == ("}" if is_object else "]"):
                return out          # complete after all (what follows it is cut)
            if text[i] != ",":
                raise ValueError(f"',' expected at character {i}")
            i = _skip(text, i + 1)
    return out


def _string_head(text: str, i: int) -> str:
    """A string the cut falls in, as far as it goes: without an escape the cut split (``\\`` or ``\\u12``),
    and without a high surrogate whose low half was cut off."""
    body = text[i + 1:]
    for drop in range(min(6, len(body) + 1)):      # the longest escape, "\\uXXXX", is six characters
        candidate = body[:len(body) - drop] + '"'
        try:
            value, end = scanstring(candidate, 0)
        except ValueError:
            continue
        if end != len(candidate):
            break                   # it ends before the cut: not the value the cut falls in
        if value and "\ud800" <= value[-1] <= "\udbff":
            value = value[:-1]
        return value
    raise ValueError(f"a string at character {i} that is not JSON")
