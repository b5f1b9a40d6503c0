"""SQL lives in ``sql/`` as ``.sql`` files, each statement after a ``-- name: x`` line, run by name; both
backends load theirs here (``sql/sqlite/*queries.sql`` for SQLite, ``sql/postgresql/queries.sql``).

A statement that names a stored unit's columns wholesale takes them from service/units.py as a ``@list``,
expanded once as the file is loaded, so adding a field to the unit touches no statement:

- ``@unit_columns`` every column of a unit (``UNIT_COLUMNS``); ``@unit_columns(u)`` with a table alias;
  ``@unit_columns(u, -content)`` without some;
- ``@unit_params`` each as a bound parameter of the same name, in the same order;
- ``@unit_repushed`` what a re-push writes, ``x = <its parameter>`` each; ``@unit_repushed(excluded)``
  ``x = excluded.x`` each (an upsert's conflict branch);
- ``@unit_same`` every mutable field still equal to its parameter (``x IS <parameter>``, NULLs equal);
- ``@index_unit(u)`` (PostgreSQL) the read index's ``unit`` array of a row, as JSON
  (service/readindex/schema.py ``UNIT_FIELDS``).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ..readindex.schema import UNIT_FIELDS as INDEX_FIELDS
from ..units import MUTABLE_FIELDS, REPUSHED_COLUMNS, STORED_FALLBACK, UNIT_COLUMNS

# sql/ beside the package in a checkout (editable install); service/sql/ inside an installed wheel.
_SERVICE = Path(__file__).resolve().parents[1]
SQL_DIR = next((d for d in (_SERVICE.parent / "sql", _SERVICE / "sql") if (d / "sqlite" / "queries.sql").exists()),
               _SERVICE.parent / "sql")
_NAME_RE = re.compile(r"^--\s*name:\s*(\S+)\s*$", re.M)
_MACRO_RE = re.compile(r"@(\w+)(?:\(([^)]*)\))?")
# How each dialect spells a bound parameter named x.
PARAMETERS = {"sqlite": ":{}", "postgresql": "%({})s"}


def _columns(args: list[str], names=UNIT_COLUMNS) -> list[str]:
    """``names`` but the ``-x`` of ``args``, prefixed with the alias ``args`` names (if any)."""
    drop = {a[1:] for a in args if a.startswith("-")}
    alias = next((a + "." for a in args if not a.startswith("-")), "")
    return [alias + n for n in names if n not in drop]


def _index_unit(args: list[str]) -> str:
    alias = (args[0] + ".") if args else ""
    parts = [f"coalesce({alias}{n}, {alias}{STORED_FALLBACK[n]})" if n in STORED_FALLBACK else alias + n
             for n in INDEX_FIELDS]
    return f"json_build_array({', '.join(parts)})"


def expand(text: str, dialect: str) -> str:
    """A statement with its ``@lists`` written out (ValueError on a list there is none of)."""
    param = PARAMETERS[dialect].format

    def one(m: re.Match) -> str:
        name, args = m.group(1), [a.strip() for a in (m.group(2) or "").split(",") if a.strip()]
        if name == "unit_columns":
            return ", ".join(_columns(args))
        if name == "unit_params":
            return ", ".join(param(n) for n in _columns([a for a in args if a.startswith("-")]))
        if name == "unit_repushed":
            return ", ".join(f"{n} = {args[0]}.{n}" if args else f"{n} = {param(n)}" for n in REPUSHED_COLUMNS)
        if name == "unit_same":
            return " AND ".join(f"{n} IS {param(n)}" for n in MUTABLE_FIELDS)
        if name == "index_unit":
            return _index_unit(args)
        raise ValueError(f"@{name}: no such list (service/store/statements.py)")
    return _MACRO_RE.sub(one, text)


@lru_cache(maxsize=None)
def sql_file(relative: str) -> str:
    """A file of sql/ (a schema script, say) as text."""
    return (SQL_DIR / relative).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def named(pattern: str, dialect: str = "sqlite") -> dict[str, str]:
    """Every named statement of the sql/ files matching ``pattern`` (a glob under sql/), its @lists written
    out in ``dialect``; a name may be used once across them."""
    found: dict[str, str] = {}
    for path in sorted(SQL_DIR.glob(pattern)):
        parts = _NAME_RE.split(sql_file(str(path.relative_to(SQL_DIR))))
        for i in range(1, len(parts) - 1, 2):
            if parts[i] in found:
                raise RuntimeError(f"sql/{path.name}: statement {parts[i]!r} is named twice")
            found[parts[i]] = expand(parts[i + 1].strip(), dialect)
    return found
