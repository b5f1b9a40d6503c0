"""The shape of service/ (issue 13): imports point one way, in data-flow order.

The import graph is read from the source (every ``import`` and ``from ... import``, also those
inside functions, which a lazy import would otherwise hide), so a cycle fails here before it
can be papered over with an import moved into a function.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

SERVICE = ROOT / "service"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def service_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The service modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"      # `from . import x` imports the module x
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = service_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_service_modules():
    graph = import_graph()
    # open_store imports the store inside the function: the graph has that edge too.
    assert "service.store" in graph["service.boot"] and "service.errors" in graph["service.shards"]
    assert cycles(graph) == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def later():\n    from .a import thing\n    from pkg import c\n")
    (pkg / "c.py").write_text("import os\n")
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    graph = {f"pkg.{m}": imports_of(f"pkg.{m}", pkg / f"{m}.py", known) for m in "abc"}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": set()}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_only_the_store_and_search_touch_the_searcher():
    """Health, metrics, maintenance and the doors use the store's API (freshness, stats, tokenizer,
    push_batch), never ``store.searcher`` (readindex's ``view.searcher`` is tantivy's own)."""
    allowed = {"service.store", "service.search", "service.readindex",
               "service.pg.store", "service.pg.search"}     # PostgreSQL's store and searcher (issue 18)
    reaching = []
    for name, path in service_modules().items():
        if name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "searcher":
                reaching.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reaching == []


def named_statements(path) -> list[str]:
    return re.findall(r"^--\s*name:\s*(\S+)\s*$", path.read_text(), flags=re.M)


def test_every_named_statement_is_used():
    """sql/queries.sql and each area's sql/*_queries.sql (shards.sql loads them all: live_queries.sql is
    issue 16's) hold no statement the service never runs (dead SQL drifts from the schema); nor does the
    PostgreSQL backend's sql/postgresql/queries.sql (issue 18) in service/pg/."""
    names = [n for f in sorted((ROOT / "sql").glob("*queries.sql")) for n in named_statements(f)]
    source = "\n".join(p.read_text(encoding="utf-8") for p in service_modules().values())
    assert len(names) > 60
    assert [n for n in names if f'"{n}"' not in source] == []
    pg_source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((SERVICE / "pg").glob("*.py")))
    pg_names = named_statements(ROOT / "sql" / "postgresql" / "queries.sql")
    assert len(pg_names) > 40
    assert [n for n in pg_names if f'"{n}"' not in pg_source] == []


MAX_FUNCTION_LINES = 80


def function_lengths() -> list[tuple[int, str]]:
    """(lines, where) of every function and method in service/, longest first. Declarative tables
    (the MCP method table, the parameter declarations) are module-level data, not functions."""
    found = []
    for path in service_modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_no_function_over_80_lines():
    lengths = function_lengths()
    assert len(lengths) > 300
    assert [f for f in lengths if f[0] > MAX_FUNCTION_LINES] == []


# SQL is written in sql/*.sql and run by name; only these modules build statements in Python:
# shards.py (connection pragmas, transactions, the FTS5 probe), fts.py (the scoring statement, whose
# shape depends on the query's terms and filters) and manage.py (issue 15's filtered list, export and
# forget statements, built from fts.filters); on PostgreSQL (issue 18) their counterparts pg/search.py
# (the match and queued-unit conditions around fts.scoring_sql) and pg/manage.py.
SQL_BUILDERS = {"service.shards", "service.fts", "service.manage", "service.pg.search", "service.pg.manage"}
_SQL_RE = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ATTACH|DETACH|REPLACE)\s+\S")


def test_no_sql_text_outside_sql_files_and_the_statement_builders():
    found = []
    for name, path in service_modules().items():
        if name in SQL_BUILDERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_RE.match(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value[:40]!r}")
    assert found == []
