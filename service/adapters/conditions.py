"""Dify ``metadata_condition`` (docs/design.md §8): parse once, then test each search result.

Dify's shape (api/core/rag/entities/metadata_entities.py): ``{"logical_operator": "and"|"or"|null,
"conditions": [{"name", "comparison_operator", "value"}] | null}``. A condition's ``name`` is a
unit field a record's metadata carries (service/units.py ``DESCRIBING_FIELDS``: ``cid``, ``type``, ``source``,
``timestamp``, ``ttl``, ``parent_cid``, ``expires_at``, ``thread``) or a key of the unit's ``metadata``
(``metadata.<key>`` reaches a key shadowed by a unit field).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

from ..units import DESCRIBING_FIELDS

UNIT_FIELDS = DESCRIBING_FIELDS

STRING_OPS = ("contains", "not contains", "start with", "end with", "is", "is not", "in", "not in",
              "empty", "not empty")
NUMBER_OPS = {"=": "=", "≠": "≠", "!=": "≠", ">": ">", "<": "<", "≥": "≥", ">=": "≥", "≤": "≤", "<=": "≤"}
TIME_OPS = ("before", "after")
MAX_CONDITIONS = 50


class ConditionError(ValueError):
    """A malformed metadata_condition (the caller answers 400)."""


@dataclass(frozen=True)
class Condition:
    name: str
    op: str
    value: object

    def matches(self, unit: dict) -> bool:
        actual = field_value(unit, self.name)
        op = self.op
        if op == "empty":
            return _is_empty(actual)
        if op == "not empty":
            return not _is_empty(actual)
        if op in NUMBER_OPS.values():
            return _compare_numbers(op, _as_number(actual), self.value)
        if op in TIME_OPS:
            t = _as_time(actual)
            if t is None:
                return False
            return t < self.value if op == "before" else t > self.value
        if op in ("in", "not in"):
            inside = actual is not None and _text(actual) in self.value
            return inside if op == "in" else not inside
        if op in ("contains", "not contains"):
            if isinstance(actual, list):
                found = any(_text(x) == self.value for x in actual)
            else:
                found = actual is not None and self.value in _text(actual)
            return found if op == "contains" else not found
        if actual is None:
            return op == "is not"
        text = _text(actual)
        if op == "is":
            return text == self.value
        if op == "is not":
            return text != self.value
        if op == "start with":
            return text.startswith(self.value)
        return text.endswith(self.value)   # "end with"


@dataclass(frozen=True)
class MetadataFilter:
    logical_operator: str
    conditions: tuple[Condition, ...]

    def matches(self, unit: dict) -> bool:
        results = (c.matches(unit) for c in self.conditions)
        return all(results) if self.logical_operator == "and" else any(results)


def field_value(unit: dict, name: str):
    if name in UNIT_FIELDS:
        return unit.get(name)
    meta = unit.get("metadata") or {}
    if name.startswith("metadata."):
        name = name[len("metadata."):]
    return meta.get(name)


def parse_metadata_condition(raw) -> MetadataFilter | None:
    """None when there is nothing to filter (absent, null, or no conditions)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConditionError("'metadata_condition' must be an object or null.")
    logical = raw.get("logical_operator") or "and"
    if logical not in ("and", "or"):
        raise ConditionError("'metadata_condition.logical_operator' must be 'and' or 'or'.")
    items = raw.get("conditions")
    if items is None:
        return None
    if not isinstance(items, list):
        raise ConditionError("'metadata_condition.conditions' must be a list.")
    if len(items) > MAX_CONDITIONS:
        raise ConditionError(f"At most {MAX_CONDITIONS} metadata conditions are allowed.")
    conditions = tuple(_condition(i, item) for i, item in enumerate(items))
    return MetadataFilter(logical, conditions) if conditions else None


def _condition(i: int, item) -> Condition:
    where = f"metadata_condition.conditions[{i}]"
    if not isinstance(item, dict):
        raise ConditionError(f"'{where}' must be an object.")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ConditionError(f"'{where}.name' must be a non-empty string.")
    op = item.get("comparison_operator")
    if not isinstance(op, str):
        raise ConditionError(f"'{where}.comparison_operator' must be a string.")
    op = op.strip()
    value = item.get("value")
    if op in ("empty", "not empty"):
        return Condition(name, op, None)
    if op in NUMBER_OPS:
        number = _as_number(value)
        if number is None:
            raise ConditionError(f"'{where}.value' must be a number for operator {op!r}.")
        return Condition(name, NUMBER_OPS[op], number)
    if op in TIME_OPS:
        t = _as_time(value)
        if t is None:
            raise ConditionError(f"'{where}.value' must be a Unix timestamp or an ISO 8601 date for {op!r}.")
        return Condition(name, op, t)
    if op in ("in", "not in"):
        if isinstance(value, str):
            values = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, list) and all(_scalar(v) for v in value):
            values = [_text(v) for v in value]
        else:
            raise ConditionError(f"'{where}.value' must be a list (or a comma-separated string) for {op!r}.")
        return Condition(name, op, frozenset(values))
    if op in STRING_OPS:
        if not _scalar(value):
            raise ConditionError(f"'{where}.value' must be a string or a number for {op!r}.")
        return Condition(name, op, _text(value))
    known = ", ".join(STRING_OPS + tuple(NUMBER_OPS) + TIME_OPS)
    raise ConditionError(f"Unknown comparison_operator {op!r} in '{where}'; supported: {known}.")


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float)) and not isinstance(v, bool)


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _is_empty(v) -> bool:
    return v is None or (isinstance(v, (str, list, dict)) and not (v.strip() if isinstance(v, str) else v))


def _as_number(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _compare_numbers(op: str, actual: float | None, expected: float) -> bool:
    if actual is None:
        return False
    return {"=": actual == expected, "≠": actual != expected, ">": actual > expected,
            "<": actual < expected, "≥": actual >= expected, "≤": actual <= expected}[op]


def _as_time(v) -> float | None:
    """Seconds since the epoch from a number, a numeric string or an ISO 8601 date/datetime (UTC if naive)."""
    number = _as_number(v)
    if number is not None:
        return number
    if not isinstance(v, str) or not v.strip():
        return None
    text = v.strip().replace("Z", "+00:00")
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
