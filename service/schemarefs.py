"""Where a registered tool's JSON Schema points (docs/design.md §13): ``$ref`` and ``$dynamicRef`` stay inside
the schema, recursion is told apart from expansion.

- *Recursion* is a cycle of references that passes through a keyword applying to a part of the instance
  (``items``, ``properties``, ...): a tree schema, ``{"items": {"$ref": "#"}}``. Validation follows the
  instance down and stops with it; such schemas are valid and accepted.
- A cycle of references applied *in place* only (``$ref``, ``allOf``, ``not``, ``if``, ...) never reaches a
  deeper part of the instance: a validator loops. Refused.
- *Expansion*: a client that inlines every reference builds the schema's inlined size (a recursive
  reference counts once); when that adds more than ``MAX_REF_EXPANSION`` nodes to the schema's own, it is
  a schema bomb (2^59 fan-out fits in a few KiB). Refused.
References are JSON pointers (``#``, ``#/$defs/a``) or anchors (``#name``, from ``$anchor`` or
``$dynamicAnchor``); anything else would make every client that resolves it fetch a URL.
"""
from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

MAX_REF_EXPANSION = 10_000     # schema nodes a client that inlines every $ref would build
REF_KEYWORDS = ("$ref", "$dynamicRef")
# JSON Schema 2020-12 applicators: in place (the same instance) and into a part of the instance.
IN_PLACE_ONE = ("not", "if", "then", "else")
IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")
IN_PLACE_NAMED = ("dependentSchemas",)
DEEPER_ONE = ("items", "contains", "additionalProperties", "propertyNames", "unevaluatedItems",
              "unevaluatedProperties")
DEEPER_MANY = ("prefixItems",)
DEEPER_NAMED = ("properties", "patternProperties")
# Keywords whose values are instance data, not schemas: a {"$ref": ...} there is a literal (issue 50, L3).
LITERALS = ("const", "enum", "examples", "default")
# Keywords whose values map names to schemas: a property named "enum" is a schema, not a literal.
NAMED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check_refs(schema: dict, bad: Callable[[str], Exception]) -> None:
    """Raise ``bad(message)`` unless every reference points inside ``schema``, no cycle of references
    stays in place, and inlining every reference stays under MAX_REF_EXPANSION nodes."""
    _local_refs_only(schema, bad)
    resolve = _resolver(schema, bad)
    _no_cycle_in_place(schema, resolve, bad)
    _expansion(schema, resolve, bad)


def _parts(n) -> list:
    """What a schema object (or a list of schemas) holds that may be or hold schemas: literals left out."""
    if isinstance(n, list):
        return list(n)
    out: list = []
    for k, v in n.items():
        if k in LITERALS:
            continue
        if k in NAMED_MAPS and isinstance(v, dict):
            out.extend(v.values())
        else:
            out.append(v)
    return out


def _local_refs_only(schema, bad) -> None:
    stack = [schema]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            for kw in (*REF_KEYWORDS, "$id"):
                v = n.get(kw)
                if v is not None and (not isinstance(v, str) or not v.startswith("#")):
                    raise bad(f"{kw} {str(v)[:64]!r} points outside the schema; only local '#/...' pointers "
                              "and '#anchor' names are accepted.")
        if isinstance(n, (dict, list)):
            stack.extend(_parts(n))


def _resolver(schema: dict, bad) -> Callable[[str], object]:
    anchors: dict[str, object] = {}
    stack: list = [schema]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            for kw in ("$anchor", "$dynamicAnchor"):
                if isinstance(n.get(kw), str):
                    anchors.setdefault(n[kw], n)
        if isinstance(n, (dict, list)):
            stack.extend(_parts(n))

    def resolve(ref: str):
        if ref != "#" and not ref.startswith("#/"):
            if ref[1:] not in anchors:
                raise bad(f"$ref {ref[:64]!r} names no $anchor.")
            return anchors[ref[1:]]
        node = schema
        for part in ref[2:].split("/") if ref.startswith("#/") else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")     # (a URI fragment: %-escapes first)
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise bad(f"$ref {ref[:64]!r} points at nothing.")
        return node
    return resolve


def _in_place(node: dict, resolve) -> list:
    """The subschemas (and reference targets) applied to the same instance as ``node``."""
    out = [resolve(node[kw]) for kw in REF_KEYWORDS if isinstance(node.get(kw), str)]
    out += [node[kw] for kw in IN_PLACE_ONE if kw in node]
    out += [s for kw in IN_PLACE_MANY if isinstance(node.get(kw), list) for s in node[kw]]
    out += [s for kw in IN_PLACE_NAMED if isinstance(node.get(kw), dict) for s in node[kw].values()]
    return [s for s in out if isinstance(s, dict)]


def _no_cycle_in_place(schema: dict, resolve, bad) -> None:
    """Depth-first over every schema object, following in-place edges only; a back edge is a loop."""
    state: dict[int, int] = {}          # 1: on the current path, 2: done
    every = [schema]
    stack: list = [schema]
    while stack:                        # every schema object, also those only reached through a deeper keyword
        n = stack.pop()
        if isinstance(n, dict):
            every.append(n)
        if isinstance(n, (dict, list)):
            stack.extend(_parts(n))
    for start in every:
        if id(start) in state:
            continue
        path = [(start, iter(_in_place(start, resolve)))]
        state[id(start)] = 1
        while path:
            node, children = path[-1]
            child = next(children, None)
            if child is None:
                state[id(node)] = 2
                path.pop()
            elif state.get(id(child)) == 1:
                raise bad("$ref is cyclic: it never reaches a deeper part of the instance, so a validator loops.")
            elif id(child) not in state:
                state[id(child)] = 1
                path.append((child, iter(_in_place(child, resolve))))


def _expansion(schema: dict, resolve, bad) -> None:
    """Inlining every reference adds at most MAX_REF_EXPANSION nodes to the schema's own (which its 256 KiB
    bound limits already: a large enum is no bomb)."""
    own, stack = 0, [schema]
    while stack:
        n = stack.pop()
        own += 1
        if isinstance(n, (dict, list)):
            stack.extend(n.values() if isinstance(n, dict) else n)
    limit = own + MAX_REF_EXPANSION
    sizes: dict[int, int] = {}
    resolving: set[int] = set()

    def size(node) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in resolving:
            return 1                     # recursion (in-place loops were refused above): inlined once
        resolving.add(key)
        total = 1
        for child in _parts(node):
            total += size(child)
        if isinstance(node, dict):
            for kw in REF_KEYWORDS:
                if isinstance(node.get(kw), str):
                    total += size(resolve(node[kw]))
        resolving.discard(key)
        sizes[key] = total
        if total > limit:
            raise bad(f"inlining its $refs would add more than {MAX_REF_EXPANSION} schema nodes.")
        return total
    try:
        size(schema)
    except RecursionError:
        raise bad("$ref chains too deep.") from None
