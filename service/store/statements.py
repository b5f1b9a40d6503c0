"""SQL lives in ``sql/`` as ``.sql`` files, each statement after a ``-- name: x`` line, run by name; both
backends load theirs here (``sql/*queries.sql`` for SQLite, ``sql/postgresql/queries.sql``)."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

# sql/ beside the package in a checkout (editable install); service/sql/ inside an installed wheel.
_SERVICE = Path(__file__).resolve().parents[1]
SQL_DIR = next((d for d in (_SERVICE.parent / "sql", _SERVICE / "sql") if (d / "queries.sql").exists()),
               _SERVICE.parent / "sql")
_NAME_RE = re.compile(r"^--\s*name:\s*(\S+)\s*$", re.M)


@lru_cache(maxsize=None)
def sql_file(relative: str) -> str:
    """A file of sql/ (a schema script, say) as text."""
    return (SQL_DIR / relative).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def named(pattern: str) -> dict[str, str]:
    """Every named statement of the sql/ files matching ``pattern`` (a glob under sql/); a name may be
    used once across them."""
    found: dict[str, str] = {}
    for path in sorted(SQL_DIR.glob(pattern)):
        parts = _NAME_RE.split(sql_file(str(path.relative_to(SQL_DIR))))
        for i in range(1, len(parts) - 1, 2):
            if parts[i] in found:
                raise RuntimeError(f"sql/{path.name}: statement {parts[i]!r} is named twice")
            found[parts[i]] = parts[i + 1].strip()
    return found
